"""Callback (tests only, enabled by tests/integration/test_deploy_trace_lab.py and test_router_lab.py through
ANSIBLE_CALLBACK_PLUGINS): the task file of each task a playbook starts, in order, written as JSON to
$MOEFLEET_TASK_TRACE at the end: {"tasks": [file per task started], "hosts": {host: [file per task it ran]}}. The
per-host lists follow one host through a rollout's batches (a task started once for a batch runs on each host in it).

Ansible's own generated tasks are left out: meta tasks (which start no callback), implicit tasks, the play's
fact gathering ("Gathering Facts") and each role's argument check ("Validating arguments against arg spec ...").
Handlers are not tasks a file's flow enters and are not recorded."""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_files
type: aggregate
short_description: the task file of each task started, in order (tests only)
description: Writes the lists to the file named by the MOEFLEET_TASK_TRACE environment variable.
requirements: [enable in callbacks_enabled]
"""


def summarize(files: list[str], root: str = "") -> dict:
    """The trace as the issue counts it: `entries`, the files in the order the flow entered them (a file entered
    again right after itself, as a loop over one included file does, is one entry); `files`, the distinct files;
    `reentries`, the entries of a file the flow had entered and left before. Paths relative to `root`."""
    entries: list[str] = []
    for path in files:
        name = os.path.relpath(path, root) if root else path
        if not entries or entries[-1] != name:
            entries.append(name)
    seen: set[str] = set()
    reentries = []
    for name in entries:
        if name in seen:
            reentries.append(name)
        seen.add(name)
    return {"entries": entries, "files": sorted(seen), "reentries": reentries}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_files"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.files: list[str] = []
        self.by_host: dict[str, list[str]] = {}

    @staticmethod
    def _file(task) -> str:
        """The task's file, or "" for Ansible's own: meta tasks, implicit ones, fact gathering, and the check of a
        role's arguments against its argument spec it adds before each role (its path is the play's or the
        importing file's)."""
        generated = (task.action in ("meta", "ansible.builtin.meta") or getattr(task, "implicit", False)
                     or task.get_name() == "Gathering Facts"
                     or (task.name or "").startswith("Validating arguments against arg spec"))
        path = task.get_path() or ""
        return "" if generated or not path else path.rsplit(":", 1)[0]

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        if path := self._file(task):
            self.files.append(path)

    def v2_runner_on_start(self, host, task) -> None:
        if path := self._file(task):
            self.by_host.setdefault(host.get_name(), []).append(path)

    def v2_playbook_on_stats(self, stats) -> None:
        target = os.environ.get("MOEFLEET_TASK_TRACE")
        if target:
            with open(target, "w", encoding="utf-8") as out:
                json.dump({"tasks": self.files, "hosts": self.by_host}, out)
