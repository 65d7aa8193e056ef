"""The P2P preflight in the deploy (issue 36: roles/sglang_service/tasks/configure.yml, modules/p2p_preflight.py)
on itest-2 of the lab_inventory fixture, whose PCIe peer-to-peer state `lab.py p2p` sets (sim/gpu/pcie_sim.py; the
all-reduce is the stand-in backend sim/gpu/p2p_backend.py, which hangs where real hardware hangs: ACS redirect with the
IOMMU translating). Serve-only deploys of tp8 and ep8, in this order (each test builds on the one before):

1. healthy (two sockets, ACS off): the first deploy on this boot runs both all-reduces and keeps pcie_p2p with its
   bandwidth (37.6 GB/s across the sockets, 20 without P2P); a second deploy (another profile: a start follows) reads
   the cached verdict and runs nothing;
2. the hang state (ACS redirect, IOMMU translated), nothing serving: the P2P all-reduce hangs and is killed, and the
   host serves tp8 with pcie_shm, the only start of that run, with the reason and the fix in the deploy's output, the
   local facts and `moefleet status`;
3. the same state with GPUs a hang leaves busy (after_hang busy): the verdict is stuck, nothing is installed or
   started (the host keeps its last good unit), the host is marked unfit for remediation; moefleet remediate
   (playbooks/remediate.yml) reboots it, which frees the GPUs, and it serves its last good unit again.

The finalizer puts the healthy state back and leaves itest-2 fit and serving.

Cost, measured on the 2-core dev machine (the lab otherwise idle, 2026-12-05): the preflight on the lab host, the
module run with both all-reduces of 8 GPUs through the stand-in (the module's AnsiballZ, lspci, nvidia-smi and
journalctl, the check twice with its ranks as threads), 0.65 CPU-s and 1.95 s a first deploy of a boot (measured once
by wrapping the module's interpreter: a measurement, not a test); this file 343 s on a lab already up (healthy 154 s,
hang 89 s, stuck and remediation 92 s), 5 min inside a fresh-clone suite (CI15).

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): the healthy host 138 s and the two others 76 and 79 s, about 71
CPU-s on the controller in all (the lab's session fixture, 166 s, was set up in this file's first test there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import SERVE_ONLY, on_host, run_playbook  # noqa: E402  (tests/playbook.py)

from moefleet import cli  # noqa: E402

HOST = "itest-2"
LAB_PY = ROOT / "sim" / "lab" / "lab.py"
CACHE = "/var/lib/moefleet/p2p-preflight.json"
P2P_FACTS = "/etc/ansible/facts.d/moefleet_p2p.fact"
UNIT = "/etc/systemd/system/sglang.service"
def lab(*args: str) -> None:
    done = subprocess.run([sys.executable, str(LAB_PY), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def sh(inventory: Path, command: str) -> str:
    return on_host(inventory, HOST, command)


def deploy(inventory: Path, profile: str, *extra: str, ok: bool = True) -> str:
    run = run_playbook(inventory, "deploy.yml", f"profile={profile}", *extra,
                       options=(*SERVE_ONLY, "--limit", f"{HOST},localhost"), timeout=1200)
    out = run.stdout + run.stderr
    print(out[-6000:])  # shown when a test fails
    assert (run.returncode == 0) == ok, out[-3000:]
    return " ".join(out.split())


def json_on_host(inventory: Path, path: str) -> dict:
    return json.loads(sh(inventory, f"cat {path}"))


def history(inventory: Path) -> list[dict]:
    return json_on_host(inventory, "/etc/ansible/facts.d/moefleet.fact")["history"]


def unit_env(inventory: Path) -> str:
    return sh(inventory, f"grep -h '^Environment=' {UNIT}")


@pytest.fixture(scope="module")
def lab_host(lab_inventory: Path):
    """itest-2 in the healthy P2P state, with no preflight verdict cached; afterwards healthy, fit and serving."""
    lab("p2p", HOST, "--reset")
    sh(lab_inventory, f"rm -f {CACHE}")
    yield lab_inventory
    lab("p2p", HOST, "--reset")
    if "unfit" in sh(lab_inventory, "test -e /var/lib/moefleet/unfit && echo unfit"):
        run_playbook(lab_inventory, "playbooks/remediate.yml", "fault_watch_retry_window=0",
                     options=("--limit", HOST), timeout=900)
    if sh(lab_inventory, "systemctl is-active sglang.service").strip() != "active":
        deploy(lab_inventory, "tp8", "sglang_service_retry=true")


def test_a_healthy_host_keeps_p2p_with_its_bandwidth_and_the_next_deploy_reads_the_cache(lab_host: Path):
    # nothing serving: the first deploy of a boot, P2P run in full
    sh(lab_host, "systemctl stop sglang.service")
    out = deploy(lab_host, "tp8", "sglang_service_retry=true")
    first = json_on_host(lab_host, P2P_FACTS)
    assert (first["verdict"], first["cached"], first["nccl_set"]) == ("pcie_p2p", False, "pcie_p2p"), first
    assert first["bandwidths"] == {"p2p_busbw_gbps": 37.6, "shm_busbw_gbps": 20.0}  # two sockets: SYS pairs
    assert "P2P preflight: pcie_p2p" in out and "37.6 GB/s with P2P" in out
    env = unit_env(lab_host)
    assert "NCCL_P2P_LEVEL=SYS" in env and "NCCL_P2P_DISABLE" not in env
    assert history(lab_host)[-1]["nccl_set"] == "pcie_p2p" and history(lab_host)[-1]["outcome"] == "ready"

    # the same boot, hardware, state and GPUs: a profile switch reads the verdict
    out = deploy(lab_host, "ep8")
    second = json_on_host(lab_host, P2P_FACTS)
    assert (second["verdict"], second["cached"], second["when"]) == ("pcie_p2p", True, first["when"]), second
    assert "cached for this boot, hardware and state" in out
    assert history(lab_host)[-1]["profile"] == "ep8" and history(lab_host)[-1]["nccl_set"] == "pcie_p2p"


def test_the_hang_state_serves_pcie_shm_before_any_weights_load_with_the_reason_and_the_fix(lab_host: Path, capsys):
    lab("p2p", HOST, "--acs", "redirect")
    sh(lab_host, "systemctl stop sglang.service")  # nothing serves: the P2P all-reduce is run, and hangs
    started = sh(lab_host, "date -u +%Y-%m-%dT%H:%M:%S+00:00").strip()
    out = deploy(lab_host, "tp8")
    verdict = json_on_host(lab_host, P2P_FACTS)
    assert (verdict["verdict"], verdict["nccl_set"], verdict["cached"]) == ("pcie_shm", "pcie_shm", False), verdict
    assert "over P2P did not finish and was killed" in verdict["reason"] and "ACS redirect on" in verdict["reason"]
    assert "iommu=pt" in verdict["fix"] and "setpci" in verdict["fix"]
    assert "P2P preflight: pcie_shm" in out and "before any weights load" in out and "Fix:" in out
    # the run's only start was the pcie_shm one: nothing loaded with P2P first
    run = [a for a in history(lab_host) if a["time"] >= started]
    assert [(a["profile"], a["nccl_set"], a["outcome"]) for a in run] == [("tp8", "pcie_shm", "ready")], run
    assert "NCCL_P2P_DISABLE=1" in unit_env(lab_host)
    capsys.readouterr()  # the deploy's output, printed above
    cli.main(["status", "-i", str(lab_host), "-l", HOST, "--json"])
    entry = json.loads(capsys.readouterr().out)["hosts"][0]
    assert (entry["p2p"]["verdict"], entry["p2p"]["nccl_set"]) == ("pcie_shm", "pcie_shm"), entry


def test_gpus_a_hang_leaves_stuck_go_to_remediation_not_to_a_load(lab_host: Path):
    lab("p2p", HOST, "--acs", "redirect", "--after-hang", "busy")
    sh(lab_host, f"rm -f {CACHE}")  # the hang of the test before is remembered for this state: run P2P again
    sh(lab_host, "systemctl stop sglang.service")
    unit_before = sh(lab_host, f"cat {UNIT}")
    out = deploy(lab_host, "tp8", "sglang_service_retry=true", ok=False)
    verdict = json_on_host(lab_host, P2P_FACTS)
    assert (verdict["verdict"], verdict["nccl_set"]) == ("stuck", None), verdict
    assert "P2P preflight: the GPUs are stuck" in out and "run moefleet remediate" in out
    assert "It is marked unfit" in out
    assert sh(lab_host, f"cat {UNIT}") == unit_before  # its last good unit, not this run's
    assert sh(lab_host, "systemctl is-active sglang.service").strip() != "active"
    health = json_on_host(lab_host, "/etc/ansible/facts.d/moefleet_health.fact")
    assert health["state"] == "unfit" and health["reason"].startswith("P2P preflight:"), health
    # what remediation does with it: a reboot frees the GPUs, the last good unit serves again
    run = run_playbook(lab_host, "playbooks/remediate.yml", "fault_watch_retry_window=0",
                       options=("--limit", f"{HOST},localhost"), timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]
    assert json_on_host(lab_host, "/etc/ansible/facts.d/moefleet_health.fact")["state"] == "healthy"
    assert sh(lab_host, "systemctl is-active sglang.service").strip() == "active"
    assert "NCCL_P2P_DISABLE=1" in unit_env(lab_host)
