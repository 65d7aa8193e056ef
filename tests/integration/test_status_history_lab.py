"""moefleet deploy, status and history on one lab host (itest-2 of the lab_inventory fixture): a deploy of ep8 whose
start runs out of memory, with no fallback left, puts the unit that served back (outcome restored); then
`moefleet status` exits 1 naming the host restored, and `moefleet history` shows the start that served and the
start that failed, with the restore, in UTC.

Runs after the rollout and secrets tests of this directory when they share a session (they leave itest-2 serving
tp8); alone, it deploys tp8 there first with `moefleet deploy`. It leaves itest-2 serving tp8 (restored), which is
what the uninstall test after it expects.

Cost (a fresh-clone make test, beside two other jobs): 87 s (a serve-only deploy of ep8 that is restored, then status
and history).

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 78 s wall, 27 + 17 CPU-s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest

from moefleet import cli

pytestmark = pytest.mark.lab

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
STATUS_SCHEMA = json.loads((SCHEMAS / "status.schema.json").read_text())
HISTORY_SCHEMA = json.loads((SCHEMAS / "history.schema.json").read_text())
HOST = "itest-2"
OOM_ON_EP8 = json.dumps({"sim_faults": [{"fault": "oom_weight_load", "profile": "ep8"}]})


def moefleet(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    with capsys.disabled():  # shown as it comes (pytest -s), and not captured into the next command's output
        print(captured.out, captured.err)
    return code, captured.out, captured.err


def test_a_restored_deploy_is_drift_in_status_and_two_starts_in_history(lab_inventory, tmp_path, capsys):
    started = time.monotonic()
    inventory = str(lab_inventory)
    code, out, _ = moefleet(capsys, "history", HOST, "-i", inventory, "--json")
    before = json.loads(out) if code == 0 else {}
    if (before.get("serving_profile"), before.get("outcome")) != ("tp8", "ready"):
        code, out, err = moefleet(capsys, "deploy", "-i", inventory, "-l", HOST, "-e", "profile=tp8", "--yes",
                                  "--report", str(tmp_path / "tp8"))
        assert code == 0, out + err
    deployed = time.monotonic()

    # the host is installed: only what serves changes (--serve-only skips the install steps, about half a deploy)
    code, out, err = moefleet(capsys, "deploy", "-i", inventory, "-l", HOST, "-e", "profile=ep8", "-e", OOM_ON_EP8,
                              "--yes", "--serve-only", "--report", str(tmp_path / "ep8"))
    assert code == 1, out + err
    assert f"{HOST:<16} rolled back" in out
    report = json.loads((tmp_path / "ep8.json").read_text())
    assert report["playbook"] == "deploy.yml"
    assert [(h["host"], h["outcome"], h["serving_profile"]) for h in report["hosts"]] == [(HOST, "restored", "tp8")]
    restored = time.monotonic()

    code, out, _ = moefleet(capsys, "status", "-i", inventory, "-l", HOST)
    assert code == 1
    row = next(line.split() for line in out.splitlines() if line.startswith(HOST))
    assert row[:5] == [HOST, "tp8", "ep8", "restored", "serving"]
    assert f"0 of 1 host serves what it was asked; {HOST} restored to tp8 (asked ep8)" in out
    code, out, _ = moefleet(capsys, "status", "-i", inventory, "-l", HOST, "--json")
    document = json.loads(out)
    jsonschema.validate(document, STATUS_SCHEMA)
    assert code == 1 and [(h["host"], h["state"]) for h in document["hosts"]] == [(HOST, "restored")]
    assert document["hosts"][0]["updated"].endswith("+00:00")

    code, out, _ = moefleet(capsys, "history", HOST, "-i", inventory, "--json")
    assert code == 0
    history = json.loads(out)
    jsonschema.validate(history, HISTORY_SCHEMA)
    starts = [(s["kind"], s["profile"], s["outcome"]) for s in history["starts"] if s["kind"] != "while serving"]
    assert starts[-3:] == [("start", "tp8", "ready"), ("start", "ep8", "oom"), ("restore", "tp8", "ready")]
    failed = [s for s in history["starts"] if s["kind"] == "start"][-1]
    assert failed["time"].endswith("+00:00") and failed["phase"] and failed["nccl_set"]
    code, out, _ = moefleet(capsys, "history", HOST, "-i", inventory)
    lines = out.splitlines()
    assert lines[0] == f"{HOST}: asked ep8, serving tp8, outcome restored (recorded {lines[0].split('recorded ')[1]}"
    rows = [line.split() for line in lines[3:]]
    assert ["UTC", "start", "ep8"] in [r[2:5] for r in rows] and ["UTC", "restore", "tp8"] in [r[2:5] for r in rows]
    print(f"measured: deploy tp8 {deployed - started:.0f} s (0 when the host served it), ep8 deploy restored "
          f"{restored - deployed:.0f} s, status and history {time.monotonic() - restored:.0f} s")
