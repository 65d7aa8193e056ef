"""nvidia-uvm-devices.service as the nvidia_driver role renders it: at boot it makes nvidiactl, a node for every GPU
the driver reports (else for the GPUs the inventory expects) and the UVM nodes, before sglang.service starts. Its
commands run here against a stub or the lab's nvidia-modprobe stand-in (sim/mirrors/build.py), which makes nodes
as NVIDIA's does: -c=N /dev/nvidiaN (255: nvidiactl), -u -c=0 the UVM nodes only."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from playbook import ROOT, run_playbook

TEMPLATE = ROOT / "roles" / "nvidia_driver" / "templates" / "etc/systemd/system/nvidia-uvm-devices.service.j2"
# The unit checker every role validates its units with (roles/moefleet_common installs it).
CHECKER = ROOT / "roles" / "moefleet_common" / "files" / "systemd-verify-strict"
DEVICE_CHECK = ROOT / "roles" / "sglang_service" / "files" / "sglang-device-check"
sys.path.insert(0, str(ROOT / "sim" / "mirrors"))
import build  # noqa: E402  (sim/mirrors/build.py: the nvidia-modprobe stand-in's text)

UVM_MAJOR = 243  # any dynamic major: the stand-in reads it from the lab's /proc/devices lines


def render(tmp_path: Path, count: int) -> str:
    playbook = tmp_path / "render.yml"
    dest = tmp_path / f"nvidia-uvm-devices-{count}.service"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 "nvidia_driver_expected_gpu_count": count},
        "tasks": [{"name": "Render",
                   "ansible.builtin.template": {"src": str(TEMPLATE), "dest": str(dest), "mode": "0644"}}],
    }]))
    done = run_playbook("localhost,", str(playbook), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return dest.read_text()


@pytest.fixture(scope="module")
def unit(tmp_path_factory) -> str:
    return render(tmp_path_factory.mktemp("nodes"), 8)


def exec_starts(text: str) -> list[str]:
    """The ExecStart= command lines, unescaped as systemd runs them ($$ is $; no other escape is used)."""
    return [line.removeprefix("ExecStart=").replace("$$", "$") for line in text.splitlines()
            if line.startswith("ExecStart=")]


def argv(line: str) -> list[str]:
    """A command line split as systemd splits it: words, or one single-quoted word (the shell script)."""
    return [a or b for a, b in re.findall(r"'([^']*)'|(\S+)", line)]


def run_unit(text: str, modprobe: Path, proc_gpus: Path,
             env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
    """Each ExecStart= in order, with nvidia-modprobe and /proc/driver/nvidia/gpus replaced; stops at a failure,
    as a oneshot does."""
    results = []
    for line in exec_starts(text):
        words = [w.replace("/usr/bin/nvidia-modprobe", str(modprobe))
                 .replace("/proc/driver/nvidia/gpus", str(proc_gpus)) for w in argv(line)]
        results.append(subprocess.run(words, capture_output=True, text=True, env=dict(os.environ, **(env or {}))))
        if results[-1].returncode != 0:
            break
    return results


@pytest.fixture
def stub(tmp_path) -> Path:
    """An nvidia-modprobe that records its arguments, one call a line, and fails for -c=5 if FAIL_5 is set."""
    script = tmp_path / "nvidia-modprobe"
    script.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n'
                      '[ -n "$FAIL_5" ] && [ "$1" = -c=5 ] && exit 1\nexit 0\n')
    script.chmod(0o755)
    return script


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_the_control_node_then_each_gpu_then_the_uvm_nodes(unit):
    lines = exec_starts(unit)
    assert lines[0] == "/usr/bin/nvidia-modprobe -c=255"
    assert lines[1].startswith("/bin/sh -c '") and "/proc/driver/nvidia/gpus/*/information" in lines[1]
    assert lines[2] == "/usr/bin/nvidia-modprobe -u -c=0"
    assert len(lines) == 3
    assert "Type=oneshot" in unit and "RemainAfterExit=yes" in unit and "WantedBy=multi-user.target" in unit


def test_a_node_for_every_gpu_the_driver_reports(unit, stub, tmp_path):
    """Three GPUs reported (the inventory expects eight): three nodes, by the driver's own minor numbers."""
    gpus = tmp_path / "gpus"
    for bus, minor in (("0000:01:00.0", 0), ("0000:41:00.0", 2), ("0000:81:00.0", 1)):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(f"Model: \t\t NVIDIA RTX PRO 6000\nIRQ: \t\t 88\n"
                                                f"Device Minor: \t {minor}\nGPU Excluded: \t No\n")
    results = run_unit(unit, stub, gpus)
    assert [r.returncode for r in results] == [0, 0, 0]
    assert calls(tmp_path) == ["-c=255", "-c=0", "-c=2", "-c=1", "-u -c=0"]
    # (the /proc path in the message is the one the test put in its place)
    assert results[1].stdout == (f"Device nodes /dev/nvidia0 /dev/nvidia2 /dev/nvidia1 for the GPUs the driver "
                                 f"reports ({gpus}).\n")


