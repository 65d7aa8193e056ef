"""moefleet status (outcome column, drift line, exit codes, --limit, times in UTC) and moefleet history HOST, with
the runner mocked and fixture documents shaped as the hosts write them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from ansible_collections.moefleet.serving.plugins.module_utils.host_state import host_outcome, status_entry

from moefleet import cli, runner
from moefleet.commands import _common, history, status

ROOT = Path(__file__).resolve().parents[2]
STATUS_SCHEMA = json.loads((ROOT / "schemas" / "status.schema.json").read_text())
HISTORY_SCHEMA = json.loads((ROOT / "schemas" / "history.schema.json").read_text())
T0 = "2026-12-01T07:01:02+00:00"
T1 = "2026-12-01T07:03:12+00:00"


def facts(asked: str, serving: str | None, outcome: str, **more) -> dict:
    return {"asked_profile": asked, "serving_profile": serving, "outcome": outcome, "updated": T1,
            "last_rollback": None} | more


def entry(host: str, local: dict | None, health_code: int | None = 200, reachable: bool = True) -> dict:
    unit = "active" if health_code == 200 else "failed"
    return status_entry(host, reachable, local, {}, unit, health_code, {"tp_size": 8})


@pytest.mark.parametrize(("health", "recorded", "serving", "asked", "state"), [
    ("serving", "ready", "ep8", "ep8", "ready"),
    ("serving", "ready", "tp8", "ep8", "degraded"),  # facts older than what serves: not what was asked
    ("serving", "degraded", "tp8", "ep8", "degraded"),
    ("serving", "restored", "tp8", "ep8", "restored"),
    ("down", "restored", "tp8", "ep8", "down"),
    ("starting", "ready", "ep8", "ep8", "down"),
    ("down", "failed", None, "ep8", "failed"),
    ("unreachable", "ready", "ep8", "ep8", "unknown"),
    ("serving", None, None, None, "unknown"),  # serves, but moefleet never recorded what it was asked
])
def test_host_outcome(health, recorded, serving, asked, state):
    assert host_outcome(health, recorded, serving, asked) == state


def fleet() -> list[dict]:
    return [
        entry("lab-1", facts("ep8", "ep8", "ready")),
        entry("lab-2", facts("ep8", "tp8", "restored", last_rollback={
            "time": "2026-12-01T07:03:12.123456", "from": "ep8", "to": "tp8", "reason": "ep8 ran out of memory"})),
        entry("lab-3", facts("ep8", "ep8", "ready")),
    ]


class FakeStatus:
    def __init__(self, hosts: list[dict] | None, events=(), rc: int = 0):
        self.hosts, self.events, self.rc = hosts, list(events), rc
        self.calls: list[dict] = []

    def __call__(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None):
        runner.inventory_path(inventory)
        self.calls.append({"name": name, "inventory": inventory, "limit": limit})
        for item in self.events:
            on_event(item)
        if self.hosts is not None:
            Path(extravars["moefleet_status_path"]).write_text(json.dumps({"hosts": self.hosts}))
        return runner.RunResult("successful" if self.rc == 0 else "failed", self.rc)


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text("all: {}\n")
    return path


def test_fixture_documents_validate():
    jsonschema.validate({"hosts": fleet()}, STATUS_SCHEMA)


def test_restored_host_is_drift_exit_1_with_outcome_column_and_summary(monkeypatch, inventory, capsys):
    monkeypatch.setattr(runner, "run_playbook", FakeStatus(fleet()))
    assert cli.main(["status", "-i", str(inventory)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["host", "serving", "asked", "outcome", "health"]
    assert lines[3].split()[:5] == ["lab-2", "tp8", "ep8", "restored", "serving"]
    assert "2026-12-01 07:03:12 UTC* ep8 -> tp8 (ep8 ran out of memory)" in lines[3]
    assert lines[-2].startswith("* recorded without a time zone")
    assert lines[-1] == "2 of 3 hosts serve what they were asked; lab-2 restored to tp8 (asked ep8)"


def test_every_host_as_asked_exits_0(monkeypatch, inventory, capsys):
    hosts = [entry("lab-1", facts("ep8", "ep8", "ready", last_rollback={
        "time": T0, "from": "ep8", "to": "ep8", "reason": "retuned"}))]
    monkeypatch.setattr(runner, "run_playbook", FakeStatus(hosts))
    assert cli.main(["status", "-i", str(inventory)]) == 0
    out = capsys.readouterr().out
    assert "2026-12-01 07:01:02 UTC ep8 -> ep8" in out and "UTC*" not in out and "recorded without" not in out
    assert out.splitlines()[-1] == "1 of 1 host serves what it was asked."


def test_unreachable_host_exits_3_before_drift(monkeypatch, inventory, capsys):
    hosts = [*fleet(), entry("lab-4", facts("ep8", "ep8", "ready"), None, reachable=False)]
    monkeypatch.setattr(runner, "run_playbook", FakeStatus(hosts))
    assert cli.main(["status", "-i", str(inventory), "--json"]) == 3
    document = json.loads(capsys.readouterr().out)
    jsonschema.validate(document, STATUS_SCHEMA)
    assert [h["state"] for h in document["hosts"]] == ["ready", "restored", "ready", "unknown"]


def test_down_and_failed_hosts_are_named_in_the_summary(monkeypatch, inventory, capsys):
    hosts = [entry("lab-1", facts("ep8", "ep8", "ready"), None), entry("lab-2", facts("ep8", None, "failed"), None),
             entry("lab-3", None)]
    monkeypatch.setattr(runner, "run_playbook", FakeStatus(hosts))
    assert cli.main(["status", "-i", str(inventory)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "0 of 3 hosts serve what they were asked; lab-1 down (asked ep8, unit failed); lab-2 failed (asked ep8, "
        "serves nothing); lab-3 has no moefleet facts (never deployed by moefleet?)")


def test_limit_reaches_ansible_and_inventory_defaults_to_ansible_cfgs(monkeypatch, inventory, capsys):
    fake = FakeStatus(fleet()[:1])
    monkeypatch.setattr(runner, "run_playbook", fake)
    monkeypatch.setattr(runner, "default_inventories", lambda: [inventory])  # the lab's exists only while it is up
    assert cli.main(["status", "--limit", "lab-1"]) == 0
    assert fake.calls == [{"name": "status.yml", "inventory": None, "limit": "lab-1"}]


def test_a_limit_that_matches_nothing_is_bad_input(monkeypatch, inventory, capsys):
    monkeypatch.setattr(runner, "run_playbook", FakeStatus(None, rc=1))
    assert cli.main(["status", "-i", str(inventory), "-l", "nope"]) == 2
    assert "--limit nope" in capsys.readouterr().err


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("0 only when every host serves what it was asked", "1 when a host drifted", "2 on input errors",
                  "3 when a host was unreachable", "--limit"):
        assert words in text
    for words in ("0 only when every host", "1 when a host drifted", "2 on input errors", "3 when a host was"):
        assert words in STATUS_SCHEMA["description"]


@pytest.mark.parametrize(("value", "text"), [
    ("2026-12-01T07:03:12+00:00", "2026-12-01 07:03:12 UTC"),
    ("2026-12-01T07:03:12.5Z", "2026-12-01 07:03:12 UTC"),
    ("2026-12-01T08:03:12+01:00", "2026-12-01 07:03:12 UTC"),
    ("2026-12-01T07:03:12.123456", "2026-12-01 07:03:12 UTC*"),  # legacy: no zone recorded
    (None, "-"),
    ("yesterday", "yesterday"),
])
def test_times_are_printed_in_utc_with_the_zone(value, text):
    assert _common.utc_text(value) == text


def test_the_role_writes_times_with_their_zone():
    for name in ("start.yml", "record.yml"):
        text = (ROOT / "roles" / "sglang_service" / "tasks" / name).read_text()
        assert "now(utc=true).isoformat()" not in text
        assert "now(utc=true, fmt='%Y-%m-%dT%H:%M:%S+00:00')" in text


# -- history -----------------------------------------------------------------------------------------------

LOCAL = {
    "moefleet": facts("ep8", "tp8", "restored", attempt={"profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p"},
                      last_rollback={"time": "2026-12-01T07:04:00+00:00", "from": "ep8", "to": "tp8",
                                     "reason": "the ladder ended; restored the last unit that served"},
                      history=[
        {"time": "2026-11-30T09:00:00.5", "profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p",
         "outcome": "ready", "phase": None, "cause": None},
        {"time": T0, "profile": "ep8", "tuning": {}, "nccl_set": "pcie_p2p", "outcome": "oom",
         "phase": "kv_cache", "cause": None},
        {"time": T1, "profile": "ep8", "tuning": {"mem_fraction_static": 0.833}, "nccl_set": "pcie_p2p",
         "outcome": "oom", "phase": "kv_cache", "cause": None},
    ]),
    "moefleet_runtime": {"ooms": 1, "failures": [
        {"time": "2026-11-30T12:00:00.000001+00:00", "state": "oom", "phase": "runtime", "cause": None,
         "attempt": {"profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p"}}]},
}


class FakeAdhoc:
    def __init__(self, ok=None, unreachable=None):
        self.ok, self.unreachable = ok or {}, unreachable or {}
        self.calls: list[tuple] = []

    def __call__(self, module, module_args, inventory, pattern, limit=None, extravars=None, vault=None):
        self.calls.append((module, module_args, inventory, pattern))
        return runner.AdhocResult(self.ok, self.unreachable, {}, "successful", 0)


def test_history_is_a_timeline_oldest_first(monkeypatch, capsys):
    fake = FakeAdhoc({"lab-2": {"ansible_facts": {"ansible_local": LOCAL}}})
    monkeypatch.setattr(runner, "run_adhoc", fake)
    assert cli.main(["history", "lab-2"]) == 0
    assert fake.calls == [("ansible.builtin.setup", history.LOCAL_FACTS_ONLY, None, "lab-2")]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "lab-2: asked ep8, serving tp8, outcome restored (recorded 2026-12-01 07:03:12 UTC)"
    assert lines[1].split() == ["time", "kind", "profile", "tuning", "nccl", "outcome", "phase", "cause"]
    rows = [line.split() for line in lines[3:8]]
    assert [r[2] for r in rows] == ["UTC*", "UTC", "UTC", "UTC", "UTC"]
    assert [r[3] for r in rows] == ["start", "while", "start", "start", "restore"]
    assert rows[3][:8] == ["2026-12-01", "07:03:12", "UTC", "start", "ep8", "mem_fraction_static=0.833",
                           "pcie_p2p", "oom"]
    assert lines[4].split()[2:10] == ["UTC", "while", "serving", "tp8", "-", "pcie_p2p", "oom", "runtime"]
    assert lines[7].split()[:8] == ["2026-12-01", "07:04:00", "UTC", "restore", "tp8", "-", "pcie_p2p", "ready"]
    assert lines[-1].startswith("* recorded without a time zone")


def test_history_json_validates(monkeypatch, capsys):
    monkeypatch.setattr(runner, "run_adhoc", FakeAdhoc({"lab-2": {"ansible_facts": {"ansible_local": LOCAL}}}))
    assert cli.main(["history", "lab-2", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    jsonschema.validate(document, HISTORY_SCHEMA)
    assert [(s["kind"], s["profile"], s["outcome"]) for s in document["starts"]] == [
        ("start", "tp8", "ready"), ("while serving", "tp8", "oom"), ("start", "ep8", "oom"),
        ("start", "ep8", "oom"), ("restore", "tp8", "ready")]


@pytest.mark.parametrize(("fake", "code", "words"), [
    (FakeAdhoc(unreachable={"lab-2": "no route"}), 3, "lab-2 is unreachable (no route)"),
    (FakeAdhoc(), 2, "lab-2 is not a host of the inventory"),
    (FakeAdhoc({"lab-2": {"ansible_facts": {"ansible_local": {}}}}), 1, "no moefleet local facts"),
])
def test_history_exit_codes(monkeypatch, capsys, fake, code, words):
    monkeypatch.setattr(runner, "run_adhoc", fake)
    assert cli.main(["history", "lab-2"]) == code
    assert words in capsys.readouterr().err


def test_history_unknown_inventory_is_bad_input(tmp_path, capsys):
    assert cli.main(["history", "lab-2", "-i", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_status_and_history_share_the_time_and_target_code():
    assert status.utc_text is _common.utc_text and history.utc_text is _common.utc_text


class FakeProbe(FakeStatus):
    """status.yml with -e moefleet_status_probe=true: each host's sglang_answers result goes into its entry."""

    def __init__(self, answers: dict[str, dict]):
        super().__init__(None)
        self.answers, self.extravars = answers, None

    def __call__(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None):
        self.extravars = dict(extravars)
        probed = extravars.get("moefleet_status_probe") is True
        self.hosts = [status_entry(h, True, facts("ep8", "ep8", "ready"), {}, "active", 200, {"tp_size": 8},
                                   answers=a if probed else None) for h, a in self.answers.items()]
        return super().__call__(name, inventory, extravars, on_event, notice, limit, vault)


