"""sim/lab/lab.py and a host's boot: the lab makes no /dev/nvidia* node itself (the driver role's unit does, at
every boot), gives the simulated nvidia-modprobe the driver's /proc/devices lines with the majors the container may
use, and keeps each host's address across reboots."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from playbook import lab_module

ROOT = Path(__file__).resolve().parents[2]



def test_a_host_start_makes_no_device_node(monkeypatch):
    lab = lab_module()
    ran = []
    monkeypatch.setattr(lab, "podman", lambda *args, **kw: ran.append(args))
    lab.prepare_host("moefleet-x-1")
    script = ran[0][-1]
    assert "mknod" not in script and "/dev/nvidia" not in script
    assert "/etc/sim-gpu/proc-devices" in script and "mount --make-rshared /" in script
    assert "sysinit.target.wants" in script  # the shared root comes back at every boot, without lab.py


def test_the_proc_devices_lines_name_the_majors_the_container_may_use():
    lab = lab_module()
    lines = dict(reversed(line.split()) for line in lab.proc_devices_lines().splitlines())
    rules = lab.host_options()
    for name in ("nvidia-uvm", "nvidia-caps"):
        assert f"c {lines[name]}:* rwm" in rules, (name, rules)
    assert {rel: major for rel, major, _, _ in lab.GPU_NODES}["nvidia-uvm"] == int(lines["nvidia-uvm"])


def test_a_new_host_gets_an_address_from_the_top_that_no_host_holds(monkeypatch):
    lab = lab_module()
    network = [{"subnets": [{"subnet": "10.89.7.0/24", "gateway": "10.89.7.1"}]}]
    monkeypatch.setattr(lab, "podman",
                        lambda *args, **kw: subprocess.CompletedProcess(args, 0, json.dumps(network), ""))
    monkeypatch.setattr(lab, "lab_containers", lambda lab_name=None: {
        "moefleet-a-1": {"Labels": {"moefleet.ip": "10.89.7.250"}, "State": "exited"},
        "moefleet-a-2": {"Labels": {}, "State": "running", "Networks": [lab.NETWORK]},
    })
    monkeypatch.setattr(lab, "container_ip", lambda name: "10.89.7.249")
    assert lab.static_ip() == "10.89.7.248"


def test_a_host_keeps_its_mac_as_a_nic_does():
    """A new MAC at each start left the machine's neighbour cache on the old one: ssh timed out for ~30 s."""
    lab = lab_module()
    assert lab.static_mac("10.89.166.250") == "02:42:0a:59:a6:fa"
    assert lab.static_mac("10.89.7.2") != lab.static_mac("10.89.7.3")
