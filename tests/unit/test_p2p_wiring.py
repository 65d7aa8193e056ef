"""The P2P preflight wired into the deploy (issue 36; roles/sglang_service/tasks/configure.yml): what a deploy does with
each verdict before the model load (module_utils/rollback.py, p2p_preflight_step, through the filter the role calls),
where the role asks for it, and how `moefleet status` shows the verdict the host keeps (ansible_local.moefleet_p2p).
The module itself is tests/unit/test_p2p_preflight.py's; a deploy on the lab is tests/integration/
test_p2p_preflight_lab.py's."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.filter import moefleet as filters
from ansible_collections.moefleet.serving.plugins.module_utils import rollback
from ansible_collections.moefleet.serving.plugins.module_utils.host_state import status_entry

from moefleet import cli, runner

ROOT = Path(__file__).resolve().parents[2]
CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())
CONFIGURE = yaml.safe_load((ROOT / "roles" / "sglang_service" / "tasks" / "configure.yml").read_text())
STATUS_SCHEMA = json.loads((ROOT / "schemas" / "status.schema.json").read_text())
TP8 = {"profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p"}
REDIRECT = ("ACS request/completion redirect on 0000:00:01.1, 0000:80:01.1 while the IOMMU translates (no iommu= "
            "option on the command line): the state of the public P2P all-reduce hangs; the P2P all-reduce hung: "
            "8 of 8 rank(s) still in the all-reduce after 5.0 s.")
FIX = ("Disable ACS (PCIe ACS Control / ACS Enable) in the BIOS, or boot with iommu=pt (amd_iommu=off on AMD); until "
       "then: setpci -s 0000:00:01.1 ECAP_ACS+6.w=0000")


def result(verdict: str, **more) -> dict:
    """A p2p_preflight result as the module returns it (its RETURN), trimmed to what the step reads."""
    return {"verdict": verdict, "reason": REDIRECT, "fix": FIX, "rules": ["allreduce-p2p-hang"], "missing": [],
            "bandwidths": {"p2p_busbw_gbps": None, "shm_busbw_gbps": 20.0}, "cached": False,
            "decided_at": "2026-12-05T17:00:00Z"} | more


def step(found: dict, attempt: dict = TP8, pinned: bool = False, flags: dict | None = None) -> dict:
    """As the role calls it (the filter moefleet.serving.p2p_preflight_step)."""
    profile = CATALOG["profiles"][attempt["profile"]]["flags"] if flags is None else flags
    return filters.p2p_preflight_step(found, attempt, pinned, profile, "lab-1")


def test_a_healthy_verdict_keeps_the_set_and_says_its_bandwidth():
    kept = step(result("pcie_p2p", reason="the P2P all-reduce passed its data check at 37.6 GB/s.", fix="",
                       bandwidths={"p2p_busbw_gbps": 37.6, "shm_busbw_gbps": 20.0}))
    assert (kept["action"], kept["attempt"], kept["warn"]) == ("keep", TP8, False)
    assert kept["message"] == ("lab-1: P2P preflight: pcie_p2p: the P2P all-reduce passed its data check at 37.6 GB/s "
                               "(all-reduce bus bandwidth 37.6 GB/s with P2P; 20 GB/s without P2P). Serving with "
                               "pcie_p2p.")
    assert kept["record"]["bandwidths"] == {"p2p_busbw_gbps": 37.6, "shm_busbw_gbps": 20.0}
    assert (kept["record"]["nccl_set"], kept["record"]["contradiction"]) == ("pcie_p2p", None)


def test_a_cached_verdict_says_from_when():
    kept = step(result("pcie_p2p", cached=True, decided_at="2026-12-05T16:00:00Z"))
    assert "(the verdict of 2026-12-05T16:00:00Z, cached for this boot, hardware and state)" in kept["message"]
    assert kept["record"]["cached"] is True and kept["record"]["when"] == "2026-12-05T16:00:00Z"


def test_a_hang_serves_pcie_shm_before_the_load_with_the_reason_and_the_fix():
    switched = step(result("pcie_shm"))
    assert switched["action"] == "switch" and switched["warn"]
    assert switched["attempt"] == {"profile": "tp8", "tuning": {}, "nccl_set": "pcie_shm"}
    assert REDIRECT.rstrip(".") in switched["message"] and f"Fix: {FIX}." in switched["message"]
    assert "Serving with pcie_shm (NCCL P2P off) instead of pcie_p2p, before any weights load." in switched["message"]
    assert "sglang_service_retry=true" in switched["message"]
    assert (switched["record"]["verdict"], switched["record"]["nccl_set"], switched["record"]["asked_nccl_set"]) == (
        "pcie_shm", "pcie_shm", "pcie_p2p")
    assert switched["record"]["fix"] == FIX and switched["record"]["reason"] == REDIRECT


def test_pcie_shm_also_turns_the_custom_all_reduce_off_where_it_would_use_p2p():
    """SGLang's custom all-reduce talks P2P in a group of two GPUs whatever NCCL is told (as the rollback's own
    nccl_shm remedy knows): tp2pp4's TP groups are pairs."""
    attempt = {"profile": "tp2pp4", "tuning": {"cuda_graph_max_bs": 32}, "nccl_set": "pcie_p2p"}
    switched = step(result("pcie_shm"), attempt)
    assert switched["attempt"]["tuning"] == {"cuda_graph_max_bs": 32, "disable_custom_all_reduce": True}
    assert "--disable-custom-all-reduce" in switched["message"]
    # the same words and tuning the rollback gives a start that hung
    hung = rollback.next_step(["tp2pp4"], [{**attempt, "outcome": {"state": "hung", "phase": "cuda_graph"}}], CATALOG,
                              CATALOG["profiles"]["tp2pp4"]["flags"], None, release="0.5.10")
    assert hung["attempt"]["tuning"] == switched["attempt"]["tuning"]


