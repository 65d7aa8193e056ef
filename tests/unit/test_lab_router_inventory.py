"""lab.py up --router: the inventory it writes puts L-router in group routers and binds the workers to their
lab address (sglang_service_host); without --router the inventory is what it was."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_lab():
    spec = importlib.util.spec_from_file_location("lab_under_test", ROOT / "sim" / "lab" / "lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inventory_with_and_without_the_router(tmp_path, monkeypatch):
    lab = load_lab()
    monkeypatch.setattr(lab, "log", lambda msg: None)
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
    assert "Host lab-router\n  HostName 10.89.1.4" in (routed.parent / "ssh_config").read_text()
