"""Runs after test_default.py: --check previews a switch to ep8 without changing anything, then the
switch itself changes the unit and the serving layout."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import SERVE_ONLY, run_playbook  # noqa: E402

KEY = "sglang_service_api_key=molecule-test-key-7f3a"  # as converge.yml set it


def deploy(host, *extra_vars: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """deploy.yml on the host under test only: the scenario's other host (another OS) is switched by its own test."""
    return run_playbook(os.environ["MOEFLEET_LAB_INVENTORY"], "deploy.yml", *extra_vars,
                        options=("--limit", f"{host.backend.get_hostname()},localhost", *options))


def unit_and_invocation(host) -> tuple[str, str]:
    return (host.file("/etc/systemd/system/sglang.service").content_string,
            host.check_output("systemctl show -p InvocationID --value sglang.service"))


def test_check_mode_previews_the_switch_and_changes_nothing(host):
    """The preview an operator asks for before switching installed hosts (`moefleet deploy --serve-only --check`):
    the unit's new command line in the diff, nothing changed. The install roles' check mode has its own runs: the
    scenario's check step on the bare hosts, before converge. (Until 2026-12-05 this preview ran the whole path in
    check mode, 63-75 s a host in the suite; serve-only, it takes about a third of that.)"""
    before = unit_and_invocation(host)
    run = deploy(host, "profile=ep8", KEY, options=("--check", "--diff", *SERVE_ONLY))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "+ExecStart=" in run.stdout and "--ep-size 8" in run.stdout
    assert unit_and_invocation(host) == before


def test_switch_to_ep8_changes_unit_and_serving_layout(host):
    before_unit, before_invocation = unit_and_invocation(host)
    # converge and idempotence ran the whole path on this host: the switch changes only what serves (--serve-only)
    run = deploy(host, "profile=ep8", KEY, options=SERVE_ONLY)
    assert run.returncode == 0, run.stdout[-3000:]
    unit, invocation = unit_and_invocation(host)
    assert unit != before_unit and invocation != before_invocation
    assert "--tp-size 8 --ep-size 8" in unit
    key = KEY.split("=", 1)[1]
    info = json.loads(host.check_output(f"curl -sf -H 'Authorization: Bearer {key}' http://127.0.0.1:30000/server_info"))
    assert (info["tp_size"], info["ep_size"]) == (8, 8)
    facts = json.loads(host.file("/etc/ansible/facts.d/moefleet.fact").content_string)
    assert (facts["asked_profile"], facts["serving_profile"], facts["outcome"]) == ("ep8", "ep8", "ready")
