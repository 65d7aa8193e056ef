"""Run the collection's playbooks through ansible-runner, the way ansible-rulebook does.

A fresh private data directory per run, events handed to the caller as they come, and Ctrl-C in two steps: the
first asks the run to stop after the running task (the moefleet_report callback ends the run at the next task
start and writes its report; a host whose service start began finishes that start, its rollback or restore and
its record first), the second stops it at once (ansible-runner kills ansible-playbook).

The operator's Ansible configuration applies as ansible-playbook would find it from the directory moefleet runs
in: ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg (ansible-core's own search,
find_ini_config_file); only when there is none, a clone's own ansible.cfg (the lab as default inventory). Its
inventory is the default for -i; the run gets it by name (ANSIBLE_CONFIG), since ansible-runner starts
ansible-playbook in another directory, with this collection's roles and collections path put in front of the
configured ones, the report callback added to the configured callbacks, and its host_key_checking kept
(ansible-runner would otherwise turn it off). Vault passwords pass through as ansible-playbook's own options.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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


# ansible-playbook's prompt for --ask-vault-pass (ansible/cli/__init__.py: it "needs to match 'Vault password:\s*?$'").
VAULT_PROMPT = r"Vault password:\s*?$"


@dataclass(frozen=True)
class Vault:
    """How the run gets vault passwords: ansible-playbook's --vault-password-file (each file or script, as it
    takes them) and --ask-vault-pass, whose prompt is answered with ``password`` (asked once by the CLI, kept in
    memory, never on a command line or on disk)."""

    password_files: tuple[str, ...] = ()
    ask: bool = False
    password: str | None = field(default=None, repr=False)

    def cmdline(self) -> str | None:
        words = [w for path in self.password_files for w in ("--vault-password-file", path)]
        words += ["--ask-vault-pass"] if self.ask else []
        return shlex.join(words) if words else None

    def passwords(self) -> dict[str, str] | None:
        return {VAULT_PROMPT: self.password or ""} if self.ask else None


def playbook_path(name: str) -> Path:
    path = collection.PLAYBOOKS / name
    if not path.is_file():
        raise BadInput(f"The playbook {path} is missing from this installation.")
    return path


def ansible_config() -> Path | None:
    """The ansible.cfg ansible-playbook would read if started here (ANSIBLE_CONFIG, ./ansible.cfg unless the
    directory is world-writable, ~/.ansible.cfg, /etc/ansible/ansible.cfg), else the clone's (None for an
    installed collection: Ansible's defaults)."""
    from ansible.config.manager import find_ini_config_file

    found = find_ini_config_file()
    return Path(found).resolve() if found else collection.ANSIBLE_CFG


def _config_manager(config: Path | None) -> Any:
    """ansible-core's reading of that configuration file (None: none was found, its search finds none again), with
    the ANSIBLE_* environment over it, relative paths resolved as ansible-playbook resolves them."""
    from ansible.config.manager import ConfigManager

    return ConfigManager(conf_file=str(config) if config is not None else None)


def _setting(manager: Any, name: str) -> Any:
    try:
        return manager.get_config_value(name)
    except Exception:  # noqa: BLE001 - a setting this ansible-core does not have, or cannot read: its default
        return None


def _paths(first: list[str], configured: Any) -> str:
    out: list[str] = []
    for path in [*first, *(configured or [])]:
        if str(path) not in out:
            out.append(str(path))
    return os.pathsep.join(out)


def ansible_environment(config: Path | None = None) -> dict[str, str]:
    """The environment ansible-playbook and ansible run with: the configuration file by name, this collection
    and its roles ahead of the configured paths, the report callback with the configured callbacks, and the
    configured host_key_checking (ansible-runner sets it off unless the environment names it)."""
    config = ansible_config() if config is None else config
    manager = _config_manager(config)
    env = {
        "ANSIBLE_COLLECTIONS_PATH": _paths([str(collection.COLLECTIONS_DIR)], _setting(manager, "COLLECTIONS_PATHS")),
        "ANSIBLE_ROLES_PATH": _paths([str(collection.ROOT / "roles")], _setting(manager, "DEFAULT_ROLES_PATH")),
        "ANSIBLE_CALLBACKS_ENABLED": ",".join(
            dict.fromkeys([*(_setting(manager, "CALLBACKS_ENABLED") or []), REPORT_CALLBACK])),
        "ANSIBLE_HOST_KEY_CHECKING": "True" if _setting(manager, "HOST_KEY_CHECKING") is not False else "False",
    }
    if config is not None:
        env["ANSIBLE_CONFIG"] = str(config)
    return env


