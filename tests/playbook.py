"""How the tests, the molecule scenarios' testinfra tests and the bench run a playbook: the repository's
ansible-playbook and ansible.cfg, from the repository root, output captured without colour (molecule
exports ANSIBLE_FORCE_COLOR=true, which wins over ANSIBLE_NOCOLOR, so it is turned off explicitly); and how
they run a command on a lab host: ssh with the ssh_config sim/lab/lab.py wrote for the inventory."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from moefleet.commands.rollout import SERVE_ONLY_SKIP_TAGS

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# ansible-playbook's options for a serve-only deploy or rollout, as `moefleet deploy|rollout --serve-only` runs them
SERVE_ONLY = ("--skip-tags", SERVE_ONLY_SKIP_TAGS)


def run_playbook(inventory: str | Path, playbook: str | Path, *extra_vars: str, options: tuple[str, ...] = (),
                 timeout: float | None = None) -> subprocess.CompletedProcess:
    """``ansible-playbook -i INVENTORY ROOT/PLAYBOOK -e V ... OPTIONS``; text output captured."""
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / playbook)]
    for value in extra_vars:
        cmd += ["-e", value]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    return subprocess.run([*cmd, *options], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


_MODULE_LOCK = threading.Lock()


def _loaded(name: str, path: Path):
    """The Python file at PATH as module NAME, loaded once."""
    with _MODULE_LOCK:  # tests/suite.py's CPU sampler asks from its own thread: never a half-loaded module
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        return sys.modules[name]


def lab_module():
    """sim/lab/lab.py as a module: its ssh_config_path() is the one place that says where the ssh_config of an
    inventory's hosts lives."""
    return _loaded("moefleet_lab", ROOT / "sim" / "lab" / "lab.py")


def bench_module():
    """tests/bench/run.py (`make bench`) as a module (its name, run, is too common to import by path entry): the lab
    tests that run a bench part's measurement at its smallest size print its row with it."""
    return _loaded("moefleet_bench_run", ROOT / "tests" / "bench" / "run.py")


def ssh_config_path(inventory: str | Path) -> Path:
    """The ssh_config sim/lab/lab.py wrote for this inventory's hosts (outside the inventory directory)."""
    return lab_module().ssh_config_path(Path(inventory))


def on_host(inventory: str | Path, host: str, command: str, timeout: float = 300) -> str:
    """Run a shell command on a lab host over ssh; its stdout followed by its stderr."""
    result = subprocess.run(["ssh", "-F", str(ssh_config_path(inventory)), host, command], text=True,
                            capture_output=True, timeout=timeout)
    return result.stdout + result.stderr


def journal_times(inventory: str | Path, host: str, identifier: str) -> list[float]:
    """When each run of an Ansible module logged itself on a lab host (its journal, in seconds since the epoch):
    ``identifier`` is the module's syslog tag, ansible-ansible.builtin.pip for instance."""
    out = on_host(inventory, host, f"journalctl -t {identifier} -o json --output-fields=__REALTIME_TIMESTAMP")
    return [int(json.loads(line)["__REALTIME_TIMESTAMP"]) / 1e6 for line in out.splitlines() if line.startswith("{")]


def no_host_contacted(run: subprocess.CompletedProcess, first_changing_play: str) -> str:
    """A playbook run on hosts that must never be contacted (TEST-NET addresses): no host was reached, and the first
    play that would change a host (its PLAY title's start) never began. The output, whitespace folded."""
    recap = run.stdout.split("PLAY RECAP")[-1]
    assert "UNREACHABLE!" not in run.stdout and "unreachable=1" not in recap, "a host was contacted"
    assert "unreachable=0" in recap, run.stdout[-3000:]
    assert f"PLAY [{first_changing_play}" not in run.stdout, f"{first_changing_play!r} started"
    return " ".join(run.stdout.split())
