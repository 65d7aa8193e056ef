"""sglang.service as the role renders it: the sandbox's choices, with the host's systemd version as input,
checked by this machine's `systemd-analyze verify` through the role's own strict checker; the serving drop-in
(its restart with a growing delay, within a start limit); the device node check the unit runs before a start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from playbook import ROOT, run_playbook

ROLE = ROOT / "roles" / "sglang_service"
CHECKER = ROOT / "roles" / "moefleet_common" / "files" / "systemd-verify-strict"
DEVICE_CHECK = ROLE / "files" / "sglang-device-check"
VERSIONS = (249, 251, 252, 254, 255, 257)
NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
DROP_IN = "sglang.service.d/moefleet-serving.conf"


def render(tmp_path: Path, versions=VERSIONS, home: str = "/var/lib/sglang") -> dict[int, str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)  # verify checks that ExecStart exists
    playbook = tmp_path / "render.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        # the role's dependencies' defaults first (meta/main.yml: moefleet_defaults, moefleet_common (none), sglang,
        # sglang_model), as Ansible loads them
        "vars_files": [str(ROLE.parent / "moefleet_defaults" / "defaults" / "main.yml"),
                       str(ROLE.parent / "sglang" / "defaults" / "main.yml"),
                       str(ROLE.parent / "sglang_model" / "defaults" / "main.yml"),
                       str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [{
            "name": "Render the unit and the serving drop-in for each systemd version",
            "ansible.builtin.template": {"src": str(ROLE / "templates/etc/systemd/system") + "/{{ item.1 }}.j2",
                                         "dest": str(tmp_path) + "/{{ item.0 }}/{{ item.1 }}", "mode": "0644"},
            "loop": [[v, name] for v in versions for name in ("sglang.service", DROP_IN)],
            # task vars: above the role files loaded as vars_files
            "vars": {
            "_sglang_service_systemd_version": "{{ item.0 }}",
            "sglang_service_catalog": "{{ lookup('ansible.builtin.file', '%s') | from_yaml }}"
                                      % (ROOT / "profiles" / "catalog.yml"),
            "sglang_service_profile": "tp2ep4",
            "sglang_venv": str(venv),
            "sglang_home": home,
            "__sglang_service_attempt": {"profile": "tp2ep4", "tuning": {}, "nccl_set": "pcie_p2p"},
            "__sglang_service_dev_nodes": {"files": [{"path": p} for p in NODES]},
            },
        }],
    }]))
    for v in versions:
        (tmp_path / str(v) / "sglang.service.d").mkdir(parents=True)
    done = run_playbook("localhost,", str(playbook), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return {v: (tmp_path / str(v) / "sglang.service").read_text() for v in versions}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """The directory of each version's unit (<version>/sglang.service) and drop-in (<version>/sglang.service.d/)."""
    out = tmp_path_factory.mktemp("unit")
    render(out)
    return out


@pytest.fixture(scope="module")
def units(rendered):
    return {v: (rendered / str(v) / "sglang.service").read_text() for v in VERSIONS}


@pytest.fixture(scope="module")
def dropins(rendered):
    return {v: (rendered / str(v) / DROP_IN).read_text() for v in VERSIONS}


