"""Fixtures for integration tests that run the product's playbooks on the simulated lab."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB_PY = ROOT / "sim" / "lab" / "lab.py"
VENV_BIN = Path(sys.executable).parent


def _run(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, text=True, capture_output=True)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                    f"{result.stderr[-3000:]}")


def _hosts_needed(session: pytest.Session) -> int:
    """Two (itest-1, itest-2), unless every lab test of the session is in a module whose LAB_HOSTS says it needs
    fewer: make check's lab-deploy job runs test_deploy_trace_lab.py alone, on itest-1 (a host less to boot and
    prepare)."""
    modules = {item.module for item in session.items if item.get_closest_marker("lab")}
    return max((getattr(module, "LAB_HOSTS", 2) for module in modules), default=2)


@pytest.fixture(scope="session")
def lab_inventory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A private lab of two hosts (itest-1, itest-2; one where the session's tests need only itest-1), fresh for
    the session: its inventory path."""
    if not shutil.which("podman") and not shutil.which("apt-get"):
        pytest.skip("the lab needs podman (sim/lab/lab.py installs it with apt-get)")
    base = tmp_path_factory.mktemp("lab")
    inventory = base / "hosts.yml"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    _run(sys.executable, LAB_PY, "down", "--name", "itest", "--inventory", inventory)  # leftovers of a killed run
    _run(sys.executable, LAB_PY, "image")
    _run(sys.executable, ROOT / "sim" / "mirrors" / "build.py")
    # from the installed-base image (lab.py installed): the install path runs from bare in molecule's default and
    # install scenarios
    _run(sys.executable, LAB_PY, "up", "--name", "itest", "--hosts", str(_hosts_needed(request.session)),
         "--installed", "--inventory", inventory)
    _run(VENV_BIN / "ansible-playbook", "-i", inventory, ROOT / "sim" / "playbooks" / "prepare.yml", env=env)
    yield inventory
    _run(sys.executable, LAB_PY, "down", "--name", "itest", "--inventory", inventory)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The bench sweep runs right after the rollout tests, on the host they leave installed and serving, so it
    needs no deploy of its own first (about 3.5 minutes less on a fresh lab). Every catalog profile's deploy, then
    the traced deploy, run last: they leave itest-1 on another profile than the rollout tests ask for, which they
    would refuse without confirm. The upgrade to SGLang 0.5.23 (make test-upgrade) runs after them all: it leaves
    itest-1 on it."""
    trace = [i for i in items if i.path.name in ("test_catalog_profiles_lab.py", "test_deploy_trace_lab.py")]
    trace.sort(key=lambda i: i.path.name != "test_catalog_profiles_lab.py")
    trace += [i for i in items if i.path.name == "test_upgrade_lab.py"]
    items[:] = [i for i in items if i not in trace]
    bench = [i for i in items if i.path.name == "test_bench_lab.py"]
    rest = [i for i in items if i.path.name != "test_bench_lab.py"]
    rollout = [n for n, i in enumerate(rest) if i.path.name == "test_rollout_status_lab.py"]
    if bench and rollout:
        items[:] = rest[: rollout[-1] + 1] + bench + rest[rollout[-1] + 1 :]
    items += trace
