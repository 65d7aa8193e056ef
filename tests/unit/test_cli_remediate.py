"""moefleet remediate: what reaches playbooks/remediate.yml, what it prints per host, its exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from moefleet import cli, runner


class FakeRun:
    def __init__(self, events: list[dict], rc: int = 0) -> None:
        self.events, self.rc, self.calls = events, rc, []

    def __call__(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None,
                 check=False):
        runner.inventory_path(inventory)
        self.calls.append({"name": name, "extravars": extravars, "limit": limit, "check": check})
        for event in self.events:
            on_event(event)
        return runner.RunResult("successful" if self.rc == 0 else "failed", self.rc)


def report(host: str, msg: str) -> dict:
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": "Report", "res": {"msg": msg}}}


def failed(host: str, msg: str) -> dict:
    return {"event": "runner_on_failed", "event_data": {"host": host, "task": "Stop here, with the evidence",
                                                        "res": {"msg": msg}}}


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text("all: {}\n")
    return path


def test_a_host_put_back_exits_0_and_says_so(monkeypatch, inventory, capsys):
    fake = FakeRun([report("gpu-2", "gpu-2 was unfit (gpu 3: Xid 79 ...); it rebooted ... and it serves again.")])
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["remediate", "-i", str(inventory), "--max-unavailable", "25%", "-l", "gpu-2"]) == 0
    assert capsys.readouterr().out.startswith("gpu-2 was unfit (gpu 3: Xid 79 ...)")
    assert fake.calls == [{"name": "remediate.yml", "extravars": {"moefleet_max_unavailable": "25%"},
                           "limit": "gpu-2", "check": False}]


def test_a_host_kept_out_exits_1_with_the_evidence(monkeypatch, inventory, capsys):
    monkeypatch.setattr(runner, "run_playbook", FakeRun(
        [failed("gpu-2", "gpu-2 needs hardware attention ... Evidence: gpu 3: Xid 79")], rc=2))
    assert cli.main(["remediate", "-i", str(inventory), "-e", "fault_watch_retry_window=0", "--check"]) == 1
    assert "gpu-2: gpu-2 needs hardware attention ... Evidence: gpu 3: Xid 79" in capsys.readouterr().err


def test_nothing_unfit_exits_0(monkeypatch, inventory, capsys):
    fake = FakeRun([])
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["remediate", "-i", str(inventory), "--check"]) == 0
    assert capsys.readouterr().out == "No host was unfit: nothing to remediate.\n"
    assert fake.calls[0]["check"] is True and fake.calls[0]["extravars"] == {}


def test_bad_extra_vars_are_refused_before_anything_runs(monkeypatch, inventory, capsys):
    fake = FakeRun([])
    monkeypatch.setattr(runner, "run_playbook", fake)
    assert cli.main(["remediate", "-i", str(inventory), "-e", "{not json"]) == 2
    assert fake.calls == [] and "moefleet remediate:" in capsys.readouterr().err
