"""A deployed lab host rebooted for real (sim/lab/lab.py reboot: the container restarts, systemd boots again with a
new /dev, and lab.py makes no device node): the GPUs' nodes must come from the driver role's
nvidia-uvm-devices.service, before sglang.service starts.

In order, on itest-1 of the lab_inventory fixture: (1) with that unit broken, the boot leaves no /dev/nvidia* at
all, and sglang.service refuses with the device check's sentence naming every missing node (no SGLang process, no
CUDA error), then retries with a delay instead of giving up after three starts in 15 s; (2) once the unit runs, the
service's own next retry serves, nothing restarted by hand; (3) a clean reboot: the unit makes every node and the
first start at boot serves.

Runs after the rollout and bench tests of this directory when they share a session (they leave itest-1 serving, and
no later test uses it); alone, it deploys tp8 there first (about 2.5 minutes more). About a minute and a half on a
serving host (two reboots, three starts of the simulator).

Cost (a fresh-clone make test, beside two other jobs): 59 s (two reboots of one host).

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 62 s wall, 5 CPU-s on the controller (the hosts' figure was lost
to the reboot's new cgroup then).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import on_host, run_playbook  # noqa: E402  (tests/playbook.py)

HOST = "itest-1"
NODES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", *(f"/dev/nvidia{i}" for i in range(8))]
BROKEN = "/etc/systemd/system/nvidia-uvm-devices.service.d/broken-by-test.conf"
HEALTHY = "curl -sf -m 2 -o /dev/null http://127.0.0.1:30000/health && echo serving || echo not"
REFUSED = "sglang.service refuses to start: the NVIDIA device nodes "


def reboot() -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "sim" / "lab" / "lab.py"), "reboot", HOST],
                          capture_output=True, text=True, timeout=180)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - started


def wait_for(inventory: Path, command: str, want: str, timeout: float) -> float:
    """Seconds until `command`'s output on the host contains `want`; fails with the unit's journal after timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if want in on_host(inventory, HOST, command):
            return time.monotonic() - started
        time.sleep(1)
    pytest.fail(f"no {want!r} from {command!r} within {timeout:.0f} s:\n"
                + on_host(inventory, HOST, "journalctl -b --no-pager -n 60 -u sglang -u nvidia-uvm-devices"))


def unit(inventory: Path, name: str, *props: str) -> dict[str, str]:
    out = on_host(inventory, HOST, f"systemctl show -p {','.join(props)} {name}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_after_a_reboot_the_roles_units_make_the_nodes_and_the_service_serves(lab_inventory):
    inventory = lab_inventory
    started = time.monotonic()
    if "serving" not in on_host(inventory, HOST, HEALTHY) or "present" not in on_host(
            inventory, HOST, "test -e /etc/systemd/system/sglang.service.d/moefleet-serving.conf && echo present"):
        deployed = run_playbook(inventory, "deploy.yml", "profile=tp8", options=("--limit", f"{HOST},localhost"),
                                timeout=900)
        assert deployed.returncode == 0, deployed.stdout[-4000:]
    ready = time.monotonic()

    # (1) The node unit broken: nothing makes a node at boot, and the service says so instead of failing in CUDA.
    broken = "[Service]\\nExecStart=\\nExecStart=/bin/sh -c \"echo broken by the reboot test; exit 1\"\\n"
    on_host(inventory, HOST,
            f"mkdir -p {Path(BROKEN).parent} && printf '{broken}' > {BROKEN} && systemctl daemon-reload")
    assert "broken by the reboot test" in on_host(inventory, HOST, "systemctl cat nvidia-uvm-devices.service")
    first_boot = reboot()
    assert on_host(inventory, HOST, "ls /dev | grep -c '^nvidia' || true").strip() == "0"  # lab.py made none
    assert unit(inventory, "nvidia-uvm-devices.service", "ActiveState")["ActiveState"] == "failed"
    refused_after = wait_for(inventory, "journalctl -b -u sglang.service -o cat --no-pager", REFUSED, 60)
    journal = on_host(inventory, HOST, "journalctl -b -u sglang.service -o cat --no-pager")
    sentence = next(line for line in journal.splitlines() if line.startswith(REFUSED))
    assert sentence.startswith(REFUSED + ", ".join(NODES) + " are missing"), sentence
    assert "systemctl start nvidia-uvm-devices.service" in sentence
    for cuda_failure in ("Traceback", "RuntimeError", "CUDA error", "NCCL", "nccl"):
        assert cuda_failure not in journal, cuda_failure
    processes = on_host(inventory, HOST,
                        "journalctl -b -u sglang.service -o short --no-pager | grep -c ' python\\[' || true")
    assert processes.strip() == "0"  # SGLang never ran
    # retried, not given up: the old drop-in allowed three starts 5 s apart and the unit failed within 15 s
    retried_after = wait_for(inventory,
                             "[ $(systemctl show -p NRestarts --value sglang.service) -ge 1 ] && echo retried",
                             "retried", 60)
    state = unit(inventory, "sglang.service", "ActiveState", "Result", "NRestarts")
    assert state["ActiveState"] != "failed" and state["Result"] != "start-limit-hit", state
    print(f"broken node unit: refused {refused_after:.0f} s after the reboot returned, retried after "
          f"{refused_after + retried_after:.0f} s; {state}")

    # (2) The nodes made: the service's own next retry serves.
    on_host(inventory, HOST, f"rm -r {Path(BROKEN).parent} && systemctl daemon-reload && "
            "systemctl start nvidia-uvm-devices.service")
    recovered = wait_for(inventory, HEALTHY, "serving", 120)
    assert int(unit(inventory, "sglang.service", "NRestarts")["NRestarts"]) >= 1

    # (3) A clean reboot: the unit makes every node before the service starts, whose first start serves.
    second_boot = reboot()
    serving_after = wait_for(inventory, HEALTHY, "serving", 120)
    nodes = on_host(inventory, HOST, "stat -c '%n %F %t:%T' " + " ".join(NODES))
    for i, node in enumerate(NODES[3:]):
        assert f"{node} character special file c3:{i:x}" in nodes, nodes
    assert f"{NODES[0]} character special file c3:ff" in nodes
    made = on_host(inventory, HOST, "journalctl -b -u nvidia-uvm-devices.service -o cat --no-pager")
    assert "Device nodes " + " ".join(NODES[3:]) + " for the GPUs" in made, made
    node_unit = unit(inventory, "nvidia-uvm-devices.service", "ActiveEnterTimestampMonotonic")
    service = unit(inventory, "sglang.service", "NRestarts", "ExecMainStartTimestampMonotonic")
    assert int(node_unit["ActiveEnterTimestampMonotonic"]) <= int(service["ExecMainStartTimestampMonotonic"])
    assert service["NRestarts"] == "0"
    print(f"reboot test: deploy first {ready - started:.0f} s; broken boot {first_boot:.0f} s + refusal "
          f"{refused_after:.0f} s + retry; serving again {recovered:.0f} s after the unit ran; clean reboot "
          f"{second_boot:.0f} s, serving {serving_after:.0f} s later; {time.monotonic() - ready:.0f} s in all")
