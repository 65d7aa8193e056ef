"""playbooks/monitoring.yml, run for real on an inventory whose hosts are never contacted (TEST-NET addresses, RFC
5737): a bad node_metrics or monitoring_server input is refused by its first play, on the controller, naming the
variable and its fix, before any play reaches a host (had a task run on one, it would be unreachable after an SSH
timeout). playbooks/monitoring_files.yml refuses one before it writes a file. tests/unit/test_input_table.py checks
every input's bad value against the same code (playbooks/tasks/role_inputs.yml) without a run each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playbook import no_host_contacted, run_playbook

FLEET = ("all:\n  children:\n    blackwell:\n      hosts:\n        worker-1:\n          ansible_host: 192.0.2.1\n"
         "    routers:\n      hosts:\n        router-1:\n          ansible_host: 192.0.2.2\n"
         "    monitoring:\n      hosts:\n        prom-1:\n          ansible_host: 192.0.2.3\n")
# The webhook's token, never to be printed.
TOKEN = "sentinel-7f3a"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "hosts.yml"
    path.write_text(FLEET)
    return path


def test_a_bad_monitoring_input_is_refused_before_any_host(fleet):
    bad = {"node_metrics_port": 0, "monitoring_server_retention": "15 days",
           "monitoring_server_alert_webhook_url": f"hooks.example.com/services/{TOKEN}"}
    run = run_playbook(fleet, "playbooks/monitoring.yml", json.dumps(bad), timeout=60)
    out = no_host_contacted(run, "Machine, GPU and moefleet metrics on the workers")
    assert run.returncode != 0
    port = "node_metrics_port is 0; set it to a whole number from 1 to 65535."
    assert f"worker-1: {port}" in out and f"router-1: {port}" in out
    # the monitoring host's refusal: node_metrics' and monitoring_server's inputs, in one message
    assert port in out.split("prom-1: ", 1)[1].split("Set each variable", 1)[0]
    assert "monitoring_server_retention is '15 days'; set it to a Prometheus duration such as 30s, 5m, 1h30m or " \
           "15d." in out
    assert "monitoring_server_alert_webhook_url is (value not shown); set it to an http:// or https:// URL" in out
    assert "roles/monitoring_server/meta/argument_specs.yml says what it is" in out
    assert TOKEN not in run.stdout + run.stderr


def test_an_inventory_value_is_refused_for_its_host(tmp_path):
    """Each host's own values (inventory), each role's inputs where the role runs: monitoring_server's on group
    monitoring."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(FLEET.replace("ansible_host: 192.0.2.3\n",
                                       "ansible_host: 192.0.2.3\n          monitoring_server_port: 99999\n")
                         .replace("ansible_host: 192.0.2.1\n",
                                  "ansible_host: 192.0.2.1\n          node_metrics_textfile_dir: textfiles\n"))
    run = run_playbook(inventory, "playbooks/monitoring.yml", timeout=60)
    out = no_host_contacted(run, "Machine, GPU and moefleet metrics on the workers")
    assert run.returncode != 0
    assert "prom-1: monitoring_server_port is 99999; set it to a whole number from 1 to 65535." in out
    assert "worker-1: node_metrics_textfile_dir is 'textfiles'; set it to an absolute path" in out
    assert "router-1: " not in out


def test_monitoring_files_refuses_a_bad_input_before_writing_a_file(fleet, tmp_path):
    out_dir = tmp_path / "files"
    run = run_playbook(fleet, "playbooks/monitoring_files.yml", f"monitoring_files_dir={out_dir}",
                       "monitoring_server_down_for=1.5m", timeout=60)
    out = no_host_contacted(run, "Machine, GPU and moefleet metrics on the workers")
    assert run.returncode != 0
    assert "localhost: monitoring_server_down_for is '1.5m'; set it to a Prometheus duration" in out
    assert not (out_dir / "prometheus.yml").exists()
