"""Run the collection's playbooks through ansible-runner, the way ansible-rulebook does.

A fresh private data directory per run, the collection (a clone or an installed copy) as project
directory, events handed to the caller as they come, and Ctrl-C in two steps: the first asks the run to
stop after the running task (the moefleet_report callback ends the run at the next task start and writes
its report; a host whose service start began finishes that start, its rollback or restore and its record
first), the second stops it at once (ansible-runner kills ansible-playbook).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moefleet import collection

# The report callback, enabled for every run: also where no clone's ansible.cfg applies (an installed collection).
REPORT_CALLBACK = "moefleet.serving.moefleet_report"
# How often ansible-runner asks cancel_callback, in seconds (its default is 5).
POLL_SECONDS = 0.5

EventHandler = Callable[[dict[str, Any]], None]


class BadInput(Exception):
    """Input a command cannot use; the message is the one line printed to stderr."""


@dataclass
class RunResult:
    """How a run ended: ansible-runner's status and rc, and whether the operator interrupted it."""

    status: str
    rc: int | None
    interrupted: bool = False
    hard_stopped: bool = False
    stats: Mapping[str, Any] | None = None


class Interrupt:
    """SIGINT handler: the first asks for a stop after the running task, the second for a stop now."""

    def __init__(self, stop_file: Path, notice: Callable[[str], None]) -> None:
        self.stop_file = stop_file
        self.notice = notice
        self.requested = False
        self.hard = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.requested:
            self.hard = True
            self.notice("Stopping now.")
            return
        self.requested = True
        self.stop_file.touch()
        self.notice("Stopping after the running task (a started rollback or restore runs to its end first); "
                    "press Ctrl-C again to stop now.")

    def cancel(self) -> bool:
        """ansible-runner's cancel_callback: True kills the run."""
        return self.hard


def playbook_path(name: str) -> Path:
    path = collection.PLAYBOOKS / name
    if not path.is_file():
        raise BadInput(f"The playbook {path} is missing from this installation.")
    return path


def default_inventory() -> Path | None:
    """The inventory ansible.cfg names (the clone's: the lab), resolved against the collection's root."""
    if collection.ANSIBLE_CFG is None:
        return None
    import configparser

    config = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    try:
        config.read(collection.ANSIBLE_CFG, encoding="utf-8")
        value = config.get("defaults", "inventory", fallback="").split(",")[0].strip()
    except configparser.Error:
        return None
    return (collection.ROOT / value).resolve() if value else None


def inventory_path(inventory: str | Path | None) -> Path:
    if inventory is None:
        inventory = default_inventory()
        if inventory is None:
            raise BadInput("No inventory given and ansible.cfg names none: pass -i with a file or directory.")
    path = Path(inventory).expanduser().resolve()
    if not path.exists():
        raise BadInput(f"The inventory {inventory} does not exist: pass -i with a file or directory that does.")
    return path


def search_path() -> str:
    """PATH with the directory of this Python first, so the run uses the venv's ansible-playbook."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if not shutil.which("ansible-playbook", path=path):
        raise BadInput("ansible-playbook is not installed: run `make setup` (or pip install ansible-core).")
    return path


def run_playbook(
    name: str,
    inventory: str | Path,
    extravars: Mapping[str, Any] | None = None,
    on_event: EventHandler | None = None,
    notice: Callable[[str], None] = print,
    limit: str | None = None,
) -> RunResult:
    """Run playbooks/<name> on the inventory and return how it ended; BadInput before anything runs."""
    import ansible_runner

    playbook = playbook_path(name)
    hosts = inventory_path(inventory)
    path = search_path()
    with tempfile.TemporaryDirectory(prefix="moefleet-run-") as data_dir:
        interrupt = Interrupt(Path(data_dir) / "stop-requested", notice)

        def handle(event: dict[str, Any]) -> bool:
            if on_event is not None:
                on_event(event)
            return True  # keep the event: ansible-runner reads the stats from it

        envvars = {
            "PATH": path,
            "ANSIBLE_CALLBACKS_ENABLED": REPORT_CALLBACK,
            "MOEFLEET_STOP_FILE": str(interrupt.stop_file),
        }
        if collection.ANSIBLE_CFG is not None:
            envvars["ANSIBLE_CONFIG"] = str(collection.ANSIBLE_CFG)
        previous = signal.signal(signal.SIGINT, interrupt)
        try:
            runner = ansible_runner.run(
                private_data_dir=data_dir,
                project_dir=str(collection.ROOT),
                playbook=str(playbook),
                inventory=str(hosts),
                limit=limit,
                extravars=dict(extravars or {}),
                envvars=envvars,
                event_handler=handle,
                cancel_callback=interrupt.cancel,
                settings={"pexpect_timeout": POLL_SECONDS, "suppress_ansible_output": True},
                quiet=True,
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        return RunResult(
            status=runner.status,
            rc=runner.rc,
            interrupted=interrupt.requested,
            hard_stopped=interrupt.hard,
            stats=runner.stats,
        )


@dataclass
class AdhocResult:
    """Per host, the module's result (``ok``) or why it did not run there (``unreachable``, ``failed``)."""

    ok: dict[str, dict[str, Any]]
    unreachable: dict[str, str]
    failed: dict[str, str]
    status: str
    rc: int | None


def run_adhoc(
    module: str,
    module_args: str,
    inventory: str | Path,
    pattern: str,
    limit: str | None = None,
    extravars: Mapping[str, Any] | None = None,
) -> AdhocResult:
    """Run one read-only module on ``pattern`` (``ansible PATTERN -m MODULE -a ARGS``) through ansible-runner,
    with the same configuration, collection and environment as run_playbook; BadInput before anything runs."""
    import ansible_runner

    hosts = inventory_path(inventory)
    path = search_path()
    ok: dict[str, dict[str, Any]] = {}
    unreachable: dict[str, str] = {}
    failed: dict[str, str] = {}

    def handle(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        host, res = data.get("host"), data.get("res") if isinstance(data.get("res"), dict) else {}
        if not host:
            return True
        if event.get("event") == "runner_on_ok":
            ok[host] = res
        elif event.get("event") == "runner_on_unreachable":
            unreachable[host] = " ".join(str(res.get("msg", "")).split())
        elif event.get("event") == "runner_on_failed":
            failed[host] = " ".join(str(res.get("msg", "")).split())
        return True

    envvars = {"PATH": path}
    if collection.ANSIBLE_CFG is not None:
        envvars["ANSIBLE_CONFIG"] = str(collection.ANSIBLE_CFG)
    with tempfile.TemporaryDirectory(prefix="moefleet-run-") as data_dir:
        result = ansible_runner.run(
            private_data_dir=data_dir,
            project_dir=str(collection.ROOT),
            module=module,
            module_args=module_args,
            host_pattern=pattern,
            inventory=str(hosts),
            limit=limit,
            extravars=dict(extravars or {}),
            envvars=envvars,
            event_handler=handle,
            settings={"suppress_ansible_output": True},
            quiet=True,
        )
    return AdhocResult(ok, unreachable, failed, result.status, result.rc)