def settings(unit: str) -> list[str]:
    return [line for line in unit.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("version", VERSIONS)
def test_protect_clock_only_where_it_cannot_close_the_devices(units, version):
    lines = settings(units[version])
    if version >= 252:
        assert "ProtectClock=true" in lines and "SystemCallFilter=~@clock" not in lines
    else:  # systemd#25075: before 252 its implied DeviceAllow=char-rtc r closed every other device
        assert "ProtectClock=true" not in lines and "SystemCallFilter=~@clock" in lines


def test_devices_are_closed_but_the_nvidia_nodes(units):
    lines = settings(units[255])
    assert "DevicePolicy=closed" in lines
    allowed = [line.removeprefix("DeviceAllow=") for line in lines if line.startswith("DeviceAllow=")]
    assert allowed == ["/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "/dev/nvidia-uvm-tools rw",
                       "/dev/nvidia-modeset rw", "/dev/nvidia0 rw", "/dev/nvidia1 rw",
                       "/dev/nvidia-caps/nvidia-cap1 r", "/dev/nvidia-caps/nvidia-cap2 r"]
    assert "PrivateDevices=true" not in lines


def test_the_home_is_the_one_writable_path(units):
    lines = settings(units[255])
    assert [line for line in lines if line.startswith("ReadWritePaths=")] == ["ReadWritePaths=/var/lib/sglang"]
    assert "ProtectSystem=strict" in lines


def test_every_option_keeps_its_reason(units):
    """Each sandbox option follows a comment line (its reason) or another option of the same group."""
    body = units[255].split("LimitNOFILE=")[1].split("[Install]")[0].strip().splitlines()[1:]
    groups, current = [], []
    for line in body:
        if not line:
            continue
        if line.startswith("#") and current and not current[-1].startswith("#"):
            groups.append(current)
            current = []
        current.append(line)
    groups.append(current)
    assert all(group[0].startswith("#") for group in groups), groups


needs_verify = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")


def installed(text: str) -> str:
    """A rendered file with the role's helpers at their paths in this checkout (verify checks that each command
    exists): the device check and the exit hook, as the role installs them under /usr/local/libexec/moefleet."""
    return (text.replace("/usr/local/libexec/moefleet/sglang-device-check", str(DEVICE_CHECK))
            .replace("/usr/local/libexec/moefleet/sglang-runtime-exit", str(ROLE / "files" / "sglang-runtime-exit")))


@needs_verify
@pytest.mark.parametrize("version", (249, 252, 254, 257))
def test_the_rendered_unit_verifies_silently(units, dropins, tmp_path, version):
    """With its drop-in: on systemd 252 RestartSteps= would be an unknown key ("ignoring"), which the checker
    refuses; the template names it from 254 on only (this machine's systemd judges each version's rendering)."""
    unit = tmp_path / "sglang.service"
    unit.write_text(installed(units[version]))
    (tmp_path / "sglang.service.d").mkdir()
    (tmp_path / DROP_IN).write_text(installed(dropins[version]))
    if version >= 254 and int(subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True)
                              .stdout.split()[1]) < 254:
        (tmp_path / DROP_IN).write_text("\n".join(line for line in installed(dropins[version]).splitlines()
                                                  if not line.startswith(("RestartSteps=", "RestartMaxDelaySec="))))
    done = subprocess.run([str(CHECKER), str(unit)], capture_output=True, text=True,
                          env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
    assert done.returncode == 0, done.stderr


@needs_verify
def test_the_checker_refuses_restart_steps_before_254(dropins, units, tmp_path):
    """Why the drop-in guards RestartSteps= by version: systemd 252 ignores it with a warning."""
    if int(subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True).stdout.split()[1]) >= 254:
        pytest.skip("this machine's systemd knows RestartSteps=")
    (tmp_path / "sglang.service").write_text(installed(units[252]))
    (tmp_path / "sglang.service.d").mkdir()
    (tmp_path / DROP_IN).write_text(installed(dropins[257]))
    done = subprocess.run([str(CHECKER), str(tmp_path / "sglang.service")], capture_output=True, text=True)
    assert done.returncode == 1 and "RestartSteps" in done.stderr


def test_the_device_check_runs_first_with_the_nodes_cuda_opens(units):
    lines = settings(units[255])
    pre = [line.removeprefix("ExecStartPre=") for line in lines if line.startswith("ExecStartPre=")]
    assert pre == ["/usr/local/libexec/moefleet/sglang-device-check /dev/nvidiactl /dev/nvidia-uvm "
                   "/dev/nvidia-uvm-tools /dev/nvidia0 /dev/nvidia1"]
    # every node it checks is one the unit allows read-write (the modeset node aside, which CUDA never opens)
    allowed = {line.split("=", 1)[1].rsplit(" ", 1)[0] for line in lines if line.endswith(" rw")}
    assert set(pre[0].split()[1:]) == allowed - {"/dev/nvidia-modeset"}


def test_the_unit_follows_and_wants_the_node_unit_without_requiring_it(units):
    """Ordered after nvidia-uvm-devices.service and pulling it in; not Requires=/BindsTo=, so a host without it
    (masked, failed, or never installed) gets the device check's sentence, and its restart never stops SGLang."""
    lines = settings(units[255])
    after = next(line for line in lines if line.startswith("After=")).split("=", 1)[1].split()
    wants = next(line for line in lines if line.startswith("Wants=")).split("=", 1)[1].split()
    assert "nvidia-uvm-devices.service" in after and "nvidia-uvm-devices.service" in wants
    assert not [line for line in lines if line.startswith(("Requires=", "BindsTo=", "Requisite=", "PartOf="))]


