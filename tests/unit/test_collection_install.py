"""The collection as operators get it: `ansible-galaxy collection build` makes the tarball, installed into an
empty collections path it runs with nothing of the clone around (no ansible.cfg of the repository, the working
directory outside it, an inventory of its own, the clone's collections path hidden from Ansible)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

INVENTORY = """\
blackwell:
  hosts:
    gpu-node-01:
      ansible_host: 192.0.2.10
      sglang_profile: tp2ep4
      sglang_model_source: prestaged
"""


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The tarball built from this clone, installed into an empty collections path; the environment to use it."""
    tmp = tmp_path_factory.mktemp("collection")
    collections = tmp / "collections"
    config = tmp / "ansible.cfg"
    config.write_text("[defaults]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_HOME": str(tmp / "home"),
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        # The venv's Python path names the clone's .ansible/collections (make setup): keep Ansible off it.
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
    })
    run([str(BIN / "ansible-galaxy"), "collection", "build", str(ROOT), "--output-path", str(tmp / "dist")], tmp, env)
    [tarball] = (tmp / "dist").glob("moefleet-serving-*.tar.gz")
    run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(collections), str(tarball)],
        tmp, env)
    (tmp / "hosts.yml").write_text(INVENTORY)
    return tmp, env


def test_the_tarball_ships_the_collection_and_not_the_clones_tooling(installed):
    tmp, _ = installed
    root = tmp / "collections" / "ansible_collections" / "moefleet" / "serving"
    for shipped in ["plugins/modules/sglang_readiness.py", "plugins/module_utils/planner.py", "roles/sglang_service",
                    "playbooks/deploy.yml", "profiles/catalog.yml", "schemas/profile_catalog.schema.json",
                    "meta/runtime.yml", "inventory/example/hosts.yml"]:
        assert (root / shipped).exists(), shipped
    for kept_out in ["tests", "sim", "molecule", ".venv", ".lab", ".ansible", "inventory/sim", "ansible.cfg"]:
        assert not (root / kept_out).exists(), kept_out


def test_the_installed_deploy_playbook_passes_its_syntax_check(installed):
    tmp, env = installed
    out = run([str(BIN / "ansible-playbook"), "moefleet.serving.deploy", "--syntax-check", "-i", "hosts.yml",
               "-e", "profile=tp2ep4"], tmp, env)
    assert "moefleet.serving.deploy" in out or "playbook:" in out


def test_the_installed_validate_playbook_runs_the_collections_module(installed):
    """moefleet.serving.resolve_profiles runs on the controller with its module_utils from the installed copy, and
    each host's inputs are checked against the installed roles' argument specs."""
    tmp, env = installed
    out = run([str(BIN / "ansible-playbook"), "moefleet.serving.validate", "-i", "hosts.yml", "-e", "profile=tp2ep4"],
              tmp, env)
    assert "TASK [Validate the catalog, resolve each host's profile and check the rules between its inputs]" in out
    assert re.search(r"^localhost\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", out, re.M), out
    assert "TASK [Check the host's inputs against each role's argument spec]" in out
    assert re.search(r"^ok: \[\S+\] => \(item=sglang_service\)", out, re.M), out


def test_ansible_doc_shows_the_installed_readiness_module(installed):
    tmp, env = installed
    out = run([str(BIN / "ansible-doc"), "moefleet.serving.sglang_readiness"], tmp, env)
    assert "moefleet.serving.sglang_readiness" in out
    assert str(tmp / "collections") in out  # the installed copy, not the clone
    assert "expected_args" in out


# The CLI without the clone on Python's path (the venv's .pth names it): it finds the installed copy where
# Ansible finds collections, and reads the catalog and schema from there.
CLI_OFF_THE_CLONE = """
import sys
sys.path = [p for p in sys.path if not p.endswith(".ansible/collections")]
from moefleet import collection
print(collection.ROOT)
from moefleet.cli import main
sys.exit(main(["plan", "--model-config", sys.argv[1], "--gpus", "8", "--gpu-memory-gib", "94.97", "--profile", "tp8"]))
"""


def test_the_cli_finds_the_catalog_in_the_installed_collection(installed):
    tmp, env = installed
    config = ROOT / "sim" / "model" / "kimi_k26_config.json"
    out = run([sys.executable, "-c", CLI_OFF_THE_CLONE, str(config)], tmp, env)
    assert out.splitlines()[0] == str(tmp / "collections" / "ansible_collections" / "moefleet" / "serving")
    assert "tp8" in out and "fits" in out



# The CLI off the clone, run where the operator keeps an ansible.cfg and an inventory of their own: the installed
# collection's playbooks and filters under the operator's configuration (the plan's two read-only ad-hoc runs
# contact only local-connection hosts, reading their local facts).
CLI_OFF_THE_CLONE_ARGS = """
import sys
sys.path = [p for p in sys.path if not p.endswith(".ansible/collections")]
from moefleet.cli import main
sys.exit(main(sys.argv[1:]))
"""

LOCAL_FLEET = """\
blackwell:
  hosts:
    gpu-1:
    gpu-2:
    gpu-3:
    gpu-4:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
    sglang_profile: tp2ep4
    # a real run's input (--check runs validate.yml's checks, which refuse a model without a pinned revision)
    sglang_model_source: prestaged
routers:
  hosts:
    router-1:
      ansible_connection: local
"""


def test_the_cli_plans_a_rollout_from_the_installed_collection_with_the_operators_config(installed, tmp_path):
    _, env = installed
    (tmp_path / "ansible.cfg").write_text("[defaults]\ninventory = fleet.yml\n")
    (tmp_path / "fleet.yml").write_text(LOCAL_FLEET)
    env = {k: v for k, v in env.items() if k != "ANSIBLE_CONFIG"}  # ./ansible.cfg is the one Ansible finds
    args = ["rollout", "-e", "moefleet_max_unavailable=25%", "--check", "--json"]
    plan = json.loads(run([sys.executable, "-c", CLI_OFF_THE_CLONE_ARGS, *args], tmp_path, env))
    assert plan["inventory"] == str(tmp_path / "fleet.yml")
    assert (plan["serial"], plan["behind_routers"], plan["batches"]) == (["25%"], True, 4)
    assert [row["change"] for row in plan["hosts"]] == ["install and start tp2ep4 (no moefleet facts: a new host)"] * 4
    refused = subprocess.run([sys.executable, "-c", CLI_OFF_THE_CLONE_ARGS, "rollout", "-e",
                              "moefleet_max_unavailable=0", "--check"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "moefleet_max_unavailable is '0', which Ansible takes" in refused.stderr
