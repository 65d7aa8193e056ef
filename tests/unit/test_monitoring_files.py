"""moefleet's monitoring files as an operator gets them (playbooks/monitoring_files.yml on the example inventory):
the scrape targets, Prometheus's configuration checked by the real promtool, every alert rule unit-tested by
`promtool test rules` (firing, and not firing where it must not), and the Grafana dashboards' shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import promtool  # noqa: E402
from playbook import ROOT, run_playbook  # noqa: E402

EXAMPLE = ROOT / "inventory" / "example" / "hosts.yml"
DASHBOARDS = ROOT / "roles" / "monitoring_server" / "files" / "dashboards"
W1 = {"host": "gpu-node-01", "role": "worker"}
SGLANG_W1 = {**W1, "job": "sglang", "instance": "10.0.0.11:30000"}
NODE_W1 = {**W1, "job": "node", "instance": "10.0.0.11:9100"}
GATEWAY = {"host": "gateway-01", "role": "gateway", "job": "smg", "instance": "10.0.0.10:29000"}
GPU3 = {**NODE_W1, "gpu": "3", "UUID": "GPU-3", "modelName": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("monitoring")
    result = run_playbook(EXAMPLE, "playbooks/monitoring_files.yml", f"monitoring_files_dir={out}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return out


def test_the_targets_are_the_inventorys_hosts_at_the_addresses_they_serve_on(exported):
    def read(job):
        return json.loads((exported / "moefleet-targets" / f"{job}.json").read_text())

    assert read("sglang") == [{"targets": ["10.0.0.11:30000"], "labels": {"host": "gpu-node-01", "role": "worker"}},
                              {"targets": ["10.0.0.12:30000"], "labels": {"host": "gpu-node-02", "role": "worker"}}]
    assert read("smg") == [{"targets": ["10.0.0.10:29000"], "labels": {"host": "gateway-01", "role": "gateway"}}]
    assert [(t["targets"], t["labels"]["role"]) for t in read("node")] == [
        (["10.0.0.11:9100"], "worker"), (["10.0.0.12:9100"], "worker"), (["10.0.0.10:9100"], "gateway")]
    assert read("dcgm") == []


def test_promtool_accepts_the_configuration_and_its_rules(exported):
    result = promtool.run("check", "config", exported / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


def test_promtool_refuses_a_broken_rule_so_the_check_above_can_fail(tmp_path):
    (tmp_path / "bad.yml").write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up ==\n")
    assert promtool.run("check", "rules", tmp_path / "bad.yml").returncode != 0


def test_a_worker_bound_to_the_loopback_is_refused_before_any_file_is_written(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"blackwell": {"hosts": {
        "gpu-node-01": {"ansible_host": "10.0.0.11"}}}}}}))
    out = tmp_path / "files"
    result = run_playbook(inventory, "playbooks/monitoring_files.yml", f"monitoring_files_dir={out}")
    assert result.returncode != 0
    assert "gpu-node-01 serve(s) on the loopback address (sglang_service_host)" in result.stdout
    assert not (out / "prometheus.yml").exists()


# ------------------------------------------------------------------------------------------------ alert rules
def series(name: str, labels: dict, values: str) -> dict:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def case(alert, inputs, fires_at, labels, summary, quiet_at=None, quiet_inputs=None):
    """One rule's tests: with ``inputs`` it fires at ``fires_at`` with ``labels`` and ``summary`` (and, at
    ``quiet_at``, not yet or no longer); with ``quiet_inputs`` it never fires (checked at ``fires_at``)."""
    return alert, inputs, fires_at, labels, summary, quiet_at, quiet_inputs


UNIT = {**NODE_W1, "name": "sglang.service"}


def unit(state: str, started_at: int, samples: int = 20) -> list[dict]:
    """node_exporter's systemd collector on the worker: sglang.service in `state` since `started_at` seconds."""
    return [series("node_systemd_unit_state", {**UNIT, "state": s}, f"{1 if s == state else 0}x{samples}")
            for s in ("activating", "active", "deactivating", "inactive", "failed")] + [
        series("node_systemd_unit_start_time_seconds", UNIT, f"{started_at}x{samples}")]


