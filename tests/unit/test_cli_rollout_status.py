"""moefleet rollout and moefleet status: argument parsing, progress lines and exit codes, with the runner mocked."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from moefleet import cli, collection, runner
from moefleet.commands import rollout, status

REAL_RUN_ADHOC = runner.run_adhoc  # the autouse fixture below stands in for it in every other test
REAL_RUN_PLAYBOOK = runner.run_playbook  # likewise


@pytest.fixture(autouse=True)
def no_hosts_to_confirm(monkeypatch):
    """rollout looks at the hosts before asking to restart them (runner.run_adhoc): none here unless a test says;
    and before that runs playbooks/validate.yml (runner.run_playbook), which passes here unless a test says."""
    monkeypatch.setattr(runner, "run_adhoc", FakeAdhoc({}))
    monkeypatch.setattr(runner, "run_playbook", FakeRun())


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
    """Stands in for runner.run_playbook: feeds events, writes the report the callback would write. The checks
    --check and the confirmation run first (playbooks/validate.yml) are kept apart, in ``validations``: they pass
    unless ``validate_events`` say otherwise."""

    def __init__(self, events=(), report: dict | None = None, result: runner.RunResult | None = None,
                 validate_events=(), validate_result: runner.RunResult | None = None):
        self.events = list(events)
        self.report = report
        self.result = result or runner.RunResult(status="successful", rc=0)
        self.validate_events = list(validate_events)
        self.validate_result = validate_result or runner.RunResult(status="successful", rc=0)
        self.calls: list[tuple] = []
        self.validations: list[tuple] = []

    def __call__(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None,
                 skip_tags=None):
        runner.inventory_path(inventory)
        if name == "validate.yml":
            self.validations.append((inventory, dict(extravars or {}), limit, vault))
            for item in self.validate_events:
                on_event(item)
            return self.validate_result
        self.calls.append((name, inventory, dict(extravars or {})))
        self.limits = [*getattr(self, "limits", []), limit]
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


def test_rollout_inventory_defaults_to_ansible_cfgs(monkeypatch, capsys):
    fake = FakeRun(report={"result": "complete", "hosts": []})
    monkeypatch.setattr(runner, "run_playbook", fake)
    monkeypatch.setattr(runner, "default_inventories",
                        lambda: [collection.ROOT / "inventory" / "sim" / "group_vars"])
    cli.main(["rollout", "-e", "profile=ep8", "--yes", "--report", "/tmp/moefleet-test-default-inventory"])
    assert fake.calls[0][1] is None  # the runner resolves it: ansible.cfg's inventory


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


def test_status_table_and_exit_1_on_drift(monkeypatch, inventory, capsys):
    fake = FakeRun(report=status_doc("serving", "serving"))
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["status", "-i", str(inventory)]) == 1  # lab-1 was asked ep8 and serves tp8 (restored)
    assert fake.calls[0][0] == "status.yml"
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["host", "serving", "asked", "outcome", "health", "last", "rollback", "while", "serving"]
    assert lines[2].split() == ["lab-1", "tp8", "ep8", "restored", "serving", "2026-01-01", "10:00:00", "UTC*", "ep8",
                                "->", "tp8", "(OOM)", "-"]
    assert lines[3].split() == ["lab-2", "tp8", "tp8", "restored", "serving", "-", "-"]
    assert lines[4].startswith("* recorded without a time zone")
    assert lines[5] == ("0 of 2 hosts serve what they were asked; lab-1 restored to tp8 (asked ep8); "
                        "lab-2 restored to tp8 (asked tp8)")


def test_status_shows_the_runtime_ooms_the_exit_hook_recorded(monkeypatch, inventory, capsys):
    doc = status_doc("serving", "serving")
    doc["hosts"][1].update(runtime_ooms=2, last_runtime_failure={
        "time": "2026-01-02T03:04:05.6+00:00", "state": "oom", "phase": "runtime", "cause": None})
    monkeypatch.setattr(runner, "run_playbook", FakeRun(report=doc))
    assert cli.main(["status", "-i", str(inventory)]) == 1
    assert capsys.readouterr().out.splitlines()[3].endswith("2 OOM(s), last 2026-01-02 03:04:05 UTC oom (runtime)")


def test_status_json_and_exit_1_when_one_does_not_serve(monkeypatch, inventory, capsys):
    monkeypatch.setattr(runner, "run_playbook", FakeRun(report=status_doc("serving", "down")))
    assert cli.main(["status", "-i", str(inventory), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == status_doc("serving", "down")


def test_status_without_document_exits_3_when_hosts_were_unreachable(monkeypatch, inventory, capsys):
    events = [event("runner_on_unreachable", "lab-1", "Read", res={"msg": "no route"})]
    monkeypatch.setattr(runner, "run_playbook", FakeRun(events, None, runner.RunResult("failed", 4)))
    assert cli.main(["status", "-i", str(inventory)]) == 3
    assert "lab-1: no route" in capsys.readouterr().err


def test_status_without_document_exits_1(monkeypatch, inventory, capsys):
    events = [event("runner_on_failed", "lab-1", "Read", res={"msg": "boom"})]
    monkeypatch.setattr(runner, "run_playbook", FakeRun(events, None, runner.RunResult("failed", 2)))
    assert cli.main(["status", "-i", str(inventory)]) == 1
    assert "lab-1: boom" in capsys.readouterr().err


def test_status_unknown_inventory_exits_2(tmp_path, capsys):
    assert status.run(type("Args", (), {"inventory": str(tmp_path / "nope"), "json": False, "limit": None})()) == 2
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
    monkeypatch.chdir(collection.ROOT)  # the clone's own ansible.cfg is the one found (tests/unit/test_cli_config.py)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    got: list = []
    result = REAL_RUN_PLAYBOOK("status.yml", inventory, {"a": 1}, on_event=got.append)
    assert result == runner.RunResult(status="successful", rc=0, stats={"ok": {}})
    assert got == [{"event": "playbook_on_start"}]
    assert seen["project_dir"] == str(collection.ROOT)
    assert seen["playbook"] == str(collection.ROOT / "playbooks" / "status.yml")
    assert seen["inventory"] == str(inventory.resolve())
    assert seen["extravars"] == {"a": 1}
    assert seen["envvars"]["ANSIBLE_CONFIG"] == str(collection.ROOT / "ansible.cfg")
    assert seen["envvars"]["ANSIBLE_CALLBACKS_ENABLED"] == "moefleet.serving.moefleet_report"
    assert seen["cmdline"] is None and seen["passwords"] is None  # no vault options given
    assert not Path(seen["private_data_dir"]).exists()  # a fresh one per run, removed afterwards


# -- rollout --check, --limit, --json and the confirmation (issue 15) ----------------------------------------


class FakeAdhoc:
    """Stands in for runner.run_adhoc: the hosts' asked profile and order (debug), their local facts (setup)."""

    def __init__(self, serving: dict[str, str | None], asked: str | None = "ep8", unreachable=(), routers=(),
                 inputs=None):
        self.serving, self.asked, self.unreachable, self.routers = serving, asked, set(unreachable), list(routers)
        self.inputs = dict(inputs or {})  # the run-level inputs each host sees (inventory, -e)
        self.calls: list[tuple] = []

    def __call__(self, module, module_args, inventory, pattern, limit=None, extravars=None, vault=None):
        runner.inventory_path(inventory)
        self.calls.append((module, pattern, limit))
        hosts = [h for h in self.serving if limit is None or h in limit.split(",")]
        if module.endswith("debug"):
            msg = {"order": hosts, "routers": self.routers, "inputs": self.inputs}
            looked = {h: {"msg": {"asked": self.asked, **msg}} for h in hosts}
            return runner.AdhocResult(looked, {}, {}, "successful", 0)
        ok = {}
        for h in hosts:
            local = {} if self.serving[h] == "new" else {"moefleet": {"serving_profile": self.serving[h]}}
            if h not in self.unreachable:
                ok[h] = {"ansible_facts": {"ansible_local": local}}
        gone = {h: "ssh: connect to host refused" for h in hosts if h in self.unreachable}
        return runner.AdhocResult(ok, gone, {}, "successful", 0)


