"""sglang.service as the role renders it: the sandbox's choices, with the host's systemd version as input,
checked by this machine's `systemd-analyze verify` through the role's own strict checker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from playbook import ROOT, run_playbook

ROLE = ROOT / "roles" / "sglang_service"
CHECKER = ROLE / "files" / "systemd-verify-strict"
VERSIONS = (249, 251, 252, 255, 257)
NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]


def render(tmp_path: Path, versions=VERSIONS, home: str = "/var/lib/sglang") -> dict[int, str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)  # verify checks that ExecStart exists
    playbook = tmp_path / "render.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        # the role's dependencies' defaults first (meta/main.yml: sglang, sglang_model), as Ansible loads them
        "vars_files": [str(ROLE.parent / "sglang" / "defaults" / "main.yml"),
                       str(ROLE.parent / "sglang_model" / "defaults" / "main.yml"),
                       str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [{
            "name": "Render the unit for each systemd version",
            "ansible.builtin.template": {"src": str(ROLE / "templates/etc/systemd/system/sglang.service.j2"),
                                         "dest": str(tmp_path) + "/sglang-{{ item }}.service", "mode": "0644"},
            "loop": list(versions),
            # task vars: above the role files loaded as vars_files
            "vars": {
            "_sglang_service_systemd_version": "{{ item }}",
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
    done = run_playbook("localhost,", str(playbook), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return {v: (tmp_path / f"sglang-{v}.service").read_text() for v in versions}


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    return render(tmp_path_factory.mktemp("unit"))


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


@needs_verify
@pytest.mark.parametrize("version", (249, 252, 257))
def test_the_rendered_unit_verifies_silently(units, tmp_path, version):
    unit = tmp_path / "sglang.service"
    unit.write_text(units[version])
    done = subprocess.run([str(CHECKER), str(unit)], capture_output=True, text=True,
                          env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
    assert done.returncode == 0, done.stderr


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
    playbook = tmp_path / "inputs.yml"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"sglang_home": "/etc/sglang/../../var/lib/sglang",
                 "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"name": "Check", "ansible.builtin.include_tasks": str(ROLE / "tasks" / "inputs.yml")}],
    }]))
    done = run_playbook("localhost,", str(playbook), timeout=120)
    assert done.returncode != 0
    assert "set it to an absolute path without '.', '..'" in done.stdout
    ok = tmp_path / "ok.yml"
    ok.write_text(playbook.read_text().replace("/etc/sglang/../../var/lib/sglang", "/var/lib/sglang"))
    assert run_playbook("localhost,", str(ok), timeout=120).returncode == 0
