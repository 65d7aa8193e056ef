"""roles/sglang_service/files/sglang-runtime-exit (ExecStopPost= once the service served): what it records.

The hook runs here as systemd runs it, with SERVICE_RESULT / EXIT_* / INVOCATION_ID in its environment and a
journalctl stand-in on PATH that prints the invocation's journal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "roles" / "sglang_service" / "files" / "sglang-runtime-exit"
LIB = ROOT / "plugins" / "module_utils"
LOGS = ROOT / "tests" / "data" / "sglang-logs"
READY = "[2026-12-01 07:00:00] The server is fired up and ready to roll!\n"
# SGLang 0.5.10's graceful exit, as tokenizer_manager.py logs it before kill_process_tree SIGKILLs the server
DRAINED = (READY + "[2026-12-01 07:05:00] SIGTERM received. signum=None frame=None. Draining requests and shutting "
           "down...\n[2026-12-01 07:05:03] Gracefully exiting... Remaining number of requests 0. Remaining requests "
           "remaining_rids=[].\n")


def hook(tmp_path: Path, journal: str, result: str = "signal") -> dict | None:
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "journal.txt").write_text(journal)
    fake = tmp_path / "bin" / "journalctl"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'journal.txt'}\n")
    fake.chmod(0o755)
    facts = tmp_path / "facts.d" / "moefleet_runtime.fact"
    (tmp_path / "last-good.json").write_text(json.dumps({"attempt": {"profile": "tp8"}}))
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SERVICE_RESULT=result,
               EXIT_CODE="killed", EXIT_STATUS="KILL", INVOCATION_ID="0123abcd")
    done = subprocess.run([sys.executable, HOOK, LIB, facts, tmp_path / "last-good.json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(facts.read_text()) if facts.exists() else None


def test_a_stop_sglang_drained_is_not_recorded_although_systemd_says_signal(tmp_path):
    assert hook(tmp_path, DRAINED) is None


def test_an_oom_while_serving_is_recorded_with_its_phase(tmp_path):
    oom = LOGS / "24-oom_runtime-llama4-scout-h100-tp8-400k-prefill-embedding.log"
    facts = hook(tmp_path, READY + oom.read_text())
    assert facts["last"]["state"] == "oom" and facts["last"]["result"] == "signal"
    assert facts["last"]["attempt"] == {"profile": "tp8"} and facts["ooms"] == 1


def test_a_kill_with_no_line_that_says_why_is_recorded_as_a_crash(tmp_path):
    facts = hook(tmp_path, READY)
    assert facts["last"]["state"] == "crashed"
    assert facts["last"]["cause"] == "the service ended (signal) without a line that says why"


def test_a_clean_stop_is_not_recorded(tmp_path):
    assert hook(tmp_path, READY, result="success") is None