WORKER_DOWN = "gpu-node-01: SGLang does not answer its /metrics scrape"
MAINTENANCE = {**NODE_W1, "reason": "deploy"}
IN_MAINTENANCE = "gpu-node-01: moefleet deploy works on the host; its alerts are inhibited"
CASES = [
    # No systemd series (a node_exporter without its systemd collector): down is down.
    case("MoefleetWorkerDown", [series("up", SGLANG_W1, "1 1 0x20")], "2m", {**SGLANG_W1, "severity": "critical"},
         WORKER_DOWN, quiet_at="45s",
         # a restart (after an OOM, or by hand) loading the model: the unit active since 15 s, /metrics not up yet
         quiet_inputs=[series("up", SGLANG_W1, "1 0x20"), *unit("active", 15)]),
    # Stopped (or failed): it fires whatever the unit's last start.
    case("MoefleetWorkerDown", [series("up", SGLANG_W1, "1 0x20"), *unit("inactive", 15)], "2m",
         {**SGLANG_W1, "severity": "critical"}, WORKER_DOWN, quiet_at="30s",
         quiet_inputs=[series("up", SGLANG_W1, "1 0x20"), *unit("activating", 15)]),
    # A start that loads for longer than a deploy waits (sglang_service_ready_timeout, 2700 s): it fires then.
    case("MoefleetWorkerDown", [series("up", SGLANG_W1, "1 0x220"), *unit("active", 15, 220)], "47m",
         {**SGLANG_W1, "severity": "critical"}, WORKER_DOWN, quiet_at="45m"),
    # A deploy works on the host from 30 s: in maintenance (Alertmanager inhibits the host's other alerts) ...
    case("MoefleetInMaintenance",
         [series("moefleet_maintenance_start_timestamp_seconds", MAINTENANCE, "0 0 30x10 0x20")], "1m",
         {**MAINTENANCE, "severity": "none"}, IN_MAINTENANCE,
         quiet_at="4m",  # ... until it writes its end (0)
         # a host the fault watcher keeps out is never in maintenance (a deploy to it is refused)
         quiet_inputs=[series("moefleet_maintenance_start_timestamp_seconds", MAINTENANCE, "0 0 30x10"),
                       series("moefleet_host_unfit", {**NODE_W1, "state": "unfit"}, "1x12")]),
    # ... also while the host reboots (no scrape of its node_exporter for minutes) ...
    case("MoefleetInMaintenance",
         [series("moefleet_maintenance_start_timestamp_seconds", MAINTENANCE, "0 0 30x4 _x60")], "15m",
         {**MAINTENANCE, "severity": "none"}, IN_MAINTENANCE,
         quiet_at="15s"),
    # ... and at most monitoring_server_maintenance_max_seconds (6 h): a run killed before its end stops inhibiting.
    case("MoefleetInMaintenance",
         [series("moefleet_maintenance_start_timestamp_seconds", MAINTENANCE, "0 0 30x1500")], "5h59m",
         {**MAINTENANCE, "severity": "none"}, IN_MAINTENANCE,
         quiet_at="6h1m"),
    case("MoefleetNotServing",
         [series("moefleet_host_info", {**NODE_W1, "asked_profile": "tp2ep4", "serving_profile": "",
                                        "outcome": "failed"}, "1x20")], "2m",
         # an empty label is no label to Prometheus
         {**NODE_W1, "asked_profile": "tp2ep4", "outcome": "failed", "severity": "critical"},
         "gpu-node-01: the last deploy left nothing serving (outcome failed)", quiet_at="30s",
         quiet_inputs=[series("moefleet_host_info", {**NODE_W1, "asked_profile": "tp2ep4",
                                                     "serving_profile": "tp2ep4", "outcome": "ready"}, "1x20")]),
    case("MoefleetServesFallback",
         [series("moefleet_host_info", {**NODE_W1, "asked_profile": "tp2ep4", "serving_profile": "ep8",
                                        "outcome": "degraded"}, "1x20")], "1m",
         {**NODE_W1, "asked_profile": "tp2ep4", "serving_profile": "ep8", "outcome": "degraded",
          "severity": "warning"}, "gpu-node-01: serves ep8, not the asked tp2ep4",
         quiet_inputs=[series("moefleet_host_info", {**NODE_W1, "asked_profile": "tp2ep4",
                                                     "serving_profile": "tp2ep4", "outcome": "ready"}, "1x20")]),
    # promtool's time() at an evaluation is its seconds since 0: the OOM is recorded at 45 s.
    case("MoefleetRuntimeOOM",
         [series("moefleet_runtime_last_failure_timestamp_seconds", {**NODE_W1, "state": "oom"}, "0 0 0 45x200")],
         "1m", {**NODE_W1, "state": "oom", "severity": "critical"},
         "gpu-node-01: SGLang ran out of GPU memory while serving", quiet_at="30s"),
    case("MoefleetRuntimeOOM",
         [series("moefleet_runtime_last_failure_timestamp_seconds", {**NODE_W1, "state": "oom"}, "0 0 0 45x200")],
         "30m", {**NODE_W1, "state": "oom", "severity": "critical"},
         "gpu-node-01: SGLang ran out of GPU memory while serving", quiet_at="31m"),
    case("MoefleetRuntimeCrash",
         [series("moefleet_runtime_last_failure_timestamp_seconds", {**NODE_W1, "state": "crashed"}, "0 0 30x10")],
         "1m", {**NODE_W1, "state": "crashed", "severity": "warning"}, "gpu-node-01: SGLang crashed while serving",
         quiet_at="15s"),
    case("MoefleetHostUnfit",
         [series("moefleet_host_unfit", {**NODE_W1, "state": "unfit"}, "0 0 1x10"),
          series("moefleet_host_unfit", {**NODE_W1, "state": "hardware"}, "0x12")],
         "1m", {"host": "gpu-node-01", "state": "unfit", "severity": "critical"},
         "gpu-node-01: taken out by the fault watcher (unfit)", quiet_at="15s"),
    case("MoefleetKVCacheFull",
         [series("sglang:token_usage", {**SGLANG_W1, "tp_rank": "0"}, "0.97x40"),
          series("sglang:token_usage", {**SGLANG_W1, "host": "gpu-node-02", "tp_rank": "0"}, "0.5x40")],
         "6m", {"host": "gpu-node-01", "severity": "warning"}, "gpu-node-01: KV cache 97% used", quiet_at="4m"),
    case("MoefleetQueueGrowing", [series("sglang:num_queue_reqs", {**SGLANG_W1, "tp_rank": "0"}, "0+1x80")],
         "15m", {"host": "gpu-node-01", "severity": "warning"},
         "gpu-node-01: 60 requests waiting, and more each minute", quiet_at="10m",
         quiet_inputs=[series("sglang:num_queue_reqs", {**SGLANG_W1, "tp_rank": "0"}, "40x80")]),
    # Every first token between 200 and 400 s (p99 398 s): requests wait. Quiet: agent prompts whose prefill takes
    # 100 to 200 s (p99 199 s), a healthy host's long-prompt traffic.
    case("MoefleetTTFTAboveSLO",
         [series("sglang:time_to_first_token_seconds_bucket", {**SGLANG_W1, "le": "200"}, "0x100"),
          series("sglang:time_to_first_token_seconds_bucket", {**SGLANG_W1, "le": "400"}, "0+10x100"),
          series("sglang:time_to_first_token_seconds_bucket", {**SGLANG_W1, "le": "+Inf"}, "0+10x100")],
         "16m", {"host": "gpu-node-01", "severity": "warning"}, "gpu-node-01: p99 time to first token 6m 38s",
         quiet_at="5m",
         quiet_inputs=[series("sglang:time_to_first_token_seconds_bucket", {**SGLANG_W1, "le": "100"}, "0x100"),
                       series("sglang:time_to_first_token_seconds_bucket", {**SGLANG_W1, "le": "200"}, "0+10x100"),
                       series("sglang:time_to_first_token_seconds_bucket", {**SGLANG_W1, "le": "+Inf"},
                              "0+10x100")]),
    # Gaps between 1 and 2 s (p99 1.99 s): streams stall. Quiet: gaps of 0.4 to 0.6 s, the prefill chunks of long
    # prompts between decode steps.
    case("MoefleetITLAboveSLO",
         [series("sglang:inter_token_latency_seconds_bucket", {**SGLANG_W1, "le": "1"}, "0x100"),
          series("sglang:inter_token_latency_seconds_bucket", {**SGLANG_W1, "le": "2"}, "0+10x100"),
          series("sglang:inter_token_latency_seconds_bucket", {**SGLANG_W1, "le": "+Inf"}, "0+10x100")],
         "16m", {"host": "gpu-node-01", "severity": "warning"}, "gpu-node-01: p99 time between tokens 1.99s",
         quiet_at="5m",
         quiet_inputs=[series("sglang:inter_token_latency_seconds_bucket", {**SGLANG_W1, "le": "0.4"}, "0x100"),
                       series("sglang:inter_token_latency_seconds_bucket", {**SGLANG_W1, "le": "0.6"}, "0+10x100"),
                       series("sglang:inter_token_latency_seconds_bucket", {**SGLANG_W1, "le": "+Inf"},
                              "0+10x100")]),
    case("MoefleetGatewayDown", [series("up", GATEWAY, "1 0x20")], "2m", {**GATEWAY, "severity": "critical"},
         "gateway-01: the model gateway does not answer its metrics scrape", quiet_at="30s"),
    case("MoefleetGatewayWorkerUnhealthy",
         [series("smg_worker_health", {**GATEWAY, "worker": "http://10.0.0.11:30000"}, "1 1 0x20")], "2m",
         {**GATEWAY, "worker": "http://10.0.0.11:30000", "severity": "warning"},
         "gateway-01: the gateway finds worker http://10.0.0.11:30000 unhealthy", quiet_at="45s"),
    case("MoefleetGatewayCircuitOpen",
         [series("smg_worker_cb_state", {**GATEWAY, "worker": "http://10.0.0.11:30000"}, "0 1x10")], "1m",
         {**GATEWAY, "worker": "http://10.0.0.11:30000", "severity": "warning"},
         "gateway-01: the gateway's circuit breaker for http://10.0.0.11:30000 is open", quiet_at="0s",
         quiet_inputs=[series("smg_worker_cb_state", {**GATEWAY, "worker": "http://10.0.0.11:30000"}, "0 2x10")]),
    # A new Xid that makes the host unfit (host_faults.XID) pages, for monitoring_server_xid_window (10 m) ...
    case("MoefleetGPUXid", [series("DCGM_FI_DEV_XID_ERRORS", GPU3, "0 0 79x60")], "1m",
         {**GPU3, "severity": "critical"}, "gpu-node-01: GPU 3 reported Xid 79", quiet_at="15s",
         # a record-only Xid (43: the application hit a fault, the GPU stays healthy) never pages
         quiet_inputs=[series("DCGM_FI_DEV_XID_ERRORS", GPU3, "0 0 43x60")]),
    # ... and stops while the value, the last Xid since boot, stays until the reboot; one seen at the collector's
    # first scrape (logged before it ran) is no new event.
    case("MoefleetGPUXid", [series("DCGM_FI_DEV_XID_ERRORS", GPU3, "0 0 79x60")], "10m",
         {**GPU3, "severity": "critical"}, "gpu-node-01: GPU 3 reported Xid 79", quiet_at="11m",
         quiet_inputs=[series("DCGM_FI_DEV_XID_ERRORS", GPU3, "79x60")]),
    # Xid 13 then 79 on the same GPU: the unfit one pages.
    case("MoefleetGPUXid", [series("DCGM_FI_DEV_XID_ERRORS", GPU3, "0 13x4 79x60")], "2m",
         {**GPU3, "severity": "critical"}, "gpu-node-01: GPU 3 reported Xid 79", quiet_at="30s"),
    # Record-only and RESTART_APP codes (SGLang ends, systemd restarts it) are info: shown, sent nowhere.
    case("MoefleetGPUXidRecorded", [series("DCGM_FI_DEV_XID_ERRORS", GPU3, "0 0 13x60")], "1m",
         {**GPU3, "severity": "info"}, "gpu-node-01: GPU 3 reported Xid 13 (recorded only)", quiet_at="11m",
         quiet_inputs=[series("DCGM_FI_DEV_XID_ERRORS", GPU3, "0 0 79x60")]),
    case("MoefleetGPUHot", [series("DCGM_FI_DEV_GPU_TEMP", GPU3, "90x40")], "6m", {**GPU3, "severity": "warning"},
         "gpu-node-01: GPU 3 at 90 °C", quiet_at="4m",
         quiet_inputs=[series("DCGM_FI_DEV_GPU_TEMP", GPU3, "80x40")]),
    case("MoefleetPCIeReplays", [series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU3, "0 0 0 5x40")], "2m",
         {**GPU3, "severity": "warning"}, "gpu-node-01: PCIe replays on GPU 3", quiet_at="30s",
         quiet_inputs=[series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU3, "5x40")]),
    case("MoefleetGPUCollectorFailing", [series("moefleet_gpu_collector_success", NODE_W1, "1 0x20")], "3m",
         {**NODE_W1, "severity": "warning"}, "gpu-node-01: nvidia-smi does not answer", quiet_at="1m"),
]


