"""tests/callbacks/task_files.py, which tests/integration/test_deploy_trace_lab.py traces a deploy with: what it
records on a real (local) playbook run, and how the trace is counted."""

from __future__ import annotations

import json
import sys

from playbook import ROOT, run_playbook

sys.path.insert(0, str(ROOT / "tests" / "callbacks"))
from task_files import summarize  # noqa: E402


def test_summarize_counts_entries_files_and_reentries():
    found = summarize(["/r/a.yml", "/r/a.yml", "/r/b.yml", "/r/c.yml", "/r/c.yml", "/r/b.yml", "/r/a.yml"], "/r")
    assert found["entries"] == ["a.yml", "b.yml", "c.yml", "b.yml", "a.yml"]
    assert found["files"] == ["a.yml", "b.yml", "c.yml"]
    assert found["reentries"] == ["b.yml", "a.yml"]


def test_the_callback_records_task_files_in_order_without_generated_tasks(tmp_path, monkeypatch):
    (tmp_path / "inner.yml").write_text(json.dumps([{"name": "Inner", "ansible.builtin.debug": {"msg": "in"}}]))
    role = tmp_path / "roles" / "checked"  # a role with an argument spec: Ansible adds a check task before it
    (role / "meta").mkdir(parents=True)
    (role / "tasks").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(json.dumps(
        {"argument_specs": {"main": {"options": {"checked_word": {"type": "str", "default": "x"}}}}}))
    (role / "tasks" / "main.yml").write_text(json.dumps([{"name": "Role", "ansible.builtin.debug": {"msg": "r"}}]))
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{
        "hosts": "localhost", "connection": "local", "gather_facts": True,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "roles": ["checked"],
        "tasks": [
            {"name": "First", "ansible.builtin.debug": {"msg": "1"}},
            {"name": "Twice", "ansible.builtin.include_tasks": str(tmp_path / "inner.yml"), "loop": [1, 2]},
            {"ansible.builtin.meta": "flush_handlers"},
            {"name": "Last", "ansible.builtin.debug": {"msg": "2"}},
        ],
    }]))
    trace = tmp_path / "trace.json"
    monkeypatch.setenv("ANSIBLE_CALLBACK_PLUGINS", str(ROOT / "tests" / "callbacks"))
    monkeypatch.setenv("ANSIBLE_CALLBACKS_ENABLED", "task_files")
    monkeypatch.setenv("ANSIBLE_ROLES_PATH", str(tmp_path / "roles"))
    monkeypatch.setenv("MOEFLEET_TASK_TRACE", str(trace))
    done = run_playbook("localhost,", play, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = json.loads(trace.read_text())
    found = summarize(recorded["tasks"], str(tmp_path))
    # the role (not its argument check, whose path is the play's), the play's file (First, the include, Last), the
    # included file once for both passes, then the play's again
    assert found["entries"] == ["roles/checked/tasks/main.yml", "play.yml", "inner.yml", "play.yml"], found
    assert found["reentries"] == ["play.yml"]
    # the same path as the one host ran it: each task it ran, the included file's once per pass
    assert summarize(recorded["hosts"]["localhost"], str(tmp_path)) == found
    assert [p for p in recorded["hosts"]["localhost"] if p.endswith("inner.yml")] == [str(tmp_path / "inner.yml")] * 2