@pytest.fixture
def fleet(monkeypatch):
    """Four hosts: lab-1 and lab-3 serve ep8 (asked), lab-2 serves tp8, lab-4 is new."""
    adhoc = FakeAdhoc({"lab-1": "ep8", "lab-2": "tp8", "lab-3": "ep8", "lab-4": "new"})
    monkeypatch.setattr(runner, "run_adhoc", adhoc)
    run = FakeRun(report={"result": "complete", "hosts": [host_row(h, "ready") for h in adhoc.serving]})
    monkeypatch.setattr(runner, "run_playbook", run)
    return adhoc, run


def test_check_prints_batches_canary_first_and_what_changes_touching_nothing(fleet, inventory, capsys):
    adhoc, run = fleet
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--check"])
    out = capsys.readouterr().out
    assert code == 0 and run.calls == []
    assert [module for module, _, _ in adhoc.calls] == ["ansible.builtin.debug", "ansible.builtin.setup"]
    lines = out.splitlines()
    assert lines[0] == 'Rollout plan (serial [1, "25%", "100%"]; nothing was changed):'
    assert lines[1] == "canary:" and lines[2].split()[:2] == ["lab-1", "keeps"]
    assert lines[3] == "batch 2:" and "lab-2  restart: serves tp8, asked ep8" in lines[4]
    assert lines[5] == "batch 3:" and "lab-4  install and start ep8" in out
    assert "These hosts serve another profile and would restart: lab-2 (tp8 -> ep8)." in out
    # validate.yml ran first, as rollout.yml imports it
    assert run.validations == [(str(inventory), {"moefleet_serving_playbook": "rollout.yml", "profile": "ep8"}, None,
                                runner.Vault())]