def rule_descriptions(rules_file: Path) -> dict[str, str]:
    rules = yaml.safe_load(rules_file.read_text())
    out = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            description = rule["annotations"]["description"]
            assert "{{" not in description, f"{rule['alert']}: descriptions are the same for every alert"
            out[rule["alert"]] = description
    return out


def rule_tests(descriptions: dict[str, str]) -> list[dict]:
    tests = []
    for alert, inputs, fires_at, labels, summary, quiet_at, quiet_inputs in CASES:
        fired = [{"exp_labels": labels, "exp_annotations": {"summary": summary, "description": descriptions[alert]}}]
        checks = [{"eval_time": fires_at, "alertname": alert, "exp_alerts": fired}]
        if quiet_at:
            checks.append({"eval_time": quiet_at, "alertname": alert, "exp_alerts": []})
        tests.append({"interval": "15s", "input_series": inputs, "alert_rule_test": checks})
        if quiet_inputs:
            tests.append({"interval": "15s", "input_series": quiet_inputs,
                          "alert_rule_test": [{"eval_time": fires_at, "alertname": alert, "exp_alerts": []}]})
    return tests


def test_every_alert_rule_has_a_test():
    rules_template = (ROOT / "roles" / "monitoring_server" / "templates" / "prometheus" / "moefleet.rules.yml.j2")
    alerts = {line.split(":", 1)[1].strip() for line in rules_template.read_text().splitlines()
              if line.strip().startswith("- alert:")}
    assert alerts == {c[0] for c in CASES}