def test_a_pinned_set_is_kept_against_the_verdict_and_the_contradiction_reported():
    kept = step(result("pcie_shm"), pinned=True)
    assert (kept["action"], kept["attempt"], kept["warn"]) == ("keep", TP8, True)
    assert kept["record"]["pinned"] is True and kept["record"]["nccl_set"] == "pcie_p2p"
    assert kept["record"]["contradiction"].startswith(
        "sglang_service_nccl_set pins pcie_p2p, which uses P2P, but the P2P preflight says pcie_shm: ACS request")
    assert kept["message"].startswith("WARNING lab-1: sglang_service_nccl_set pins pcie_p2p")
    assert f"Fix: {FIX}." in kept["message"] and "unset sglang_service_nccl_set" in kept["message"]
    # a pinned set the verdict agrees with is no contradiction
    assert step(result("pcie_p2p"), pinned=True)["record"]["contradiction"] is None


def test_stuck_gpus_start_nothing_and_name_moefleet_remediate():
    stopped = step(result("stuck", reason="GPU 0 at 100 % and 139.82 W with no process after the P2P all-reduce hung.",
                          fix="Reboot the host (moefleet remediate); then fix the P2P state: " + FIX))
    assert stopped["action"] == "stop" and stopped["record"]["nccl_set"] is None
    assert "GPU 0 at 100 % and 139.82 W with no process" in stopped["message"]
    assert "Nothing was loaded: the host keeps its last good unit" in stopped["message"]
    assert "run moefleet remediate" in stopped["message"]
    # pinned or not: stuck GPUs serve nothing
    assert step(result("stuck"), pinned=True)["action"] == "stop"


def test_an_undecided_preflight_keeps_the_set_with_a_warning():
    unsure = step(result("unknown", reason="even the control all-reduce failed: rank 3: CUDA error.", fix="",
                         missing=["a control all-reduce that passes"]))
    assert (unsure["action"], unsure["attempt"], unsure["warn"]) == ("keep", TP8, True)
    assert unsure["message"] == ("WARNING lab-1: P2P preflight could not decide (unknown): even the control all-reduce "
                                 "failed: rank 3: CUDA error. Missing: a control all-reduce that passes. Keeping "
                                 "pcie_p2p.")


@pytest.mark.parametrize(("env", "p2p"), [
    (CATALOG["nccl_sets"]["pcie_p2p"]["env"], True),
    (CATALOG["nccl_sets"]["pcie_shm"]["env"], False),
    ({"NCCL_P2P_DISABLE": "0"}, True),
    ({}, True),
])
def test_which_nccl_sets_use_p2p(env, p2p):
    assert filters.FilterModule().filters()["nccl_uses_p2p"](env) is p2p


# --- where the role asks for it -------------------------------------------------------------------------------------


def names(tasks: list[dict]) -> list[str]:
    return [t["name"] for t in tasks]