def test_without_the_drop_in_a_failed_start_stays_failed(units):
    lines = settings(units[255])
    assert "Restart=no" in lines and "StartLimitIntervalSec=0" in lines


def restart_delays(dropin: str, version: int, restarts: int) -> list[float]:
    """The delays systemd waits before each automatic restart under this drop-in (RestartSteps= grows the delay
    exponentially from RestartSec= to RestartMaxDelaySec=, as service_restart_usec() does from 254 on)."""
    values = dict(line.split("=", 1) for line in settings(dropin) if "=" in line)
    base = float(values["RestartSec"])
    steps, top = int(values.get("RestartSteps", 0)), float(values.get("RestartMaxDelaySec", base))
    if version < 254 or steps == 0:
        return [base] * restarts
    return [base * (top / base) ** (min(n, steps) / steps) for n in range(restarts)]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failing_start_after_boot_is_retried_for_minutes_then_stays_failed(dropins, version):
    """The bug this answers: the limit was three starts in ten minutes 5 s apart, so a start at boot that failed
    (its GPU nodes not made yet) was given up after 15 s and the host stayed down."""
    lines = settings(dropins[version])
    assert "Restart=on-failure" in lines
    assert ("RestartSteps=5" in lines and "RestartMaxDelaySec=120" in lines) == (version >= 254)
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    burst, interval = int(values["StartLimitBurst"]), float(values["StartLimitIntervalSec"])
    for start_takes in (0, 30, 60):  # a refusal by the device check; NCCL's init failing; a later failure
        # the burst'th start is the last one systemd makes; it must come within the interval, or the limit never
        # hits and the unit loops for ever
        span = sum(restart_delays(dropins[version], version, burst - 1)) + (burst - 1) * start_takes
        assert 120 <= span < interval, (version, start_takes, span)
    assert restart_delays(dropins[version], version, 1)[0] <= 15  # a crash while serving restarts soon


@needs_verify
def test_the_checker_fails_on_a_warning_that_systemd_analyze_exits_0_on(tmp_path):
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\nExecStart=/bin/true\nReadWritePaths=-/etc/sglang/../../var/lib/sglang\n")
    plain = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert plain.returncode == 0 and "not normalized" in plain.stderr  # what the checker exists for
    done = subprocess.run([str(CHECKER), str(unit)], capture_output=True, text=True)
    assert done.returncode == 1
    assert "is not normalized, ignoring" in done.stderr and "verifies silently" in done.stderr


def test_a_home_that_is_not_normalized_is_refused_before_the_host_changes(tmp_path):
    preflight = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    assert preflight[0]["name"] == "Check that the service's home is an absolute, normalized path"  # the first task
    playbook = tmp_path / "inputs.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"sglang_home": "/etc/sglang/../../var/lib/sglang",
                 "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [preflight[0]],
    }]))
    done = run_playbook("localhost,", str(playbook), timeout=120)
    assert done.returncode != 0
    assert "set it to an absolute path without '.', '..'" in done.stdout
    ok = tmp_path / "ok.yml"
    ok.write_text(playbook.read_text().replace("/etc/sglang/../../var/lib/sglang", "/var/lib/sglang"))
    assert run_playbook("localhost,", str(ok), timeout=120).returncode == 0


def run_check(*nodes: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(DEVICE_CHECK), *map(str, nodes)], capture_output=True, text=True)


def test_the_device_check_passes_silently_when_every_node_is_there():
    done = run_check("/dev/null", "/dev/zero")  # character devices, as the driver's nodes are
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_device_check_names_the_missing_nodes_and_what_to_do(tmp_path):
    (tmp_path / "nvidia2").write_text("")  # a plain file where a node should be is no node
    done = run_check("/dev/null", tmp_path / "nvidia1", tmp_path / "nvidia2")
    assert done.returncode == 1 and done.stdout == ""
    said = done.stderr
    assert said.startswith(f"sglang.service refuses to start: the NVIDIA device nodes {tmp_path}/nvidia1, "
                           f"{tmp_path}/nvidia2 are missing")
    assert "/dev/null" not in said
    assert "systemctl start nvidia-uvm-devices.service" in said and "journalctl -b -u nvidia-uvm-devices" in said
    one = run_check(tmp_path / "nvidia1")
    assert f"the NVIDIA device node {tmp_path}/nvidia1 is missing" in one.stderr
