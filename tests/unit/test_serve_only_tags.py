"""`--skip-tags install` (moefleet deploy/rollout --serve-only): what a deploy on an installed host leaves out, read
from ansible-playbook's own --list-tasks. It drops every step of the install roles (nvidia_driver, cuda_toolkit,
sglang, sglang_model) except their checks of what is installed, and nothing else: the validation, the fit, the
service's steps and the routers' drain and put-back all stay. The lab runs it for real (the fault scenarios, the fleet,
the router rollouts and `moefleet deploy --serve-only` in tests/integration/test_status_history_lab.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from moefleet.commands.rollout import SERVE_ONLY_SKIP_TAGS

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INSTALL_ROLES = ("nvidia_driver", "cuda_toolkit", "sglang", "sglang_model")
# The one step of each install role that reads what is installed: its tag, which --serve-only keeps.
VERIFY_TAGS = {"nvidia_driver": "verify", "cuda_toolkit": "verify", "sglang": "sglang_verify",
               "sglang_model": "sglang_model_verify"}


def listed(*options: str) -> list[tuple[str, set[str]]]:
    """(task name, its tags) for each task deploy.yml would run, in order."""
    out = subprocess.run([str(BIN / "ansible-playbook"), "--list-tasks", "-i", "inventory/example/hosts.yml",
                          "deploy.yml", *options], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    return [(name.strip(), set(filter(None, (t.strip() for t in tags.split(",")))))
            for name, tags in re.findall(r"^ {6}(\S.*?)\tTAGS: \[(.*)\]$", out, re.M)]


@pytest.fixture(scope="module")
def tasks() -> tuple[list, list]:
    return listed(), listed("--skip-tags", SERVE_ONLY_SKIP_TAGS)


def _names(role: str) -> set[str]:
    import yaml

    found: set[str] = set()

    def walk(items) -> None:
        for item in items or []:
            found.add(item.get("name", ""))
            for key in ("block", "rescue", "always"):
                walk(item.get(key))

    for path in (ROOT / "roles" / role / "tasks").glob("*.yml"):
        walk(yaml.safe_load(path.read_text()))
    return found


# --list-tasks writes "role : name" for a role's tasks, but the bare name for its include_role tasks.
NAMES = {role: _names(role) for role in INSTALL_ROLES}


def role_of(name: str) -> str | None:
    if " : " in name:
        return name.split(" : ", 1)[0]
    return next((role for role, names in NAMES.items() if name in names), None)


def test_serve_only_leaves_out_only_the_install_roles_install_steps(tasks):
    full, served = tasks
    left_out = [(name, tags) for name, tags in full if (name, tags) not in served]
    assert left_out, "--skip-tags install left nothing out: the install roles lost their tag"
    for role in INSTALL_ROLES:
        assert any(role_of(name) == role for name, _ in left_out), f"nothing of {role} is left out"
    for name, tags in left_out:
        assert role_of(name) in INSTALL_ROLES, f"--serve-only would skip a task outside the install roles: {name}"
        assert VERIFY_TAGS[role_of(name)] not in tags, f"--serve-only would skip a check: {name}"


def test_serve_only_keeps_each_install_roles_checks(tasks):
    full, served = tasks
    for role, tag in VERIFY_TAGS.items():
        checks = [(name, tags) for name, tags in full if role_of(name) == role and tag in tags]
        assert checks, f"{role} has no task tagged {tag}"
        assert all(check in served for check in checks), f"--serve-only skips {role}'s checks"
    for name, tags in served:  # the argument-spec checks are tagged always
        if role_of(name) in INSTALL_ROLES and "always" not in tags:
            assert VERIFY_TAGS[role_of(name)] in tags, f"--serve-only runs {name}, which is not a check"