def test_check_json_and_limit(fleet, inventory, capsys):
    adhoc, run = fleet
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--check", "--json", "-l", "lab-2,lab-3"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and run.calls == []
    assert [limit for _, _, limit, _ in run.validations] == ["lab-2,lab-3,localhost"]  # as the real run's --limit
    assert {call[2] for call in adhoc.calls} == {"lab-2,lab-3"}
    assert [(row["host"], row["batch"], row["canary"]) for row in plan["hosts"]] == [
        ("lab-2", 1, True), ("lab-3", 2, False)]
    assert plan["restart"] == ["lab-2"] and plan["touched"] is False


def test_check_says_unreachable_hosts_and_exits_3(monkeypatch, inventory, capsys):
    monkeypatch.setattr(runner, "run_adhoc", FakeAdhoc({"lab-1": "ep8", "lab-2": "tp8"}, unreachable={"lab-2"}))
    assert cli.main(["rollout", "-i", str(inventory), "--check"]) == 3
    captured = capsys.readouterr()
    assert "lab-2  unreachable now (ssh: connect to host refused)" in captured.out
    assert "would restart" not in captured.out
    assert captured.err == ("moefleet rollout: lab-2 could not be reached (or their facts read): the plan cannot say "
                            "what would change there.\n")
    assert cli.main(["deploy", "-i", str(inventory), "--check", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["unreachable"] == ["lab-2"]


def test_check_exits_3_when_a_hosts_facts_cannot_be_read(monkeypatch, inventory, capsys):
    class FactsFail(FakeAdhoc):
        def __call__(self, module, *args, **kwargs):
            result = super().__call__(module, *args, **kwargs)
            if module.endswith("setup"):
                del result.ok["lab-2"]
                result.failed["lab-2"] = "sudo: a password is required"
            return result

    monkeypatch.setattr(runner, "run_adhoc", FactsFail({"lab-1": "ep8", "lab-2": "tp8"}))
    assert cli.main(["rollout", "-i", str(inventory), "--check"]) == 3
    assert "lab-2  its facts could not be read (sudo: a password is required)" in capsys.readouterr().out


def test_check_exits_2_when_a_host_has_no_profile_to_serve(monkeypatch, inventory, capsys):
    monkeypatch.setattr(runner, "run_adhoc", FakeAdhoc({"lab-1": "ep8"}, asked=None))
    assert cli.main(["rollout", "-i", str(inventory), "--check"]) == 2
    captured = capsys.readouterr()
    assert "lab-1  no profile asked" in captured.out
    assert "moefleet rollout: no profile asked for lab-1: pass -e profile=NAME" in captured.err


def test_check_refuses_a_run_level_input_set_in_the_inventory(monkeypatch, inventory, capsys):
    adhoc = FakeAdhoc({"lab-1": "ep8", "lab-2": "ep8"}, inputs={"moefleet_max_unavailable": 2})
    monkeypatch.setattr(runner, "run_adhoc", adhoc)
    assert cli.main(["rollout", "-i", str(inventory), "--check", "-e", "profile=ep8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moefleet rollout: moefleet_max_unavailable is set in the inventory for lab-1, lab-2, which "
                          "the playbooks would ignore")
    assert [module for module, _, _ in adhoc.calls] == ["ansible.builtin.debug"]  # refused before reading facts
    # given with -e, it wins over the inventory everywhere: nothing to refuse
    adhoc.inputs = {"moefleet_max_unavailable": "3"}
    assert cli.main(["rollout", "-i", str(inventory), "--check", "-e", "profile=ep8 moefleet_max_unavailable=3"]) == 0


@pytest.mark.parametrize("command", [["rollout", "--check"], ["rollout", "--yes"], ["deploy", "--yes"],
                                     ["deploy", "--check"]])
@pytest.mark.parametrize(("extra", "sentence"), [
    ("confirm=1", "confirm is '1'; set it to yes or no (true/false work too), e.g. -e confirm=yes."),
    ('{"moefleet_serial": [1, 0]}', "batch size 2 of moefleet_serial is 0, which Ansible takes as every host at once"),
    ("moefleet_max_fail_percentage=150", "moefleet_max_fail_percentage is '150'; set it to a whole number from 0 to"),
    ("moefleet_health_gate=maybe", "moefleet_health_gate is 'maybe', which is not a boolean"),
])
def test_the_runs_own_inputs_are_checked_before_anything_runs(fleet, inventory, capsys, command, extra, sentence):
    adhoc, run = fleet
    assert cli.main([*command, "-i", str(inventory), "-e", "profile=ep8", "-e", extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"moefleet {command[0]}: {sentence}") and "Traceback" not in err
    assert adhoc.calls == [] and run.calls == []


def test_confirm_true_reaches_the_playbook_as_yes(fleet, inventory, tmp_path):
    adhoc, run = fleet
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8 confirm=True", "--report",
                     str(tmp_path / "r")]) == 0
    assert adhoc.calls == [] and run.calls[0][2]["confirm"] == "yes"  # the words rollout.yml's question reads


def test_refused_at_confirmation_without_a_terminal_names_the_right_hosts(fleet, inventory, tmp_path, capsys):
    _, run = fleet
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--report", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 1 and run.calls == []  # nothing ran
    assert "refused at confirmation; nothing changed. These hosts serve another profile and would restart: " \
        "lab-2 (tp8 -> ep8). Rerun with --yes (or -e confirm=yes)" in err
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, json.loads((collection.ROOT / "schemas" / "rollout_report.schema.json").read_text()))
    assert report["stopped_by"] == "refused at confirmation: lab-2"
    messages = {row["host"]: row["message"] for row in report["hosts"]}
    assert messages["lab-2"] == "refused at confirmation (would restart)"
    assert messages["lab-4"] == "refused at confirmation (batch 3 not started)"
    markdown = (tmp_path / "r.md").read_text()
    assert "refused at confirmation" in markdown and "never reached" not in markdown


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "confirmed"), [("y\n", True), ("yes\n", True), ("\n", False), ("n\n", False)])
def test_the_prompt_on_a_terminal_lists_the_hosts_that_would_restart(fleet, inventory, tmp_path, monkeypatch,
                                                                     capsys, answer, confirmed):
    _, run = fleet
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    monkeypatch.setattr("sys.stderr", Terminal())
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--report", str(tmp_path / "r")])
    prompt = __import__("sys").stderr.getvalue()
    assert "would restart: lab-2 (tp8 -> ep8).\nRestart them? [y/N] " in prompt
    if confirmed:
        assert code == 0 and run.calls[0][2]["confirm"] == "yes"
    else:
        assert code == 1 and run.calls == [] and "refused at confirmation" in prompt


