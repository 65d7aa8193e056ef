"""The driver role against the mirror's NVIDIA layouts: branch lock, branch changes, an existing
cuda-keyring source, Secure Boot and nvidia-uvm. Converge left both hosts on branch 580."""

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import run_playbook  # noqa: E402

INVENTORY = os.environ["MOEFLEET_LAB_INVENTORY"]
CONVERGE = "molecule/install/converge.yml"


def name(host):
    return host.backend.get_hostname()


def driver(host):
    return host.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.splitlines()[0]


def converge(host, *extra, options=()):
    return run_playbook(INVENTORY, CONVERGE, *extra, options=("--limit", name(host), *options), timeout=600)


def test_branch_580_is_locked(host):
    assert driver(host).startswith("580."), driver(host)
    assert host.package("nvidia-driver-pinning-580").is_installed
    assert "Pin: version 580.*" in host.file("/etc/apt/preferences.d/nvidia-driver-pinning-580").content_string


def test_apt_update_works(host):
    update = host.run("apt-get update")
    assert update.rc == 0 and "Conflicting values" not in update.stderr, update.stderr


def test_existing_cuda_keyring_source_is_reused(host):
    if name(host) != "install-2":
        pytest.skip("install-2 carries cuda-keyring's source")
    assert host.file("/etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list").exists
    assert not host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").exists
    assert host.package("nvidia-compute-utils-580").is_installed  # ubuntu2404's name for the daemon's package


def test_nvidia_uvm_nodes_exist_and_unprivileged_modprobe_cannot_make_them(host):
    assert host.file("/dev/nvidia-uvm").exists
    assert host.service("nvidia-uvm-devices").is_enabled
    assert "nvidia-uvm" in host.file("/etc/modules-load.d/nvidia-uvm.conf").content_string
    # What the sglang service would face: no root, so no module load and no node.
    assert host.run("setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/nvidia-modprobe -u -c=0").rc == 1


def test_secure_boot_is_refused_before_any_change(host):
    if name(host) != "install-1":
        pytest.skip("one host is enough")
    # A stand-in mokutil, as on a host whose firmware has Secure Boot on.
    host.run("printf '#!/bin/sh\\necho SecureBoot enabled\\n' > /usr/local/bin/mokutil")
    host.run("chmod 755 /usr/local/bin/mokutil")
    try:
        before = host.run("dpkg-query -W -f '${Package} ${Version}\\n'").stdout
        result = converge(host, "nvidia_driver_branch=570")
        assert result.returncode != 0
        assert "Secure Boot is enabled" in result.stdout and "Enroll MOK" in result.stdout, result.stdout[-3000:]
        assert host.run("dpkg-query -W -f '${Package} ${Version}\\n'").stdout == before
    finally:
        host.run("rm -f /usr/local/bin/mokutil")


def test_changing_the_branch_downgrades_and_back(host):
    check = converge(host, "nvidia_driver_branch=570", options=("--check",))
    assert check.returncode == 0, check.stdout[-3000:]
    assert "so this run downgrades the driver to branch 570" in re.sub(r"\s+", " ", check.stdout)
    assert driver(host).startswith("580.")
    try:
        down = converge(host, "nvidia_driver_branch=570")
        assert down.returncode == 0, down.stdout[-3000:]
        assert driver(host).startswith("570.")
        assert not host.package("nvidia-driver-pinning-580").is_installed
        again = converge(host, "nvidia_driver_branch=570")
        assert re.search(r"changed=0\s", again.stdout), again.stdout[-2000:]
    finally:
        up = converge(host)
        assert up.returncode == 0, up.stdout[-3000:]
    assert driver(host).startswith("580.")
