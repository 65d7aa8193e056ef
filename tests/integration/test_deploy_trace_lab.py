"""The path a deploy takes through the code (issue 21): on itest-1 of the lab_inventory fixture, serving tp8,
`deploy.yml -e profile=tp2ep4` traced by tests/callbacks/task_files.py, task file by task file. A reader who
follows it reads at most 25 task files, at most 5 of them the sglang_service role's (its tasks/main.yml steps,
docs/architecture.md), and comes back to a file already left at most twice (none inside sglang_service). (25 since
issue 24: the refusal of a host the fault watcher found unfit, roles/moefleet_common/tasks/fit.yml, and the watcher,
roles/fault_watch/tasks/main.yml, are one file each; 23 were read before.) A rollout behind the gateway is traced per
worker by test_router_lab.py's key rotation (no file entered more than twice by one worker).

The traced switch runs the whole path. Before it, a serve-only deploy of tp8 only where itest-1 serves nothing (the
installed-base image, as in make check's lab-deploy job) or serves tp2ep4 already. It runs last in this directory
(conftest.py) and leaves itest-1 serving tp2ep4.

Cost (a fresh-clone make test, beside two other jobs): 123 s with the tp8 deploy, which the lab job no longer runs
(the tests before leave itest-1 serving another profile; ~40 s and ~20 CPU-seconds less).

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 66 s wall, 19 CPU-s on the controller (the profile switch only:
itest-1 already served).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "callbacks"))
from playbook import SERVE_ONLY, on_host, run_playbook  # noqa: E402  (tests/playbook.py)
from task_files import summarize  # noqa: E402  (tests/callbacks/task_files.py)

HOST = "itest-1"
LAB_HOSTS = 1  # the lab_inventory fixture's hosts this file needs: itest-1 (--limit in deploy())
ROLE = "roles/sglang_service/"


def deploy(inventory: Path, profile: str, *options: str):
    result = run_playbook(inventory, "deploy.yml", f"profile={profile}",
                          options=("--limit", f"{HOST},localhost", *options), timeout=1800)
    print(result.stdout[-6000:], result.stderr[-3000:])  # shown when a test fails
    assert result.returncode == 0, result.stdout[-3000:]
    return result


def test_a_profile_switch_reads_each_file_once(lab_inventory, tmp_path, monkeypatch):
    # A switch needs a host that serves another profile. In the lab job the tests before leave itest-1 serving one;
    # alone (make check's lab-deploy) the host is from the installed base and serves nothing yet: tp8 first, serve-only.
    # Only the traced switch runs the whole path.
    facts = on_host(lab_inventory, HOST, "cat /etc/ansible/facts.d/moefleet.fact 2>/dev/null")
    serving = json.loads(facts).get("serving_profile") if facts.strip() else None
    active = on_host(lab_inventory, HOST, "systemctl is-active sglang.service").strip() == "active"
    if not active or serving in (None, "tp2ep4"):
        deploy(lab_inventory, "tp8", *SERVE_ONLY)
    assert on_host(lab_inventory, HOST, "systemctl is-active sglang.service").strip() == "active"
    trace = tmp_path / "trace.json"
    # run_playbook passes the environment on; the repository's own callback stays enabled beside the tracer
    monkeypatch.setenv("ANSIBLE_CALLBACK_PLUGINS", str(ROOT / "tests" / "callbacks"))
    monkeypatch.setenv("ANSIBLE_CALLBACKS_ENABLED", "moefleet.serving.moefleet_report,task_files")
    monkeypatch.setenv("MOEFLEET_TASK_TRACE", str(trace))
    deploy(lab_inventory, "tp2ep4")
    found = summarize(json.loads(trace.read_text())["tasks"], str(ROOT))
    print("task files entered, in order:")
    seen = set()
    for n, name in enumerate(found["entries"], 1):
        print(f"  {n:3} {name}{'   (again)' if name in seen else ''}")
        seen.add(name)
    role_files = [f for f in found["files"] if f.startswith(ROLE)]
    role_reentries = [f for f in found["reentries"] if f.startswith(ROLE)]
    print(f"{len(found['files'])} task files, {len(role_files)} of them sglang_service's; "
          f"{len(found['reentries'])} re-entries ({len(role_reentries)} inside sglang_service): {found['reentries']}")
    assert len(found["files"]) <= 25, found["files"]
    assert len(role_files) <= 5, role_files
    assert role_reentries == [], found["entries"]
    assert len(found["reentries"]) <= 2, found["entries"]
    # the start succeeded and serves what was asked
    facts = json.loads(on_host(lab_inventory, HOST, "cat /etc/ansible/facts.d/moefleet.fact"))
    assert (facts["asked_profile"], facts["serving_profile"], facts["outcome"]) == ("tp2ep4", "tp2ep4", "ready")