def test_yes_or_confirm_skips_the_question_and_the_look(fleet, inventory, tmp_path):
    adhoc, run = fleet
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--yes",
                     "--report", str(tmp_path / "a")]) == 0
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8 confirm=yes",
                     "--report", str(tmp_path / "b")]) == 0
    assert adhoc.calls == [] and [call[2]["confirm"] for call in run.calls] == ["yes", "yes"]
    assert run.validations == []  # the playbook validates first itself: no plan, no question, no second check


def test_limit_reaches_the_playbook_with_the_controller(fleet, inventory, tmp_path):
    _, run = fleet
    cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--yes", "-l", "lab-1",
              "--report", str(tmp_path / "r")])
    assert run.limits == ["lab-1,localhost"]


def test_json_prints_the_report_on_stdout_and_progress_elsewhere(fleet, inventory, tmp_path, capsys):
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--yes", "--json",
                     "--report", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert code == 0
    assert json.loads(captured.out)["result"] == "complete"
    assert "Report:" in captured.err


def test_the_playbooks_own_refusal_is_reported_as_refused_not_never_reached(monkeypatch, inventory, tmp_path, capsys):
    monkeypatch.setattr(runner, "run_adhoc", FakeAdhoc({"lab-1": "ep8"}))  # the plan saw nothing to confirm
    message = "These hosts serve another profile and would be restarted: lab-1. Rerun with -e confirm=yes ..."
    events = [event("runner_on_failed", "lab-1", "Require -e confirm=yes", res={"msg": message})]
    report = {"result": "stopped", "stopped_by": None, "hosts": [host_row("lab-1", "untouched", "tp8")]}
    monkeypatch.setattr(runner, "run_playbook", FakeRun(events, report, runner.RunResult("failed", 2)))
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--report", str(tmp_path / "r")])
    assert code == 1
    assert "refused at confirmation; These hosts serve another profile" in capsys.readouterr().err
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["stopped_by"] == "refused at confirmation"
    assert saved["hosts"][0]["message"].startswith("refused at confirmation")
    assert "never reached" not in (tmp_path / "r.md").read_text()


