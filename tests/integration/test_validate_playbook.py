"""deploy.yml's first plays refuse bad input on the controller, with a sentence, before any host is touched.

The inventory's only host is unreachable (TEST-NET-1, RFC 5737): had any task run on it, the play would
report it unreachable after an SSH timeout instead of failing on the controller at once. validate.yml's second
play runs for each host of blackwell, on the controller (validate_argument_spec and assert need no connection):
the host is then in the recap, with unreachable=0.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from playbook import run_playbook

ROOT = Path(__file__).resolve().parents[2]
MINE = {"description": "An operator profile for this test.", "gpus": 8, "nccl": "pcie_p2p", "fallback": None}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inv") / "hosts.yml"
    path.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        unreachable-1:\n"
                    "          ansible_host: 192.0.2.1\n          sglang_profile: tp8\n"
                    "          sglang_model_source: prestaged\n")
    return path


def deploy(inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_playbook(inventory, "deploy.yml", *extra, timeout=60)


def refused(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0
    recap = run.stdout.split("PLAY RECAP")[-1]
    assert "UNREACHABLE!" not in run.stdout and "unreachable=0" in recap and "unreachable=1" not in recap, \
        "a host was contacted"
    assert "PLAY [Install, check and serve" not in run.stdout, "the serving play started"
    return " ".join(run.stdout.split())


def test_unknown_profile_lists_the_valid_names(inventory):
    out = refused(deploy(inventory, "profile=nonsense"))
    assert "Unknown profile 'nonsense'; valid profiles: tp8, ep8, tp2ep4, tp4ep2, pp8" in out


def test_profile_of_the_wrong_type_says_how_to_pass_it(inventory):
    out = refused(deploy(inventory, json.dumps({"profile": 8})))
    assert "-e '{\"profile\": \"tp8\"}'" in out


def test_extra_profiles_passed_as_a_string_say_how_to_pass_them(inventory):
    out = refused(deploy(inventory, "moefleet_extra_profiles=tp16"))
    assert "moefleet_extra_profiles must be a mapping" in out and "as JSON" in out


def test_extra_profile_breaking_the_schema_names_its_path(inventory):
    bad = {"moefleet_extra_profiles": {"mine": {**MINE, "flags": {"tp_size": "eight"}}}}
    out = refused(deploy(inventory, json.dumps(bad), "profile=mine"))
    assert "profiles/mine/flags/tp_size" in out


def test_extra_profile_breaking_tp_ep_invariant_is_refused(inventory):
    bad = {"moefleet_extra_profiles": {"mine": {**MINE, "flags": {"tp_size": 8, "ep_size": 3}}}}
    out = refused(deploy(inventory, json.dumps(bad), "profile=mine"))
    assert "profiles/mine/flags: --ep-size 3 does not divide --tp-size 8" in out


def test_host_profile_from_inventory_is_validated_too(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        unreachable-1:\n"
                   "          ansible_host: 192.0.2.1\n          sglang_profile: tp3\n")
    out = refused(deploy(inv))
    assert "sglang_profile of unreachable-1: Unknown profile 'tp3'" in out


def validate(inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_playbook(inventory, "playbooks/validate.yml", *extra, timeout=60)


# Each row of the README's bad-input table: what the operator gives, and the sentence it gets. Types, booleans and
# choices are worded by ansible.builtin.validate_argument_spec (the roles' meta/argument_specs.yml), after the host.
BAD_INPUT = [
    (["sglang_service_rollback=maybe"],
     "unreachable-1: argument 'sglang_service_rollback' is of type str and we were unable to convert to bool: "
     "The value 'maybe' is not a valid boolean. Set it to true or false (yes/no, on/off, 1/0 work too)."),
    (["nvidia_driver_reboot=sometimes"],
     "argument 'nvidia_driver_reboot' is of type str and we were unable to convert to bool: The value 'sometimes' is "
     "not a valid boolean. Set it to true or false"),
    # y/t are booleans to the spec, but the roles' `| bool` reads them as false: refused too, with the words to use.
    (["nvidia_driver_reboot=y"],
     "unreachable-1: nvidia_driver_reboot is 'y', which is not a boolean; set it to true or false (yes/no, on/off and "
     "1/0 work too), e.g. -e nvidia_driver_reboot=true."),
    (["moefleet_allow_unfit=sure"],
     "argument 'moefleet_allow_unfit' is of type str and we were unable to convert to bool: The value 'sure' is not a "
     "valid boolean. Set it to true or false"),
    (["sglang_model_source=s3"],
     "unreachable-1: value of sglang_model_source must be one of: huggingface, prestaged, got: s3."),
    (["nvidia_driver_expected_gpu_count=eight"],
     "nvidia_driver_expected_gpu_count is 'eight' for unreachable-1; set it to a whole number from 1 to 64."),
    ([json.dumps({"moefleet_extra_profiles": {"tp4ep2": {**MINE, "gpus": 4, "flags": {"tp_size": 4, "ep_size": 2}}}}),
      "profile=tp4ep2"],
     "Profile tp4ep2 starts 4 GPUs (--tp-size 4 --ep-size 2) but the inventory declares 8 for unreachable-1 "
     "(nvidia_driver_expected_gpu_count): use --tp-size 8 --ep-size 2 to spread it over all 8"),
    (["nvidia_driver_expected_gpu_count=4"], "Profile tp8 starts 8 GPUs (--tp-size 8) but the inventory declares 4"),
    ([json.dumps({"moefleet_extra_profiles": {"mine\n": {**MINE, "flags": {"tp_size": 8}}}})],
     "profiles/mine\\n: 'mine\\n' is not a usable name; rename it to 1 to 40 lower-case letters"),
    ([json.dumps({"moefleet_extra_profiles": {"mine": {**MINE, "flags": {"tp_size": 8, "context_length": 10**20}}}})],
     "profiles/mine/flags/context_length: 100000000000000000000 is out of range; give a whole number from 1 to"),
    ([json.dumps({"sglang_service_extra_flags": {"max_total_tokens": 10**20}})],
     "unreachable-1: sglang_service_extra_flags/max_total_tokens: 100000000000000000000 is out of range"),
    (["sglang_model_source=huggingface"],
     "sglang_model_revision is '' for unreachable-1; set it to the 40-hex commit hash of moonshotai/Kimi-K2.6"),
    (["sglang_model_source=huggingface", "sglang_model_revision=" + "a" * 40, "sglang_model_gated=true"],
     "moonshotai/Kimi-K2.6 is gated (sglang_model_gated) but sglang_model_hf_token is empty for unreachable-1"),
    (["sglang_model_path=models/k2"], "sglang_model_path is 'models/k2' for unreachable-1; set it to the absolute"),
    (["sglang_service_model_path=/srv/models/k2"],
     "sglang_service_model_path (set for unreachable-1) was renamed: set sglang_model_path instead"),
]


@pytest.mark.parametrize(("extra", "sentence"), BAD_INPUT, ids=[s.split(" is ")[0][:40] for _, s in BAD_INPUT])
def test_bad_input_is_refused_on_the_controller_with_a_sentence(inventory, extra, sentence):
    out = refused(deploy(inventory, *extra))
    assert sentence in out


def test_extra_profile_in_inventory_is_reported_at_its_file_and_line(tmp_path):
    (tmp_path / "group_vars" / "blackwell").mkdir(parents=True)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        unreachable-1:\n"
                   "          ansible_host: 192.0.2.1\n          sglang_profile: mine\n"
                   "          sglang_model_source: prestaged\n")
    group_vars = tmp_path / "group_vars" / "blackwell" / "main.yml"
    group_vars.write_text("---\nmoefleet_extra_profiles:\n  mine:\n    description: An operator profile here.\n"
                          "    gpus: 8\n    nccl: pcie_p2p\n    fallback: null\n    flags:\n      tp_size: eight\n")
    out = refused(deploy(inv))
    assert f"{group_vars}, line 9: profiles/mine/flags/tp_size: 'eight' is not of type 'integer'" in out
    assert "<unicode string>" not in out


@pytest.mark.parametrize("form", ["true", "false", "yes", "no", "1", "0", "True", "on", "off"])
def test_every_boolean_form_minus_e_passes_is_accepted(inventory, form):
    names = ["sglang_service_rollback", "sglang_service_degraded_fails", "sglang_service_retry", "nvidia_driver_reboot",
             "nvidia_driver_update_initramfs", "nvidia_driver_check_kernel_module", "moefleet_allow_unfit"]
    run = validate(inventory, *(f"{name}={form}" for name in names))
    assert run.returncode == 0, run.stdout[-2000:]


def test_a_host_without_sglang_profile_takes_minus_e_profile_or_gets_a_sentence(tmp_path):
    # One host sets its profile, the other none: -e profile covers both; without it the second is named.
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    blackwell:\n      hosts:\n"
                   "        unreachable-1:\n          ansible_host: 192.0.2.1\n          sglang_profile: tp8\n"
                   "          sglang_model_source: prestaged\n"
                   "        unreachable-2:\n          ansible_host: 192.0.2.2\n"
                   "          sglang_model_source: prestaged\n")
    run = validate(inv, "profile=ep8")
    assert run.returncode == 0, run.stdout[-2000:]
    out = " ".join(validate(inv).stdout.split())
    assert "unreachable-2 has no profile: pass -e profile=NAME or set sglang_profile for it in inventory." in out


def test_extra_flags_sglang_would_refuse_are_refused_before_any_host(inventory):
    """The operators' spellings that used to pass validate.yml and fail at SGLang's start, hours later (after the
    driver, CUDA, pip and the model download): all refused in one run, each with its sentence."""
    bad = {"sglang_service_extra_flags": {"mem_fraction_static": 1.7, "kv_cache_dtype": "fp8",
                                          "pp_size": 4, "tp_size": "eight"}}
    out = refused(deploy(inventory, json.dumps(bad), "sglang_service_port=99999"))
    for sentence in ("sglang_service_extra_flags/mem_fraction_static: 1.7 is not a fraction",
                     "sglang_service_extra_flags/kv_cache_dtype: 'fp8' is not one SGLang 0.5.10 takes",
                     "sglang_service_extra_flags/pp_size: pp_size changes the GPU layout",
                     "sglang_service_extra_flags/tp_size: tp_size changes the GPU layout",
                     "sglang_service_port is '99999' for unreachable-1; set it to a whole number from 1 to 65535."):
        assert sentence in out, sentence


def test_a_gateway_without_the_workers_key_is_refused_naming_hosts_not_keys(tmp_path):
    """Workers with a key behind routers without it: smg would list them ready and answer 404 for the model."""
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        unreachable-1:\n"
                    "          ansible_host: 192.0.2.1\n          sglang_profile: tp8\n"
                    "          sglang_model_source: prestaged\n          sglang_service_api_key: sk-sentinel-7f3a\n"
                    "    routers:\n      hosts:\n        router-1:\n          ansible_host: 192.0.2.2\n"
                    "          sglang_router_admin_key: admin-sentinel-0123456789\n")
    run = run_playbook(path, "playbooks/validate.yml", timeout=60)
    out = refused(run)
    assert ("The workers unreachable-1 require an API key (sglang_service_api_key) that the routers (router-1) do "
            "not send them: set sglang_router_worker_api_key") in out
    assert "sk-sentinel-7f3a" not in run.stdout + run.stderr
    # the same key on both sides passes this check
    keyed = path.read_text() + "          sglang_router_worker_api_key: sk-sentinel-7f3a\n"
    path.write_text(keyed)
    run = run_playbook(path, "playbooks/validate.yml", timeout=60)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "sk-sentinel-7f3a" not in run.stdout + run.stderr
