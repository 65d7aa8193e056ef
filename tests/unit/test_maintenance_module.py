"""The maintenance module (plugins/modules/maintenance.py), run by ansible-playbook on localhost as serve.yml and
remediate.yml run it: it writes the run's start into node_exporter's textfile directory, 0 at the end (the same
series), and leaves a host without that directory alone."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from playbook import run_playbook  # noqa: E402

LOCAL = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"


def run(tmp_path: Path, textfile_dir: Path, state: str, reason: str = "deploy"):
    (tmp_path / "hosts").write_text(LOCAL)
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"moefleet.serving.maintenance": {"reason": reason, "state": state, "textfile_dir": str(textfile_dir)}}]}]))
    return run_playbook(tmp_path / "hosts", play)


def value(text: str, reason: str) -> float:
    name = f'moefleet_maintenance_start_timestamp_seconds{{reason="{reason}"}}'
    line = next(x for x in text.splitlines() if x.startswith(name))
    return float(line.rsplit(" ", 1)[1])


def test_a_run_starts_and_ends_its_maintenance(tmp_path):
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    result = run(tmp_path, textfiles, "started", "remediate")
    assert result.returncode == 0, result.stdout[-2000:]
    text = (textfiles / "moefleet_maintenance.prom").read_text()
    assert value(text, "remediate") > 1.7e9 and value(text, "deploy") == 0
    result = run(tmp_path, textfiles, "ended", "remediate")
    assert result.returncode == 0, result.stdout[-2000:]
    text = (textfiles / "moefleet_maintenance.prom").read_text()
    assert value(text, "remediate") == 0 and value(text, "deploy") == 0
    assert [p.name for p in textfiles.iterdir()] == ["moefleet_maintenance.prom"]  # no temporary file left


def test_a_host_without_node_exporters_directory_is_left_alone(tmp_path):
    result = run(tmp_path, tmp_path / "absent", "started")
    assert result.returncode == 0, result.stdout[-2000:]
    assert not (tmp_path / "absent").exists()


def test_an_unknown_reason_is_refused(tmp_path):
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()
    result = run(tmp_path, textfiles, "started", "upgrade")
    assert result.returncode != 0
    assert "value of reason must be one of: deploy, rollout, remediate" in result.stdout
    assert not (textfiles / "moefleet_maintenance.prom").exists()