def test_the_expected_count_where_the_driver_reports_none(tmp_path, stub):
    """No /proc/driver/nvidia (a container: the lab): the GPUs nvidia_driver_expected_gpu_count says."""
    results = run_unit(render(tmp_path, 4), stub, tmp_path / "absent")
    assert [r.returncode for r in results] == [0, 0, 0]
    assert calls(tmp_path) == ["-c=255", "-c=0", "-c=1", "-c=2", "-c=3", "-u -c=0"]
    assert "for the GPUs this host must have (nvidia_driver_expected_gpu_count" in results[1].stdout


def test_a_node_it_cannot_make_fails_the_unit(unit, stub, tmp_path):
    results = run_unit(unit, stub, tmp_path / "absent", env={"FAIL_5": "1"})
    assert [r.returncode for r in results] == [0, 1]
    assert results[1].stderr == "nvidia-modprobe -c=5 failed: no /dev/nvidia5\n"
    assert calls(tmp_path)[-1] == "-c=5"  # the UVM line did not run either: the oneshot failed


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_unit_verifies_silently(unit, stub, tmp_path):
    path = tmp_path / "nvidia-uvm-devices.service"
    path.write_text(unit.replace("/usr/bin/nvidia-modprobe", str(stub)))  # verify checks that each command exists
    done = subprocess.run([str(CHECKER), str(path)], capture_output=True, text=True,
                          env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ the lab's stand-in, as the unit runs it


@pytest.fixture
def stand_in(tmp_path) -> tuple[Path, dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("the stand-in makes character devices as root, as the real one does")
    script = tmp_path / "nvidia-modprobe"
    script.write_text(build.NVIDIA_MODPROBE.replace("{version}", "580.95.05"))
    script.chmod(0o755)
    (tmp_path / "dev").mkdir()
    (tmp_path / "proc-devices").write_text(f"244 nvidia-caps\n{UVM_MAJOR} nvidia-uvm\n")
    env = {"SIM_GPU_DEV_DIR": str(tmp_path / "dev"), "SIM_GPU_RUN_DIR": str(tmp_path / "run"),
           "SIM_GPU_PROC_DEVICES": str(tmp_path / "proc-devices")}
    return script, env


def nodes(dev: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for path in sorted(dev.iterdir()):
        st = path.lstat()
        assert stat.S_ISCHR(st.st_mode), path
        out[path.name] = (os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))
    return out


def test_the_stand_in_makes_what_nvidias_makes(stand_in, tmp_path):
    script, env = stand_in
    run = lambda *args: subprocess.run([str(script), *args], env=dict(os.environ, **env),  # noqa: E731
                                       capture_output=True, text=True)
    assert run("-u", "-c=0").returncode == 0
    assert nodes(tmp_path / "dev") == {"nvidia-uvm": (UVM_MAJOR, 0, 0o666), "nvidia-uvm-tools": (UVM_MAJOR, 1, 0o666)}
    assert run("-c=3").returncode == 0  # a GPU's node only: no nvidiactl with it
    assert set(nodes(tmp_path / "dev")) == {"nvidia-uvm", "nvidia-uvm-tools", "nvidia3"}
    (tmp_path / "dev" / "nvidiactl").write_text("")  # something else where the node belongs is replaced
    assert run("-c", "255").returncode == 0
    assert nodes(tmp_path / "dev")["nvidiactl"] == (195, 255, 0o666)
    assert run("-c=256").returncode == 1 and run("-s", "-c=0").returncode == 1  # no such minor; no NVSwitch here
    assert run("-u", "-c=0").returncode == 0  # kept as they are
    (tmp_path / "proc-devices").write_text("")
    assert run("-u", "-c=0").returncode == 1  # no nvidia-uvm in /proc/devices: it fails, as NVIDIA's does
    assert (tmp_path / "run" / "modules").read_text().split() == ["nvidia_uvm", "nvidia"]


def test_the_unit_with_the_stand_in_makes_every_node_the_service_checks(stand_in, tmp_path):
    """The unit's commands with the lab's stand-in make what sglang.service's device check asks for."""
    script, env = stand_in
    results = run_unit(render(tmp_path, 8), script, tmp_path / "absent", env=env)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    made = nodes(tmp_path / "dev")
    assert made == {"nvidiactl": (195, 255, 0o666), **{f"nvidia{i}": (195, i, 0o666) for i in range(8)},
                    "nvidia-uvm": (UVM_MAJOR, 0, 0o666), "nvidia-uvm-tools": (UVM_MAJOR, 1, 0o666)}
    wanted = [tmp_path / "dev" / n
              for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", *(f"nvidia{i}" for i in range(8)))]
    check = subprocess.run([str(DEVICE_CHECK), *map(str, wanted)], capture_output=True, text=True)
    assert (check.returncode, check.stderr) == (0, "")


def test_there_is_one_unit_checker():
    """Each host validates every unit the roles write with the one moefleet_common installs; a role's own copy
    would drift apart from it."""
    assert sorted(ROOT.glob("roles/*/files/systemd-verify-strict")) == [CHECKER]
    assert "systemd-verify-strict" in (ROOT / "roles" / "moefleet_common" / "tasks" / "main.yml").read_text()