def test_run_adhoc_runs_one_module_with_the_rollouts_configuration(monkeypatch, inventory):
    import ansible_runner

    seen: dict = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        for item in (event("runner_on_ok", "lab-1", res={"msg": 1}), event("runner_on_unreachable", "lab-2",
                     res={"msg": "no  route"}), event("runner_on_failed", "lab-3", res={"msg": "bad"})):
            kwargs["event_handler"](item)
        return type("R", (), {"status": "failed", "rc": 4})()

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    monkeypatch.chdir(collection.ROOT)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    result = REAL_RUN_ADHOC("ansible.builtin.setup", "filter=ansible_local", inventory, "blackwell", "lab-1",
                            {"a": 1})
    assert result == runner.AdhocResult({"lab-1": {"msg": 1}}, {"lab-2": "no route"}, {"lab-3": "bad"}, "failed", 4)
    assert (seen["module"], seen["module_args"], seen["host_pattern"], seen["limit"]) == (
        "ansible.builtin.setup", "filter=ansible_local", "blackwell", "lab-1")
    assert seen["inventory"] == str(inventory.resolve()) and seen["extravars"] == {"a": 1}
    assert seen["envvars"]["ANSIBLE_CONFIG"] == str(collection.ROOT / "ansible.cfg")


# -- moefleet deploy: deploy.yml with rollout's conventions (issue 15) ---------------------------------------


