"""Logs as people paste them: collector prefixes, colour codes, journal exports, newest first, cut logs.

Each test feeds a real log from tests/data/sglang-logs the way a logger or viewer would have shown it,
or SGLang's own wording (model_executor/model_runner_kv_cache_mixin.py), and expects the verdict of the
plain log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils.sglang_log import (
    LogFollower,
    classify,
    is_log,
    newest_first,
)

from moefleet.cli import main

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang-logs"
REPO = Path(__file__).resolve().parents[2]
OOM = "14-oom_weight_load-gemma3-12b-4070tisuper-create-weights.log"
KV_OOM = "06-oom_kv_cache-deepseek-r1-tke-not-enough-memory.log"
READY = "18-ready-qwq32b-tp4-pcie-avail-mem-2.09.log"
CRASH = "13-crash_other-r9700-qwen35-reap-keyerror-load-weights.log"
SHIPPED = sorted(p.name for p in LOGS.glob("*.log"))


def _lines(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").split("\n")


def _answer(verdict) -> tuple:
    return (verdict.state, verdict.phase, verdict.cause, verdict.oom and verdict.oom.to_dict())


@pytest.mark.parametrize(
    "prefix",
    [
        "sglang-1  | ",  # docker compose v2
        "\x1b[36msglang-1  |\x1b[0m ",  # docker compose v2 with its colour
        "sglang_sglang_1  | ",  # docker compose v1
        "2025-11-29T16:00:01.123456789Z ",  # kubectl logs --timestamps, docker logs -t
        "[pod/sglang-0/server] 2025-11-29T16:00:01.123456789Z ",  # kubectl --prefix --timestamps
        "sglang-1  | 2025-11-29T16:00:01.123456789Z ",  # docker compose logs -t
        "Sat 2025-11-29 16:00:01 UTC gpu-01 python3[4242]: ",  # journalctl -o short-full
        "E 2025-11-29T16:00:01.123456Z ",  # GCP, severity letter first
        "ERROR 2025-11-29 16:00:01.123 UTC\t",  # GCP Logs Explorer copy
        "2025-11-29T16:00:01.123Z\t",  # CloudWatch
        "1764432001123\t",  # CloudWatch export, epoch milliseconds
    ],
)
@pytest.mark.parametrize("name", [OOM, KV_OOM, CRASH, READY])
def test_collector_prefixes_read_like_the_plain_log(prefix, name):
    plain = classify(_lines(name))
    prefixed = classify([prefix + line for line in _lines(name)])
    assert _answer(prefixed) == _answer(plain)
    assert prefixed.line == plain.line and prefixed.line_number == plain.line_number


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("\x1b[31m", "\x1b[0m"),  # as written to a terminal
        ("\\x1b[31m", "\\x1b[0m"),  # pasted from a repr
        ("\\033[1;31m", "\\033[0m"),
        ("\\u001b[33m", "\\u001b[0m"),  # from a JSON dump
        ("^[[0;32m", "^[[0m"),  # as less or a terminal copy shows ESC
    ],
)
@pytest.mark.parametrize("name", [OOM, CRASH])
def test_colour_codes_in_any_pasted_form_are_ignored(before, after, name):
    plain = classify(_lines(name))
    coloured = classify([f"{before}{line}{after}" if line else line for line in _lines(name)])
    assert _answer(coloured) == _answer(plain)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_log_exported_newest_first_reads_like_the_log(name):
    lines = _lines(name)
    assert not newest_first(lines)
    assert newest_first(lines[::-1]) or classify(lines).state in ("ready", "starting", "hung")
    assert _answer(classify(lines[::-1], idle_seconds=3600, hang_seconds=600)) == _answer(
        classify(lines, idle_seconds=3600, hang_seconds=600)
    )


def _journal_json(lines: list[str]) -> list[str]:
    return [
        json.dumps(
            {
                "__REALTIME_TIMESTAMP": str(1764432001000000 + i),
                "_SYSTEMD_UNIT": "sglang.service",
                "_PID": "4242",
                "PRIORITY": "6",
                "MESSAGE": line,
            }
        )
        for i, line in enumerate(lines)
        if line  # journald stores no empty messages
    ]


def test_a_journalctl_json_export_of_an_oom_reads_as_the_oom():
    verdict = classify(_journal_json(_lines(OOM)))
    assert (verdict.state, verdict.phase, verdict.oom.gpu, verdict.oom.tried_to_allocate_mib) == (
        "oom",
        "weight_load",
        0,
        114.0,
    )
    assert verdict.line.startswith("torch.OutOfMemoryError")


def test_journal_json_messages_stored_as_bytes_are_read():
    """journald stores a message that is not valid UTF-8 (tqdm's bars can be) as an array of bytes."""
    lines = _journal_json(_lines(OOM))
    oom_at = next(i for i, line in enumerate(lines) if "OutOfMemoryError" in line)
    entry = json.loads(lines[oom_at])
    entry["MESSAGE"] = list(entry["MESSAGE"].encode())
    lines[oom_at] = json.dumps(entry)
    assert classify(lines).state == "oom"


def test_a_journalctl_export_format_reads_as_the_log():
    export = []
    for i, line in enumerate(_lines(CRASH)):
        if line:
            export += [f"__CURSOR=s=1;i={i}", "_SYSTEMD_UNIT=sglang.service", f"MESSAGE={line}", ""]
    assert _answer(classify(export)) == _answer(classify(_lines(CRASH)))


def test_docker_json_file_lines_read_as_the_log():
    lines = [
        json.dumps({"log": line + "\n", "stream": "stderr", "time": "2025-11-29T16:00:01Z"}) for line in _lines(OOM)
    ]
    assert _answer(classify(lines)) == _answer(classify(_lines(OOM)))


# model_executor/model_runner_kv_cache_mixin.py, _resolve_token_capacity, with the profiled value <= 0
NO_KV_TOKENS = "max_total_tokens=20480 is larger than the profiled value -89624. Use the profiled value instead."
BEFORE_KV = [
    "[2026-02-11 06:44:50 TP0] Load weight begin. avail mem=78.10 GB",
    "[2026-02-11 06:45:01 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.float16, avail mem=1.20 GB",
]


def test_a_negative_profiled_value_cut_before_the_exception_is_a_kv_pool_oom():
    verdict = classify([*BEFORE_KV, f"[2026-02-11 06:45:01 TP0] {NO_KV_TOKENS}"])
    assert (verdict.state, verdict.phase, verdict.oom.phase, verdict.rank) == ("oom", "kv_cache", "kv_cache", "TP0")
    assert "raise --mem-fraction-static" in verdict.advice


def test_a_negative_profiled_value_then_the_sigquit_is_a_kv_pool_oom():
    follower = LogFollower(started_at=0.0)
    follower.feed_many([*BEFORE_KV, f"[2026-02-11 06:45:01 TP0] {NO_KV_TOKENS}"])
    assert (follower.verdict().state, follower.verdict().final) == ("oom", False)  # not decided by itself
    verdict = follower.feed(
        "[2026-02-11 06:45:02] Received sigquit from a child process. It usually means the child failed."
    )
    assert (verdict.state, verdict.phase, verdict.final) == ("oom", "kv_cache", True)


def test_a_negative_profiled_value_the_start_goes_past_is_harmless():
    """Older SGLang prints it for a speculative draft model too, and goes on (docs notebook, 2026-02)."""
    verdict = classify(
        [
            *BEFORE_KV,
            f"[2026-02-11 06:45:01] {NO_KV_TOKENS}",
            "Capturing batches (bs=4 avail_mem=1.85 GB):   0%|          | 0/4 [00:00<?, ?it/s]",
            "[2026-02-11 06:45:20] The server is fired up and ready to roll!",
        ]
    )
    assert verdict.state == "ready"


def test_a_positive_profiled_value_is_not_an_oom():
    lines = [*BEFORE_KV, NO_KV_TOKENS.replace("-89624", "89624")]
    assert classify(lines).state == "starting"


def test_forward_frames_place_an_oom_at_runtime_without_any_marker():
    """An excerpt that starts mid-traceback in the forward pass, after a start that got as far as weights."""
    lines = [
        "[2025-06-01 10:00:00 TP0] Load weight begin. avail mem=93.61 GB",
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 2012, in forward_extend',
        "    return self.model.forward(",
        '  File "/sgl/python/sglang/srt/models/deepseek_v2.py", line 2790, in forward',
        "    hidden_states = self.model(",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.43 GiB. GPU 5 has a total capacity of "
        "79.44 GiB of which 2.64 GiB is free.",
    ]
    verdict = classify(lines)
    assert (verdict.state, verdict.phase) == ("oom", "runtime")


def test_graph_capture_frames_win_over_forward_frames():
    lines = [
        "[2025-06-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/model_executor/cuda_graph_runner.py", line 400, in capture_one_batch_size',
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 2012, in forward_decode',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has a total capacity of "
        "95.00 GiB of which 100.00 MiB is free.",
    ]
    assert classify(lines).phase == "cuda_graph"


def test_an_old_failure_marker_waits_for_its_exception_line():
    follower = LogFollower(started_at=0.0)
    pending = follower.feed("[23:17:08 TP4] Exception in ModelTpServer:")
    assert (pending.state, pending.final, follower.pending_kind) == ("crashed", False, "marker")
    follower.feed("Traceback (most recent call last):")
    follower.feed('  File "/sgl/python/sglang/srt/managers/tp_worker.py", line 222, in exposed_step')
    verdict = follower.feed("RuntimeError: CUDA error: out of memory")
    assert (verdict.state, verdict.phase, verdict.final, verdict.rank) == ("oom", "runtime", True, "TP4")


def test_a_log_that_ends_inside_a_traceback_is_a_crash_placed_by_its_frames():
    lines = _lines("35-crash_other-deepseek-v25-old-format-run-tp-server-capture-cut.log")
    without_marker = [line for line in lines if "Exception in run_tp_server" not in line]
    verdict = classify(without_marker)
    assert (verdict.state, verdict.phase, verdict.cause) == ("crashed", "cuda_graph", "other")
    assert verdict.line == "    self.capture()"


def test_a_traceback_the_start_went_past_is_not_a_crash():
    lines = [
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/dist-packages/foo.py", line 1, in probe',
        "[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=93.61 GB",
    ]
    assert classify(lines).state == "starting"


@pytest.mark.parametrize("name", ["docs/architecture.md", "pyproject.toml", "ansible.cfg"])
def test_a_file_that_is_not_a_log_is_not_a_log(name):
    assert not is_log((REPO / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_log_is_a_log(name):
    assert is_log(_lines(name))


def test_diagnose_refuses_a_file_that_is_not_a_log(capsys):
    code = main(["diagnose", str(REPO / "docs" / "architecture.md")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "no SGLang, journal or traceback line" in err and err.count("\n") == 1


def test_diagnose_reads_a_journal_json_export(capsys, tmp_path):
    export = tmp_path / "journal.json"
    export.write_text("\n".join(_journal_json(_lines(OOM))) + "\n", encoding="utf-8")
    code = main(["diagnose", str(export), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (result["state"], result["oom"]["phase"]) == ("oom", "weight_load")


def test_diagnose_help_names_the_journal_formats(capsys):
    with pytest.raises(SystemExit):
        main(["diagnose", "--help"])
    text = capsys.readouterr().out
    for form in ("short-precise", "short-iso", "-o json", "-o export", "newest first", "compose", "kubectl"):
        assert form in text
