"""lab.py up --router: the inventory it writes puts L-router in group routers and binds the workers to their
lab address (sglang_service_host); without --router the inventory is what it was."""

from __future__ import annotations

from pathlib import Path

import yaml
from playbook import lab_module

ROOT = Path(__file__).resolve().parents[2]



def test_inventory_with_and_without_the_router(tmp_path, monkeypatch):
    lab = lab_module()
    monkeypatch.setattr(lab, "log", lambda msg: None)
    monkeypatch.setattr(lab, "SSH_CONFIGS", tmp_path / "lab-state" / "ssh_config")
    hosts = {"lab-1": "10.89.1.2", "lab-2": "10.89.1.3"}
    plain, routed = tmp_path / "plain" / "hosts.yml", tmp_path / "routed" / "hosts.yml"
    lab.write_inventory(plain, hosts)
    lab.write_inventory(routed, hosts, router=("lab-router", "10.89.1.4"))
    plain_doc, routed_doc = yaml.safe_load(plain.read_text()), yaml.safe_load(routed.read_text())
    assert set(plain_doc["all"]["children"]) == {"blackwell"}
    assert all("sglang_service_host" not in v for v in plain_doc["all"]["children"]["blackwell"]["hosts"].values())
    workers = routed_doc["all"]["children"]["blackwell"]["hosts"]
    assert {h: v["sglang_service_host"] for h, v in workers.items()} == hosts
    assert routed_doc["all"]["children"]["routers"]["hosts"] == {"lab-router": {"ansible_host": "10.89.1.4"}}
    assert "Host lab-router\n  HostName 10.89.1.4" in lab.ssh_config_path(routed).read_text()


def test_ssh_config_lives_outside_the_inventory_directory(tmp_path, monkeypatch):
    """ansible-playbook -i DIR parses every file in DIR: an ssh_config there gave ~20 lines of warnings."""
    lab = lab_module()
    monkeypatch.setattr(lab, "log", lambda msg: None)
    monkeypatch.setattr(lab, "SSH_CONFIGS", tmp_path / "lab-state" / "ssh_config")
    one, other = tmp_path / "one" / "hosts.yml", tmp_path / "other" / "one" / "hosts.yml"
    (one.parent).mkdir()
    (one.parent / "ssh_config").write_text("Host stale\n")  # where earlier versions of lab.py wrote it
    lab.write_inventory(one, {"lab-1": "10.89.1.2"})
    lab.write_inventory(other, {"lab-1": "10.89.1.3"})
    assert sorted(p.name for p in one.parent.iterdir()) == ["hosts.yml"]
    assert lab.ssh_config_path(one).parent == tmp_path / "lab-state" / "ssh_config"
    assert lab.ssh_config_path(one) != lab.ssh_config_path(other)  # one per inventory directory
    assert "HostName 10.89.1.2" in lab.ssh_config_path(one).read_text()
    assert "HostName 10.89.1.3" in lab.ssh_config_path(other).read_text()
    assert lab.ssh_config_path(one) == lab.ssh_config_path(one.parent / "." / "hosts.yml")