def test_deploy_check_puts_every_host_in_one_batch_without_a_canary(fleet, inventory, capsys):
    adhoc, run = fleet
    assert cli.main(["deploy", "-i", str(inventory), "-e", "profile=ep8", "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert run.calls == [] and [module for module, _, _ in adhoc.calls] == ["ansible.builtin.debug",
                                                                             "ansible.builtin.setup"]
    assert lines[0] == "Deploy plan (every host at once; nothing was changed):"
    assert lines[1] == "every host:"
    assert [line.split()[0] for line in lines[2:6]] == ["lab-1", "lab-2", "lab-3", "lab-4"]
    assert lines[-1].endswith("The deploy asks before restarting them (--yes: without asking).")


def test_deploy_behind_routers_is_refused_unless_a_maintenance_window(monkeypatch, inventory, capsys):
    """deploy.yml does not drain: behind routers it is refused before anything runs (validate.yml's sentence,
    playbook_inputs.outage), naming the drained way and the maintenance window; with the window, the plan."""
    adhoc = FakeAdhoc({"lab-1": "ep8", "lab-2": "ep8"}, routers=["lab-router"])
    monkeypatch.setattr(runner, "run_adhoc", adhoc)
    assert cli.main(["deploy", "-i", str(inventory), "--check", "--json", "-e", "profile=ep8"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ("moefleet deploy: deploy.yml would restart 2 of the 2 workers behind the routers (lab-router) without "
            "taking them out of the routers first") in err
    assert "moefleet rollout -e profile=ep8 (or ansible-playbook playbooks/rollout.yml -e profile=ep8)" in err
    assert "-e moefleet_maintenance_window=true" in err
    assert [module for module, _, _ in adhoc.calls] == ["ansible.builtin.debug"]  # no host's facts were read
    assert cli.main(["deploy", "-i", str(inventory), "--check", "--json", "-e", "profile=ep8",
                     "-e", "moefleet_maintenance_window=true"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["playbook"], plan["behind_routers"], plan["batches"], plan["serial"]) == ("deploy.yml", False, 1, [0])
    assert [row["canary"] for row in plan["hosts"]] == [False, False]


def test_deploy_runs_deploy_yml_with_the_limit_and_the_controller(fleet, inventory, tmp_path):
    _, run = fleet
    assert cli.main(["deploy", "-i", str(inventory), "-e", "profile=ep8", "--yes", "-l", "lab-1",
                     "--report", str(tmp_path / "r")]) == 0
    assert run.calls[0][0] == "deploy.yml" and run.limits == ["lab-1,localhost"]
    assert run.calls[0][2]["confirm"] == "yes" and run.calls[0][2]["moefleet_report_path"] == str(tmp_path / "r")


def test_deploy_refuses_at_confirmation_off_a_terminal(fleet, inventory, tmp_path, capsys):
    _, run = fleet
    assert cli.main(["deploy", "-i", str(inventory), "-e", "profile=ep8", "--report", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert run.calls == [] and "moefleet deploy: refused at confirmation; nothing changed." in err
    assert "lab-2 (tp8 -> ep8)" in err
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, json.loads((collection.ROOT / "schemas" / "rollout_report.schema.json").read_text()))
    assert report["playbook"] == "deploy.yml"
    assert (tmp_path / "r.md").read_text().startswith("# Deploy report: ep8")


def test_deploy_json_exit_codes_and_default_report_name(fleet, inventory, tmp_path, monkeypatch, capsys):
    _, run = fleet
    monkeypatch.chdir(tmp_path)
    run.report = {"result": "complete", "hosts": [host_row("lab-1", "ready"), host_row("lab-2", "degraded", "tp8")]}
    assert cli.main(["deploy", "-i", str(inventory), "-e", "profile=ep8", "--yes", "--json"]) == 1  # degraded
    captured = capsys.readouterr()
    assert json.loads(captured.out)["result"] == "complete"
    assert [p.name.split("-")[0] for p in (tmp_path / "reports").glob("*.json")] == ["deploy"]
    assert cli.main(["deploy", "-i", str(tmp_path / "nope"), "-e", "profile=ep8", "--yes"]) == 2


def test_deploy_help_shares_rollouts_arguments(capsys):
    with pytest.raises(SystemExit):
        cli.main(["deploy", "--help"])
    text = capsys.readouterr().out
    for option in ("-i INVENTORY", "--limit PATTERN", "--check", "--yes", "--json", "--extra-vars VARS", "--report"):
        assert option in text


@pytest.mark.parametrize("size", ["100%", "2", "5"])
def test_rollout_draining_every_worker_at_once_is_refused_unless_a_maintenance_window(monkeypatch, inventory, capsys,
                                                                                      size):
    monkeypatch.setattr(runner, "run_adhoc", FakeAdhoc({"lab-1": "ep8", "lab-2": "ep8"}, routers=["lab-router"]))
    args = ["rollout", "-i", str(inventory), "--check", "-e", "profile=ep8", "-e", f"moefleet_max_unavailable={size}"]
    assert cli.main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"moefleet_max_unavailable={size} would take 2 of the 2 workers of this run out of the routers "
            "(lab-router) at once, leaving 0 of the 2 workers behind them serving") in err
    assert cli.main([*args, "-e", "moefleet_maintenance_window=true"]) == 0
    assert cli.main([*args[:-1], "moefleet_max_unavailable=1"]) == 0


# -- --check and the confirmation run playbooks/validate.yml's checks first (issue 33) -------------------------

VALIDATE_REFUSAL = [
    event("playbook_on_play_start", play_pattern="localhost"),
    event("runner_on_failed", "localhost", "Validate the catalog, resolve each host's profile and check the rules",
          res={"msg": "-e profile: Unknown profile 'ep9'; valid profiles: tp8, ep8.\n"}),
]


@pytest.mark.parametrize("command", ["rollout", "deploy"])
def test_check_refused_by_validate_exits_2_with_its_sentence_before_any_host_is_read(fleet, inventory, capsys,
                                                                                    command):
    adhoc, run = fleet
    run.validate_events, run.validate_result = VALIDATE_REFUSAL, runner.RunResult("failed", 2)
    assert cli.main([command, "-i", str(inventory), "-e", "profile=ep9", "--check"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"moefleet {command}: -e profile: Unknown profile 'ep9'; valid profiles: tp8, ep8.\n"
    assert captured.out == ""  # no plan, and no progress lines of the check
    assert adhoc.calls == [] and run.calls == []
    assert run.validations[0][1]["moefleet_serving_playbook"] == f"{command}.yml"  # what the playbook imports it with


def test_the_question_is_never_asked_for_inputs_validate_refuses(fleet, inventory, tmp_path, monkeypatch, capsys):
    adhoc, run = fleet
    run.validate_events, run.validate_result = VALIDATE_REFUSAL, runner.RunResult("failed", 2)
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    monkeypatch.setattr("sys.stderr", Terminal())
    code = cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep9", "--report", str(tmp_path / "r")])
    said = __import__("sys").stderr.getvalue()
    assert code == 2 and "Restart them?" not in said and "Unknown profile 'ep9'" in said
    assert adhoc.calls == [] and run.calls == [] and not (tmp_path / "r.json").exists()


def test_a_failed_loop_item_gives_its_own_sentence_not_one_or_more_items_failed(fleet, inventory, capsys):
    """validate.yml loops over the roles' specs and the renamed variables: the item says what is wrong."""
    _, run = fleet
    item = {"failed": True, "msg": "lab-1: sglang_service_user (set for lab-1) was renamed: set sglang_user."}
    run.validate_events = [event("runner_on_failed", "lab-1", "Refuse a variable that was renamed", res={
        "msg": "One or more items failed", "results": [{"failed": False, "msg": "All assertions passed"}, item]})]
    run.validate_result = runner.RunResult("failed", 2)
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--check"]) == 2
    assert capsys.readouterr().err == f"moefleet rollout: {item['msg']}\n"


def test_an_error_before_any_task_of_validate_is_bad_input_with_ansibles_words(fleet, inventory, capsys):
    adhoc, run = fleet
    run.validate_events = [{"event": "verbose", "stdout": "\x1b[0;31m[ERROR]: The vault password file /x was not "
                            "found\x1b[0m"}]
    run.validate_result = runner.RunResult("failed", 1)
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--check"]) == 2
    assert capsys.readouterr().err == ("moefleet rollout: Cannot check the inputs with playbooks/validate.yml: The "
                                       "vault password file /x was not found\n")
    assert adhoc.calls == []


def test_ctrl_c_while_checking_exits_130_with_nothing_changed(fleet, inventory, capsys):
    adhoc, run = fleet
    run.validate_result = runner.RunResult("failed", 254, interrupted=True)
    assert cli.main(["rollout", "-i", str(inventory), "-e", "profile=ep8", "--check"]) == 130
    assert "stopped while checking the inputs; nothing changed" in capsys.readouterr().err
    assert adhoc.calls == [] and run.calls == []
