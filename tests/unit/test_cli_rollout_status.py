"""moefleet rollout and moefleet status: argument parsing, progress lines and exit codes, with the runner mocked."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from moefleet import cli, collection, runner
from moefleet.commands import rollout, status


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text("all: {}\n")
    return path


def event(kind: str, host: str = "", task: str = "", role: str = "", res: dict | None = None, **data) -> dict:
    return {"event": kind, "event_data": {"host": host, "task": task, "role": role, "res": res or {}, **data}}


def host_row(host: str, outcome: str, serving: str | None = "ep8") -> dict:
    return {"host": host, "asked_profile": "ep8", "serving_profile": serving, "outcome": outcome, "ooms": 0,
            "seconds": 1.0, "message": ""}


class FakeRun:
    """Stands in for runner.run_playbook: feeds events, writes the report the callback would write."""

    def __init__(self, events=(), report: dict | None = None, result: runner.RunResult | None = None):
        self.events = list(events)
        self.report = report
        self.result = result or runner.RunResult(status="successful", rc=0)
        self.calls: list[tuple] = []

    def __call__(self, name, inventory, extravars=None, on_event=None, notice=print):
        runner.inventory_path(inventory)
        self.calls.append((name, inventory, dict(extravars or {})))
        for item in self.events:
            on_event(item)
        if self.report is not None and "moefleet_report_path" in (extravars or {}):
            base = Path(extravars["moefleet_report_path"])
            base.parent.mkdir(parents=True, exist_ok=True)
            base.with_name(base.name + ".json").write_text(json.dumps(self.report))
            base.with_name(base.name + ".md").write_text("| host | outcome |\n")
        if self.report is not None and "moefleet_status_path" in (extravars or {}):
            Path(extravars["moefleet_status_path"]).write_text(json.dumps(self.report))
        return self.result


# -- -e parsing ------------------------------------------------------------------------------------------


def test_extra_vars_merge_key_value_json_and_files(tmp_path):
    extra_file = tmp_path / "vars.yml"
    extra_file.write_text("moefleet_serial: [1, 2]\n")
    parsed = rollout.parse_extra_vars(
        ["profile=ep8 confirm=yes", '{"sim_faults": [{"fault": "oom_weight_load"}]}', f"@{extra_file}", "x='a b'"]
    )
    assert parsed == {
        "profile": "ep8",
        "confirm": "yes",
        "sim_faults": [{"fault": "oom_weight_load"}],
        "moefleet_serial": [1, 2],
        "x": "a b",
    }


@pytest.mark.parametrize("value", ["profile", "=ep8", "1x=2", "{not json", "[1, 2]", "@/nonexistent/vars.yml", ""])
def test_bad_extra_vars_are_bad_input(value):
    with pytest.raises(runner.BadInput):
        rollout.parse_extra_vars([value])


def test_rollout_requires_an_inventory(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["rollout", "-e", "profile=ep8"])
    assert exc.value.code == 2


# -- progress ------------------------------------------------------------------------------------------


def lines_for(events) -> list[str]:
    out = io.StringIO()
    progress = rollout.Progress(out=out, clock=lambda: time.gmtime(0))
    for item in events:
        progress(item)
    return [line.split(None, 1)[1] for line in out.getvalue().splitlines()]


def phase(name: str, reason: str = "") -> dict:
    return {"ansible_facts": {"sglang_service_phase": name, "sglang_service_phase_reason": reason}}


# Task names are arbitrary here: the progress reads the documented facts only (sglang_service_phase, _outcome).
ROLLBACK_RUN = [
    event("playbook_on_play_start", play_pattern="localhost"),
    event("runner_on_start", "localhost", "any task"),
    event("runner_on_start", "lab-1", "any task"),
    event("runner_on_start", "lab-1", "Gathering Facts"),
    event("runner_on_ok", "lab-1", "any task", res=phase("installing")),
    event("runner_on_start", "lab-1", "any task", role="nvidia_driver"),
    event("runner_on_ok", "lab-1", "any task", role="sglang_service", res=phase("loading")),
    event("runner_on_ok", "lab-1", "a readiness wait", role="sglang_service",
          res={"state": "oom", "phase": "weight_load", "msg": "ROLLBACK is no prefix anyone reads"}),
    event("runner_on_ok", "lab-1", "any task", role="sglang_service",
          res=phase("rolling back", "ep8 ran out of memory (weight_load); falling back to tp8.")),
    event("runner_on_ok", "lab-1", "a readiness wait", role="sglang_service", res={"state": "ready"}),
    event("runner_on_ok", "lab-1", "any task", role="sglang_service",
          res={"ansible_facts": {"sglang_service_outcome": {"outcome": "degraded", "serving_profile": "tp8"}}}),
    event("runner_on_ok", "lab-1", "any task", role="sglang_service", res=phase("done")),
    event("runner_on_failed", "lab-1", "any task", role="sglang_service", res={"msg": "lab-1 does not serve ep8"}),
]


def test_progress_one_line_per_state_change():
    assert [" ".join(line.split()) for line in lines_for(ROLLBACK_RUN)] == [
        "controller validating",
        "lab-1 validating",
        "lab-1 installing",
        "lab-1 loading",
        "lab-1 rolled back: ep8 ran out of memory (weight_load); falling back to tp8.",
        "lab-1 failed: lab-1 does not serve ep8",
    ]


def test_progress_ready_and_unreachable():
    lines = lines_for(
        [
            event("runner_on_ok", "lab-1", "any task", role="sglang_service", res=phase("loading")),
            event("runner_on_ok", "lab-1", "any task", role="sglang_service",
                  res={"ansible_facts": {"sglang_service_outcome": {"outcome": "ready", "serving_profile": "ep8"}}}),
            event("runner_on_unreachable", "lab-2", "Gathering Facts", res={"msg": "no route"}),
        ]
    )
    assert [" ".join(line.split()) for line in lines] == [
        "lab-1 loading",
        "lab-1 ready: serving ep8",
        "lab-2 unreachable: no route",
    ]


# -- rollout exit codes ----------------------------------------------------------------------------------


def test_rollout_complete_exits_0_and_prints_the_report(monkeypatch, inventory, tmp_path, capsys):
    report = {"result": "complete", "hosts": [host_row("lab-1", "ready"), host_row("lab-2", "ready")]}
    fake = FakeRun(report=report)
    monkeypatch.setattr(runner, "run_playbook", fake)
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--report", str(tmp_path / "r.json")])
    assert code == 0
    name, _, extravars = fake.calls[0]
    assert name == "rollout.yml"
    assert extravars == {"profile": "ep8", "moefleet_report_path": str(tmp_path / "r")}
    out = capsys.readouterr().out
    assert f"Report: {tmp_path / 'r'}.json and r.md" in out
    assert "| host | outcome |" in out


def test_rollout_default_report_path_is_under_reports(monkeypatch, inventory, tmp_path):
    monkeypatch.chdir(tmp_path)
    fake = FakeRun(report={"result": "complete", "hosts": []})
    monkeypatch.setattr(runner, "run_playbook", fake)
    cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8"])
    path = Path(fake.calls[0][2]["moefleet_report_path"])
    assert path.parent == tmp_path / "reports" and path.name.startswith("rollout-")


@pytest.mark.parametrize(
    "rows, result",
    [
        ([host_row("lab-1", "restored", "tp8"), host_row("lab-2", "untouched", "tp8")], "stopped"),
        ([host_row("lab-1", "degraded", "tp8"), host_row("lab-2", "ready")], "complete"),
        ([host_row("lab-1", "failed", None)], "stopped"),
    ],
)
def test_rollout_stopped_or_not_ready_exits_1(monkeypatch, inventory, tmp_path, rows, result):
    monkeypatch.setattr(runner, "run_playbook", FakeRun(report={"result": result, "hosts": rows}))
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--report", str(tmp_path / "r")]) == 1


def test_rollout_validation_failure_exits_2_with_the_sentence(monkeypatch, inventory, tmp_path, capsys):
    events = [
        event("playbook_on_play_start", play_pattern="localhost"),
        event("runner_on_failed", "localhost", "Validate the catalog and resolve each host's profile",
              res={"msg": "-e profile: unknown profile 'ep9'; valid names: ep8, tp8."}),
    ]
    report = {"result": "stopped", "hosts": [host_row("lab-1", "untouched", "tp8")]}
    result = runner.RunResult(status="failed", rc=2)
    monkeypatch.setattr(runner, "run_playbook", FakeRun(events, report, result))
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep9", "--report", str(tmp_path / "r")])
    assert code == 2
    assert "unknown profile 'ep9'; valid names: ep8, tp8." in capsys.readouterr().err


def test_rollout_failure_after_hosts_were_touched_is_not_bad_input(monkeypatch, inventory, tmp_path):
    report = {"result": "stopped", "hosts": [host_row("lab-1", "failed", None)]}
    events = ROLLBACK_RUN + [event("runner_on_failed", "localhost", "late", res={"msg": "x"})]
    monkeypatch.setattr(runner, "run_playbook", FakeRun(events, report, runner.RunResult("failed", 2)))
    assert cli.main(["rollout", "-i", str(inventory), "--report", str(tmp_path / "r")]) == 1


def test_rollout_interrupted_exits_130(monkeypatch, inventory, tmp_path, capsys):
    report = {"result": "stopped", "stopped_by": "stopped on request", "hosts": [host_row("lab-1", "ready")]}
    result = runner.RunResult(status="failed", rc=99, interrupted=True)
    monkeypatch.setattr(runner, "run_playbook", FakeRun(report=report, result=result))
    assert cli.main(["rollout", "-i", str(inventory), "--report", str(tmp_path / "r")]) == 130
    assert "Report:" in capsys.readouterr().out


def test_rollout_hard_stop_without_report_exits_130(monkeypatch, inventory, tmp_path, capsys):
    result = runner.RunResult(status="canceled", rc=254, interrupted=True, hard_stopped=True)
    monkeypatch.setattr(runner, "run_playbook", FakeRun(result=result))
    assert cli.main(["rollout", "-i", str(inventory), "--report", str(tmp_path / "r")]) == 130
    assert "no report" in capsys.readouterr().err


def test_rollout_unknown_inventory_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runner, "run_playbook", FakeRun())
    assert cli.main(["rollout", "-i", str(tmp_path / "missing.yml"), "-e", "profile=ep8"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_rollout_bad_extra_vars_exit_2_before_running(monkeypatch, inventory, capsys):
    fake = FakeRun()
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile"]) == 2
    assert fake.calls == []
    assert "is not KEY=VALUE" in capsys.readouterr().err


# -- status ----------------------------------------------------------------------------------------------


def status_doc(*health: str) -> dict:
    hosts = []
    for i, state in enumerate(health, 1):
        hosts.append(
            {"host": f"lab-{i}", "serving_profile": "tp8", "asked_profile": "ep8" if i == 1 else "tp8",
             "health": state, "server_args": {"tp_size": 8}, "outcome": "restored",
             "last_rollback": {"time": "2026-01-01T10:00:00.1", "from": "ep8", "to": "tp8", "reason": "OOM"}
             if i == 1 else None}
        )
    return {"hosts": hosts}


def test_status_table_and_exit_0_when_all_serve(monkeypatch, inventory, capsys):
    fake = FakeRun(report=status_doc("serving", "serving"))
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["status", "-i", str(inventory)]) == 0
    assert fake.calls[0][0] == "status.yml"
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["host", "serving", "asked", "health", "last", "rollback", "while", "serving"]
    assert lines[2].split() == ["lab-1", "tp8", "ep8", "serving", "2026-01-01", "10:00:00", "ep8", "->", "tp8", "(OOM)",
                                "-"]
    assert lines[3].split() == ["lab-2", "tp8", "tp8", "serving", "-", "-"]


def test_status_shows_the_runtime_ooms_the_exit_hook_recorded(monkeypatch, inventory, capsys):
    doc = status_doc("serving", "serving")
    doc["hosts"][1].update(runtime_ooms=2, last_runtime_failure={
        "time": "2026-01-02T03:04:05.6", "state": "oom", "phase": "runtime", "cause": None})
    monkeypatch.setattr(runner, "run_playbook", FakeRun(report=doc))
    assert cli.main(["status", "-i", str(inventory)]) == 0
    assert capsys.readouterr().out.splitlines()[3].endswith("2 OOM(s), last 2026-01-02 03:04:05 oom (runtime)")


def test_status_json_and_exit_1_when_one_does_not_serve(monkeypatch, inventory, capsys):
    monkeypatch.setattr(runner, "run_playbook", FakeRun(report=status_doc("serving", "down")))
    assert cli.main(["status", "-i", str(inventory), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == status_doc("serving", "down")


def test_status_without_document_exits_1(monkeypatch, inventory, capsys):
    events = [event("runner_on_unreachable", "lab-1", "Read", res={"msg": "no route"})]
    monkeypatch.setattr(runner, "run_playbook", FakeRun(events, None, runner.RunResult("failed", 4)))
    assert cli.main(["status", "-i", str(inventory)]) == 1
    assert "lab-1: no route" in capsys.readouterr().err


def test_status_unknown_inventory_exits_2(tmp_path, capsys):
    assert status.run(type("Args", (), {"inventory": str(tmp_path / "nope"), "json": False})()) == 2
    assert "does not exist" in capsys.readouterr().err


# -- runner ----------------------------------------------------------------------------------------------


def test_interrupt_first_asks_for_a_stop_then_cancels(tmp_path):
    notices: list[str] = []
    interrupt = runner.Interrupt(tmp_path / "stop", notices.append)
    interrupt(2, None)
    assert interrupt.requested and (tmp_path / "stop").exists() and not interrupt.cancel()
    interrupt(2, None)
    assert interrupt.cancel()
    assert notices == ["Stopping after the running task (a started rollback or restore runs to its end first); "
                       "press Ctrl-C again to stop now.", "Stopping now."]


def test_run_playbook_passes_what_ansible_runner_needs(monkeypatch, inventory):
    import ansible_runner

    seen: dict = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        assert kwargs["cancel_callback"]() is False
        kwargs["event_handler"]({"event": "playbook_on_start"})
        return type("R", (), {"status": "successful", "rc": 0, "stats": {"ok": {}}})()

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    got: list = []
    result = runner.run_playbook("status.yml", inventory, {"a": 1}, on_event=got.append)
    assert result == runner.RunResult(status="successful", rc=0, stats={"ok": {}})
    assert got == [{"event": "playbook_on_start"}]
    assert seen["project_dir"] == str(collection.ROOT)
    assert seen["playbook"] == str(collection.ROOT / "playbooks" / "status.yml")
    assert seen["inventory"] == str(inventory.resolve())
    assert seen["extravars"] == {"a": 1}
    assert seen["envvars"]["ANSIBLE_CONFIG"] == str(collection.ROOT / "ansible.cfg")
    assert seen["envvars"]["ANSIBLE_CALLBACKS_ENABLED"] == "moefleet.serving.moefleet_report"
    assert not Path(seen["private_data_dir"]).exists()  # a fresh one per run, removed afterwards
