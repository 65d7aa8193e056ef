"""playbooks/uninstall.yml on one lab host (itest-2 of the lab_inventory fixture): --check changes nothing and
says what it would remove, a run without -e confirm=yes is refused naming the host, and the confirmed run
leaves no unit, drop-in, state, facts, hooks, venv or service user, and keeps the model.

Runs last among this directory's lab tests (file order), on the host the rollout and secrets tests leave
serving; alone, it deploys tp8 there first. It leaves itest-2 uninstalled: no later test uses the fixture's
hosts, and the fixture removes the lab at the end of the session.

Cost (a fresh-clone make test, beside two other jobs): 66 s (--check, the refusal, the removal).

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 85 s wall, 22 + 31 CPU-s.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from moefleet import cli

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import on_host, run_playbook  # noqa: E402  (tests/playbook.py)

HOST = "itest-2"
MODEL = "/srv/models/Kimi-K2.6"  # inventory/sim/group_vars/all.yml: sglang_model_path
REMOVED = [
    "/etc/systemd/system/sglang.service",
    "/etc/systemd/system/sglang.service.d/moefleet-serving.conf",
    "/etc/sglang/credentials/sglang-secrets.yaml",
    "/etc/sglang/sglang.env",
    "/var/lib/moefleet",
    "/etc/ansible/facts.d/moefleet.fact",
    "/usr/local/libexec/moefleet/sglang-runtime-exit",
    "/usr/local/lib/moefleet/sglang_log.py",
    "/opt/sglang/0.5.10/bin/python",  # roles/sglang: the pinned release's virtualenv, under sglang_venvs_dir
    "/opt/sglang",
    "/var/lib/sglang",
]
# What the snapshot reads on the host: each path's presence, size and mtime, the unit's state, the user.
SNAPSHOT = (
    "for p in " + " ".join([*REMOVED, f"{MODEL}/config.json"]) + "; do "
    "if test -e $p; then echo \"present $p $(stat -c '%s %Y' $p)\"; else echo \"absent $p\"; fi; done; "
    "ls /etc/systemd/system | grep -c '^sglang.service' || true; "
    "systemctl is-active sglang.service || true; "
    "getent passwd sglang >/dev/null && echo 'user sglang' || echo 'no user sglang'; "
    "getent group sglang >/dev/null && echo 'group sglang' || echo 'no group sglang'"
)


def playbook(inventory: Path, book: str, *args: str, limit: str = HOST) -> subprocess.CompletedProcess:
    result = run_playbook(inventory, book, options=("--limit", limit, *args), timeout=900)
    print(result.stdout[-6000:], result.stderr[-3000:])  # shown when a test fails
    return result


def test_uninstall_check_refusal_then_removal_keeps_the_model(lab_inventory, capsys):
    started = time.monotonic()
    if on_host(lab_inventory, HOST, "systemctl is-active sglang.service").strip() != "active":
        deployed = playbook(lab_inventory, "deploy.yml", "-e", "profile=tp8", limit=f"{HOST},localhost")
        assert deployed.returncode == 0, "the deploy before the uninstall failed"
    deployed_at = time.monotonic()
    before = on_host(lab_inventory, HOST, SNAPSHOT)
    assert f"present {REMOVED[0]}" in before and "\nactive\n" in before and "user sglang" in before, before

    # moefleet rollout --check reads the same host without touching it (and prints what the README shows)
    code = cli.main(["rollout", "-i", str(lab_inventory), "-l", HOST, "-e", "profile=ep8", "--check"])
    plan = capsys.readouterr().out
    print(plan)
    assert code == 0 and f"canary:\n  {HOST}  restart: serves tp8, asked ep8" in plan
    assert on_host(lab_inventory, HOST, SNAPSHOT) == before

    checked = playbook(lab_inventory, "playbooks/uninstall.yml", "--check")
    said = " ".join(checked.stdout.split())  # the YAML callback folds long messages
    assert checked.returncode == 0
    assert f"Would remove from {HOST}:" in said
    for path in ("/etc/systemd/system/sglang.service,", "/var/lib/moefleet,", "/opt/sglang/0.5.10,", "user sglang"):
        assert path in said, path
    assert f"Kept: {MODEL} (the model; -e remove_model=yes removes it)" in said
    assert on_host(lab_inventory, HOST, SNAPSHOT) == before  # check mode touched nothing

    refused = playbook(lab_inventory, "playbooks/uninstall.yml")
    assert refused.returncode != 0
    assert f"the service user from {HOST}. Rerun with -e confirm=yes" in " ".join(refused.stdout.split())
    assert on_host(lab_inventory, HOST, SNAPSHOT) == before

    removed = playbook(lab_inventory, "playbooks/uninstall.yml", "-e", "confirm=yes")
    assert removed.returncode == 0
    after = on_host(lab_inventory, HOST, SNAPSHOT)
    for path in REMOVED:
        assert f"absent {path}" in after, path
    assert f"present {MODEL}/config.json" in after
    assert "no user sglang" in after and "no group sglang" in after
    assert "\n0\n" in after  # no sglang.service* left in /etc/systemd/system (backups included)
    assert on_host(lab_inventory, HOST, "systemctl cat sglang.service >/dev/null 2>&1 && echo known || echo unknown"
                   ).strip() == "unknown"

    again = playbook(lab_inventory, "playbooks/uninstall.yml", "-e", "confirm=yes")
    assert again.returncode == 0 and "nothing (already removed)" in " ".join(again.stdout.split())
    took = time.monotonic() - deployed_at
    print(f"uninstall test: deploy first {deployed_at - started:.0f} s, uninstall steps {took:.0f} s")
