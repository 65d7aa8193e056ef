"""`moefleet plan --gpu "RTX PRO 6000"` and the preflight report the same KV tokens for every catalog profile.

The preflight's expression is read from playbooks/tasks/profile_fit.yml (the set_fact that plans the profile)
and evaluated with ansible-core's templar and the collection's own filter, with the facts an RTX PRO 6000
host gives it: nvidia-smi's memory.total as the nvidia_gpu_facts module reports it (97887 MiB, the figure
docs/facts.md §5 and the lab's nvidia-smi print). A change to what preflight passes the planner shows here.
"""

from __future__ import annotations

import base64
import json
import warnings
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.moefleet.serving.plugins.filter.moefleet import FilterModule
from role_defaults import home

from moefleet.cli import main
from moefleet.commands.plan import load_catalog

ROOT = Path(__file__).resolve().parents[2]
K26 = ROOT / "tests" / "data" / "model-configs" / "kimi-k2.6-config.json"
CATALOG = load_catalog(ROOT / "profiles" / "catalog.yml", None)
PROFILES = list(CATALOG["profiles"])


def _preflight_expression() -> str:
    tasks = yaml.safe_load((ROOT / "playbooks" / "tasks" / "profile_fit.yml").read_text())
    for task in tasks:
        for inner in task.get("block", []):
            fact = inner.get("ansible.builtin.set_fact", {})
            if "moefleet_plan" in fact:
                return fact["moefleet_plan"], inner.get("vars", {})
    raise AssertionError("playbooks/tasks/profile_fit.yml has no set_fact of moefleet_plan")


def preflight_plan(profile: str, memory_total_mib: int = 97887) -> dict:
    expression, task_vars = _preflight_expression()
    variables = {
        "inventory_hostname": "h1",
        "ansible_facts": {"nvidia_gpus": {"count": 8, "memory_total_mib": memory_total_mib}},
        "__preflight_model_config": {"content": base64.b64encode(K26.read_bytes()).decode()},
        # sglang_service_extra_flags left unset: the fleet's default, which playbooks/preflight.yml's play lists first
        "sglang_service_extra_flags": home()["sglang_service_extra_flags"],
        "sglang_package_spec": home()["sglang_package_spec"],  # the release the plan is for, the fleet's default
        "hostvars": {
            "localhost": {
                "moefleet_validated": {
                    "catalog": CATALOG,
                    "hosts": {"h1": {"name": profile, **CATALOG["profiles"][profile]}},
                }
            }
        },
    }
    templar = _templar(variables)
    resolved = {k: templar.template(trust_as_template(v)) for k, v in task_vars.items()}
    return _templar({**variables, **resolved}).template(trust_as_template(expression))


def _templar(variables: dict) -> Templar:
    """ansible-core's templar with the collection's filters under their FQCNs (moefleet.serving.<name>), as a
    play resolves them; registered directly because the unit tests import the collection from Python's path."""
    templar = Templar(loader=DataLoader(), variables=variables)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        filters = templar.environment.filters
    for name, function in FilterModule().filters().items():
        filters[f"moefleet.serving.{name}"] = function
    return templar


def cli_rows(capsys, *gpu_args) -> dict:
    code = main(["plan", "--model-config", str(K26), *gpu_args, "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    return {row["profile"]: row for row in json.loads(out)}


@pytest.mark.parametrize("gpu_args", [["--gpu", "RTX PRO 6000"], ["--gpu-memory-mib", "97887"]])
def test_preflight_and_cli_agree_to_the_token_on_every_profile(capsys, gpu_args):
    rows = cli_rows(capsys, *gpu_args)
    assert list(rows) == PROFILES
    for name in PROFILES:
        on_host = preflight_plan(name)
        assert on_host["kv_tokens"] == rows[name]["kv_tokens"], name
        assert on_host["mem_fraction_static"] == rows[name]["mem_fraction_static"], name
        assert on_host["sglang_default_mem_fraction_static"] == rows[name]["sglang_default_mem_fraction_static"]
        assert on_host["free_bytes_per_gpu"] == rows[name]["free_bytes_per_gpu"], name
        assert on_host["verdict"] == rows[name]["verdict"], name


def test_preflight_plans_with_pytorchs_capacity_not_nvidia_smis():
    # 97887 MiB is 95.59 GiB; PyTorch has 94.97 GiB of it (docs/facts.md §5): the pool is sized from the latter.
    on_host = preflight_plan("tp8")
    assert on_host["free_bytes_per_gpu"] == int((94.97 - 1.0) * 2**30)


def test_preflight_refuses_a_gpu_the_table_does_not_know_naming_the_variable():
    from ansible.errors import AnsibleError

    with pytest.raises(AnsibleError, match="not a GPU this table knows.*set moefleet_gpu_memory_gib"):
        preflight_plan("tp8", memory_total_mib=12345)