def test_the_role_runs_the_preflight_before_the_unit_is_installed_and_stops_a_stuck_host_there():
    block = next(t for t in CONFIGURE if t["name"] == "Prove PCIe peer-to-peer before the model load")
    order = names(CONFIGURE)
    # tasks/start.yml starts only what "Install the unit" installed
    assert order.index(block["name"]) < order.index("Install the unit")
    when = " ".join(block["when"])
    assert "sglang_service_p2p_preflight" in when and "_sglang_service_uses_p2p" in when and ".gpus | int >= 2" in when
    inner = {t["name"]: t for t in block["block"]}
    module = inner["Run the P2P preflight over the profile's GPUs"]["moefleet.serving.p2p_preflight"]
    assert module["gpus"] == "{{ range(_sglang_service_profile_data.gpus | int) | list }}"
    assert "sglang_venv" in module["python"] and "p2p-allreduce-check" in module["check_script"]
    assert "p2p_preflight_step" in inner["Decide the NCCL set by the verdict"]["vars"]["_step"]
    # the switch changes the attempt, then its unit text (what "Install the unit" installs)
    assert names(block["block"]).index("Serve the attempt with the NCCL set the preflight chose") < names(
        block["block"]).index("Render the unit for the NCCL set the preflight chose")
    stuck = inner["Hand a host whose GPUs a hang left stuck to remediation, before any load"]
    assert stuck["when"] == "__sglang_service_p2p_step.action == 'stop'"
    mark, stop = stuck["block"]
    assert mark["ansible.builtin.command"]["argv"][2:4] == ["unfit", "p2p_preflight"]
    assert mark["ansible.builtin.command"]["removes"] == "{{ fault_watch_config_file }}"
    assert "ansible.builtin.fail" in stop
    helpers = next(t for t in CONFIGURE if t["name"].startswith("Install the credential directory"))
    assert "_p2p_check" in helpers["moefleet.serving.host_files"]["files"]


# --- moefleet status ------------------------------------------------------------------------------------------------


def local() -> dict:
    return {"asked_profile": "tp8", "serving_profile": "tp8", "outcome": "ready",
            "updated": "2026-12-05T17:01:00+00:00", "last_rollback": None}


class FakeStatus:
    def __init__(self, hosts: list[dict]):
        self.hosts = hosts

    def __call__(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None):
        Path(extravars["moefleet_status_path"]).write_text(json.dumps({"hosts": self.hosts}))
        return runner.RunResult("successful", 0)


def test_status_shows_the_verdict_the_host_keeps(monkeypatch, tmp_path, capsys):
    healthy = step(result("pcie_p2p", reason="passed.", fix="", bandwidths={"p2p_busbw_gbps": 37.6,
                                                                            "shm_busbw_gbps": 20.0}))["record"]
    switched = step(result("pcie_shm"))["record"]
    hosts = [status_entry("lab-1", True, local(), {}, "active", 200, {"tp_size": 8}, p2p=healthy),
             status_entry("lab-2", True, local(), {}, "active", 200, {"tp_size": 8}, p2p=switched),
             status_entry("lab-3", True, local(), {}, "active", 200, {"tp_size": 8}, p2p={})]
    jsonschema.validate({"hosts": hosts}, STATUS_SCHEMA)
    assert "p2p" not in hosts[2]  # never preflighted: no entry
    assert hosts[1]["p2p"]["verdict"] == "pcie_shm" and hosts[1]["p2p"]["fix"] == FIX
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    monkeypatch.setattr(runner, "run_playbook", FakeStatus(hosts))
    assert cli.main(["status", "-i", str(inventory)]) == 0
    lines = capsys.readouterr().out.splitlines()
    column = lines[0].index("p2p")
    assert [line[column:].split("  ")[0] for line in lines[2:5]] == ["pcie_p2p 37.6 GB/s", "pcie_shm", "-"]
    assert lines[-1] == (f"lab-2: P2P preflight 2026-12-05 17:00:00 UTC: pcie_shm: {REDIRECT} Serving pcie_shm. "
                         f"Fix: {FIX}")


def test_a_remedy_of_a_run_the_preflight_sent_to_pcie_shm_is_served_with_pcie_shm_too():
    """The fallback ladder names each profile's own set: a remedy after a pcie_shm start would load with P2P again."""
    start = yaml.safe_load((ROOT / "roles" / "sglang_service" / "tasks" / "start.yml").read_text())
    tasks = start[0]["block"]
    remedy = next(t for t in tasks if t["name"] == "Take the remedy as the next pass's attempt")
    expression = remedy["ansible.builtin.set_fact"]["__sglang_service_attempt"]
    assert "p2p_preflight_step(__sglang_service_step.attempt, false" in expression and "'switch'" in expression
    fallback = {"profile": "tp2pp4", "tuning": {}, "nccl_set": "pcie_p2p", "remedy": "fallback"}
    served = step(result("pcie_shm"), fallback)["attempt"]
    assert served == {**fallback, "nccl_set": "pcie_shm", "tuning": {"disable_custom_all_reduce": True}}