def default_inventories() -> list[Path]:
    """The inventory sources the Ansible configuration names (ansible_config: its inventory setting, or
    ANSIBLE_INVENTORY), those that exist; BadInput when none does."""
    config = ansible_config()
    configured = [Path(p) for p in _setting(_config_manager(config), "DEFAULT_HOST_LIST") or []]
    found = [p.resolve() for p in configured if p.exists()]
    if not found:
        where = str(config) if config is not None else "no ansible.cfg found"
        names = ", ".join(str(p) for p in configured) or "none"
        raise BadInput(f"No inventory given, and none that the Ansible configuration ({where}) names exists "
                       f"({names}): pass -i with a file or directory.")
    return found


def default_inventory() -> Path | None:
    """The first inventory the Ansible configuration names (the clone's ansible.cfg: the lab), or None."""
    try:
        return default_inventories()[0]
    except BadInput:
        return None


def inventory_sources(inventory: str | Path | None) -> list[Path]:
    """-i as a path that exists, or the configuration's inventories; BadInput otherwise."""
    if inventory is None:
        return default_inventories()
    path = Path(inventory).expanduser().resolve()
    if not path.exists():
        raise BadInput(f"The inventory {inventory} does not exist: pass -i with a file or directory that does.")
    return [path]


def inventory_path(inventory: str | Path | None) -> Path:
    """The (first) inventory a run uses: -i, or the one the Ansible configuration names; BadInput otherwise."""
    return inventory_sources(inventory)[0]


def _runner_inventory(sources: list[Path]) -> str | list[str]:
    return str(sources[0]) if len(sources) == 1 else [str(p) for p in sources]


def _project_dir(config: Path | None) -> str:
    """Where ansible-playbook runs: the clone when its own ansible.cfg applies (the paths in it are the clone's),
    else the operator's directory, as if they ran ansible-playbook themselves."""
    if config is not None and config == collection.ANSIBLE_CFG:
        return str(collection.ROOT)
    return os.getcwd()


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
    vault: Vault | None = None,
    skip_tags: str | None = None,
    check: bool = False,
) -> RunResult:
    """Run playbooks/<name> on the inventory and return how it ended; BadInput before anything runs. skip_tags is
    ansible-playbook's --skip-tags; check its --check."""
    import ansible_runner

    playbook = playbook_path(name)
    hosts = inventory_sources(inventory)
    path = search_path()
    config = ansible_config()
    vault = vault or Vault()
    with tempfile.TemporaryDirectory(prefix="moefleet-run-") as data_dir:
        interrupt = Interrupt(Path(data_dir) / "stop-requested", notice)

        def handle(event: dict[str, Any]) -> bool:
            if on_event is not None:
                on_event(event)
            return True  # keep the event: ansible-runner reads the stats from it

        envvars = {
            "PATH": path,
            **ansible_environment(config),
            "MOEFLEET_STOP_FILE": str(interrupt.stop_file),
        }
        previous = signal.signal(signal.SIGINT, interrupt)
        try:
            runner = ansible_runner.run(
                private_data_dir=data_dir,
                project_dir=_project_dir(config),
                playbook=str(playbook),
                inventory=_runner_inventory(hosts),
                limit=limit,
                skip_tags=skip_tags,
                extravars=dict(extravars or {}),
                envvars=envvars,
                cmdline=" ".join(filter(None, [vault.cmdline(), "--check" if check else None])) or None,
                passwords=vault.passwords(),
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
    vault: Vault | None = None,
) -> AdhocResult:
    """Run one read-only module on ``pattern`` (``ansible PATTERN -m MODULE -a ARGS``) through ansible-runner,
    with the same configuration, collection and environment as run_playbook; BadInput before anything runs."""
    import ansible_runner

    hosts = inventory_sources(inventory)
    path = search_path()
    config = ansible_config()
    vault = vault or Vault()
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

    envvars = {"PATH": path, **ansible_environment(config)}
    with tempfile.TemporaryDirectory(prefix="moefleet-run-") as data_dir:
        result = ansible_runner.run(
            private_data_dir=data_dir,
            project_dir=_project_dir(config),
            module=module,
            module_args=module_args,
            host_pattern=pattern,
            inventory=_runner_inventory(hosts),
            limit=limit,
            extravars=dict(extravars or {}),
            envvars=envvars,
            cmdline=vault.cmdline(),
            passwords=vault.passwords(),
            event_handler=handle,
            settings={"suppress_ansible_output": True},
            quiet=True,
        )
    return AdhocResult(ok, unreachable, failed, result.status, result.rc)