def test_every_alert_fires_when_it_should_and_not_otherwise(exported):
    rules = exported / "moefleet-rules" / "moefleet.rules.yml"
    test_file = exported / "moefleet.rules.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "15s",
                                         "tests": rule_tests(rule_descriptions(rules))}, sort_keys=False))
    result = promtool.run("test", "rules", test_file)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_promtool_test_rules_fails_on_a_wrong_expectation(exported):
    """The judge can say no: the worker-down case expecting its alert before its `for` has passed."""
    rules = exported / "moefleet-rules" / "moefleet.rules.yml"
    alert, inputs, _, labels, summary, _, _ = CASES[0]
    wrong = [{"interval": "15s", "input_series": inputs, "alert_rule_test": [{
        "eval_time": "45s", "alertname": alert,
        "exp_alerts": [{"exp_labels": labels, "exp_annotations": {"summary": summary}}]}]}]
    test_file = exported / "wrong.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(rules)], "tests": wrong}))
    assert promtool.run("test", "rules", test_file).returncode != 0


def test_alertmanager_inhibits_a_host_in_maintenance_and_pages_for_warning_and_critical_only(exported):
    """amtool is not on the controller (the role validates with it on the monitoring host): the configuration read.
    While MoefleetInMaintenance fires for a host, its warning and critical alerts are inhibited (equal on host, a
    label every tested warning and critical alert has); info and none go to a receiver that sends nothing."""
    config = yaml.safe_load((exported / "alertmanager.yml").read_text())
    assert config["inhibit_rules"] == [{"source_matchers": ['alertname="MoefleetInMaintenance"'],
                                        "target_matchers": ['severity=~"warning|critical"'], "equal": ["host"]}]
    paging = [c for c in CASES if c[3]["severity"] in ("warning", "critical")]
    assert paging and all("host" in c[3] for c in paging)
    assert {c[3]["severity"] for c in CASES if c[0] == "MoefleetInMaintenance"} == {"none"}
    receivers = {r["name"]: r for r in config["receivers"]}
    shown = config["route"]["routes"]
    assert shown == [{"receiver": "moefleet-shown-only", "matchers": ['severity=~"info|none"']}]
    assert receivers["moefleet-shown-only"] == {"name": "moefleet-shown-only"}
    assert config["route"]["receiver"] == "moefleet"