GOOD = {"passed": True, "failed_check": None, "evidence": None, "checks": []}
BAD = {"passed": False, "failed_check": "thinking", "evidence": "content is garbage, a run of '!': '!!!!!!!!'"}


def test_probe_asks_the_playbook_for_the_gate_and_a_wrong_answer_is_drift(monkeypatch, inventory, capsys):
    fake = FakeProbe({"lab-1": GOOD, "lab-2": BAD})
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["status", "-i", str(inventory), "--probe"]) == 1
    assert fake.extravars["moefleet_status_probe"] is True
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == ("1 of 2 hosts serve what they were asked; lab-2 answers wrongly (check thinking "
                                    "failed: content is garbage, a run of '!': '!!!!!!!!')")
    assert cli.main(["status", "-i", str(inventory), "--probe", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    jsonschema.validate(document, STATUS_SCHEMA)
    assert [(h["health"], h["state"], h["answers"]["passed"]) for h in document["hosts"]] == [
        ("serving", "ready", True), ("wrong_output", "down", False)]


def test_without_probe_nothing_is_asked_and_entries_have_no_answers(monkeypatch, inventory, capsys):
    fake = FakeProbe({"lab-1": BAD})
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["status", "-i", str(inventory), "--json"]) == 0
    assert "moefleet_status_probe" not in fake.extravars
    assert "answers" not in json.loads(capsys.readouterr().out)["hosts"][0]


def prometheus_answers(vectors: dict[str, list[tuple[str, str]]]) -> list[dict]:
    """status.yml's uri results of host_state.LIVE_QUERIES: {figure: [(host, value as Prometheus writes it)]}."""
    return [{"item": {"key": figure, "value": "url"}, "json": {"status": "success", "data": {
        "resultType": "vector", "result": [{"metric": {"host": h}, "value": [1764662400.0, v]} for h, v in series]}}}
        for figure, series in vectors.items()]


class FakeLive(FakeStatus):
    """status.yml with Prometheus: live figures in each entry, and where Prometheus and the dashboards are."""

    def __call__(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None):
        answers = prometheus_answers({"running_requests": [("lab-1", "3"), ("lab-2", "0")],
                                      "kv_usage": [("lab-1", "0.412")],
                                      "ttft_p99_seconds": [("lab-1", "0.8"), ("lab-2", "NaN")]})
        from ansible_collections.moefleet.serving.plugins.filter.moefleet import status_entry as entry_filter
        hosts = [entry_filter(h, True, facts("ep8", "ep8", "ready"), {}, "active", 200, {"tp_size": 8}, live=answers)
                 for h in ("lab-1", "lab-2", "lab-3")]
        Path(extravars["moefleet_status_path"]).write_text(json.dumps({"hosts": hosts, "monitoring": {
            "prometheus": "http://10.0.0.10:9090", "dashboards": "gateway-01:/etc/prometheus/moefleet-dashboards"}}))
        return runner.RunResult("successful", 0)


def test_with_prometheus_each_host_shows_its_live_figures_and_where_the_dashboards_are(monkeypatch, inventory,
                                                                                       capsys):
    monkeypatch.setattr(runner, "run_playbook", FakeLive(None))
    assert cli.main(["status", "-i", str(inventory)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "running / KV / TTFT p99" in lines[0]
    assert "3 / 41% / 0.80 s" in lines[2]
    assert "0 / - / -" in lines[3]  # no KV series, and a p99 without requests (NaN) is no figure
    assert lines[4].split()[0] == "lab-3" and " - " in lines[4]  # Prometheus has nothing for it
    assert lines[-1] == ("Live figures from Prometheus at http://10.0.0.10:9090; dashboards to import into Grafana: "
                         "gateway-01:/etc/prometheus/moefleet-dashboards.")
    assert cli.main(["status", "-i", str(inventory), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    jsonschema.validate(document, STATUS_SCHEMA)
    assert document["hosts"][0]["live"] == {"running_requests": 3.0, "kv_usage": 0.412, "ttft_p99_seconds": 0.8}
    assert "live" not in json.loads(json.dumps(fleet()[0]))  # without Prometheus: no live figures at all


def test_the_live_queries_are_instant_queries_of_the_prometheus_given():
    from ansible_collections.moefleet.serving.plugins.filter.moefleet import live_query_urls
    urls = live_query_urls("http://10.0.0.10:9090/")
    assert set(urls) == {"running_requests", "kv_usage", "ttft_p99_seconds"}
    assert urls["kv_usage"] == ("http://10.0.0.10:9090/api/v1/query?query=max+by+%28host%29+%28sglang%3Atoken_usage%29")


def test_a_host_the_fault_watcher_took_out_is_unhealthy_with_the_reason(monkeypatch, inventory, capsys):
    record = {"state": "unfit", "reason": "gpu 3: Xid 79 GPU has fallen off the bus",
              "since": "2026-12-01T07:10:00+00:00",
              "events": [{"code": 79}], "remediations": []}
    held = dict(record, state="hardware", reason="needs hardware attention: fault back after the remediation")
    hosts = [entry("lab-1", facts("ep8", "ep8", "ready")),
             status_entry("lab-2", True, facts("ep8", "ep8", "ready"), {}, "inactive", None, {}, fault=record),
             status_entry("lab-3", True, facts("ep8", "ep8", "ready"), {}, "inactive", None, {}, fault=held),
             status_entry("lab-4", True, facts("ep8", "ep8", "ready"), {}, "active", 200, {"tp_size": 8},
                          fault={"state": "healthy", "events": [{"code": 13}]})]
    jsonschema.validate({"hosts": hosts}, STATUS_SCHEMA)
    assert [h["state"] for h in hosts] == ["ready", "unhealthy", "unhealthy", "ready"]
    assert "fault" not in hosts[3]
    monkeypatch.setattr(runner, "run_playbook", FakeStatus(hosts))
    assert cli.main(["status", "-i", str(inventory)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split()[:6] == ["lab-2", "ep8", "ep8", "unhealthy", "(gpu", "3:"]
    assert [c.strip() for c in lines[3].split("  ") if c.strip()][3:5] == [
        "unhealthy (gpu 3: Xid 79 GPU has fallen off the bus)", "down"]
    assert lines[-1] == (
        "2 of 4 hosts serve what they were asked; lab-2 is unhealthy since 2026-12-01 07:10:00 UTC (gpu 3: Xid 79 GPU "
        "has fallen off the bus): run moefleet remediate; lab-3 is unhealthy since 2026-12-01 07:10:00 UTC (needs "
        "hardware attention: fault back after the remediation): it needs hardware attention")
