"""moefleet diagnose: exit codes, JSON shape, sentences on bad input."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from moefleet.cli import main

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang-logs"
OOM_LOG = LOGS / "14-oom_weight_load-gemma3-12b-4070tisuper-create-weights.log"
READY_LOG = LOGS / "18-ready-qwq32b-tp4-pcie-avail-mem-2.09.log"
HANG_LOG = LOGS / "22-hang-rtx6000ada-tp2-stuck-nccl-init.log"


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["diagnose", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_ready_log_exits_0(capsys):
    code, out, _ = _run(capsys, READY_LOG)
    assert code == 0
    assert out.startswith("state:") and "ready" in out


def test_oom_log_exits_1_and_says_phase_gpu_sizes_and_advice(capsys):
    code, out, _ = _run(capsys, OOM_LOG)
    assert code == 1
    assert "oom in phase weight_load" in out
    assert "gpu:" in out and "0 (rank TP0)" in out
    assert "tried to allocate 114.00 MiB, 54.38 MiB free, of 15.58 GiB total" in out
    assert "torch.OutOfMemoryError" in out
    assert "--mem-fraction-static will not help" in out


def test_json_shape(capsys):
    code, out, _ = _run(capsys, OOM_LOG, "--json")
    assert code == 1
    result = json.loads(out)
    assert {"state", "oom", "cause", "line", "advice"} <= set(result)
    assert result["state"] == "oom" and result["cause"] is None
    assert {"phase", "gpu", "tried_to_allocate_mib", "free_mib", "capacity_gib"} <= set(result["oom"])
    assert result["oom"]["phase"] == "weight_load"
    assert result["oom"]["tried_to_allocate_mib"] == 114.0


def test_json_for_a_crash_has_no_oom_and_a_cause(capsys):
    code, out, _ = _run(capsys, LOGS / "13-crash_other-r9700-qwen35-reap-keyerror-load-weights.log", "--json")
    result = json.loads(out)
    assert code == 1
    assert result["oom"] is None and result["state"] == "crashed" and result["cause"] == "bad_weights"
    assert result["line"].startswith("KeyError")


def test_stdin(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(OOM_LOG.read_bytes())))
    code, out, _ = _run(capsys, "-", "--json")
    assert code == 1 and json.loads(out)["state"] == "oom"


def test_a_log_that_ends_while_starting_is_incomplete(capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(HANG_LOG.read_bytes())
    code, out, _ = _run(capsys, log, "--json", "--hang-seconds", "600")
    result = json.loads(out)
    assert code == 1
    assert (result["state"], result["incomplete"]) == ("starting", True)  # freshly written: not hung yet
    assert "--hang-seconds" in result["advice"]


def test_an_old_log_that_ends_while_starting_is_hung_with_hang_seconds(capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(HANG_LOG.read_bytes())
    old = time.time() - 3600
    os.utime(log, (old, old))
    code, out, _ = _run(capsys, log, "--json", "--hang-seconds", "600")
    result = json.loads(out)
    assert code == 1
    assert (result["state"], result["phase"]) == ("hung", "nccl_init")


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: d / "missing.log", "no such file"),
        (lambda d: d, "is a directory"),
        (lambda d: (d / "core").write_bytes(b"\x7fELF\x00\x00\x01") and d / "core", "looks binary"),
        (lambda d: (d / "empty.log").write_text("") or d / "empty.log", "is empty"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(capsys, tmp_path, make, words):
    path = make(tmp_path)
    code, out, err = _run(capsys, path)
    assert code == 2
    assert out == ""
    assert words in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_exits_2(capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("x\n")
    log.chmod(0)
    code, _, err = _run(capsys, log)
    assert code == 2 and "permission denied" in err


@pytest.mark.parametrize("seconds", ["0", "-5", "nan", "inf"])
def test_bad_hang_seconds_exits_2(capsys, seconds):
    code, _, err = _run(capsys, READY_LOG, "--hang-seconds", seconds)
    assert code == 2 and err.startswith(f"moefleet diagnose: --hang-seconds {seconds} is not usable")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