# ------------------------------------------------------------------------------------------------- dashboards
def test_the_dashboards_json_is_what_build_py_writes():
    result = subprocess.run([sys.executable, str(DASHBOARDS / "build.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", ["moefleet-fleet.json", "moefleet-host.json", "moefleet-gateway.json"])
def test_a_dashboard_asks_for_its_datasource_and_every_panel_has_queries(exported, name):
    board = json.loads((exported / "moefleet-dashboards" / name).read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert board["panels"]
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"] and t["datasource"]["uid"] == "${datasource}"
                                        for t in panel["targets"]), panel["title"]
    for used in {v for v in ("$host",) if v in json.dumps(board["panels"])}:
        assert used[1:] in variables, f"{name} uses {used} without defining it"


def test_scrape_targets_follow_each_hosts_settings():
    """A worker bound to every address is scraped at its ansible_host, one with metrics off is not scraped on its
    serving port, one running dcgm-exporter gets a dcgm target, an IPv6 address is bracketed, and a host in two
    groups has one node target."""
    from ansible_collections.moefleet.serving.plugins.filter.moefleet import scrape_targets

    defaults = {"sglang_service_metrics": True, "sglang_service_host": "127.0.0.1", "sglang_service_port": 30000,
                "sglang_router_prometheus_port": 29000, "node_metrics_port": 9100,
                "node_metrics_gpu_collector": "nvidia-smi", "node_metrics_dcgm_port": 9400}
    hostvars = {
        "w1": {"ansible_host": "10.0.0.1", "sglang_service_host": "0.0.0.0"},
        "w2": {"ansible_host": "fd00::2", "sglang_service_host": "fd00::2", "node_metrics_gpu_collector": "dcgm"},
        "w3": {"ansible_host": "10.0.0.3", "sglang_service_metrics": "false"},
        "w4": {"ansible_host": "10.0.0.4"},
        "gw": {"ansible_host": "10.0.0.9", "sglang_router_prometheus_port": 29100},
    }
    got = scrape_targets(hostvars, ["w1", "w2", "w3", "w4"], ["gw"], ["gw"], defaults)
    assert [t["targets"][0] for t in got["sglang"]] == ["10.0.0.1:30000", "[fd00::2]:30000", "10.0.0.4:30000"]
    assert got["unreachable"] == ["w4"]  # bound to the loopback by the role's default
    assert got["dcgm"] == [{"targets": ["[fd00::2]:9400"], "labels": {"host": "w2", "role": "worker"}}]
    assert got["smg"] == [{"targets": ["10.0.0.9:29100"], "labels": {"host": "gw", "role": "gateway"}}]
    assert [(t["labels"]["host"], t["labels"]["role"]) for t in got["node"]] == [
        ("w1", "worker"), ("w2", "worker"), ("w3", "worker"), ("w4", "worker"), ("gw", "gateway")]
