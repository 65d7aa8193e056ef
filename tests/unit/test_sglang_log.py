"""The log classifier against every real log in tests/data/sglang-logs and a few synthetic edges."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils.sglang_log import (
    LogFollower,
    advice_for,
    classify,
    parse_oom_message,
    split_line,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang-logs"

# file -> (state, phase, cause); the label in INDEX.tsv is the coarse class, this is the full answer
EXPECTED = {
    "01-crash_other-nccl-unhandled-system-error.log": ("crashed", "nccl_init", "nccl"),
    "04-oom_cuda_graph-deepep-h20-capture-oom.log": ("oom", "cuda_graph", None),
    "05-oom_weight_load-r9700-qwen36-moe-create-weights.log": ("oom", "weight_load", None),
    "06-oom_kv_cache-deepseek-r1-tke-not-enough-memory.log": ("oom", "kv_cache", None),
    "11-ready-rtx3090-qwen7b-docker-avail-mem-1.68.log": ("ready", None, None),
    # same sigquit shape as a weight-load OOM, but a KeyError reading the checkpoint: not an OOM
    "13-crash_other-r9700-qwen35-reap-keyerror-load-weights.log": ("crashed", "weight_load", "bad_weights"),
    "14-oom_weight_load-gemma3-12b-4070tisuper-create-weights.log": ("oom", "weight_load", None),
    "18-ready-qwq32b-tp4-pcie-avail-mem-2.09.log": ("ready", None, None),
    "22-hang-rtx6000ada-tp2-stuck-nccl-init.log": ("hung", "nccl_init", None),
    "24-oom_runtime-llama4-scout-h100-tp8-400k-prefill-embedding.log": ("oom", "runtime", None),
    "27-oom_kv_cache-mistral7b-old-not-enought-memory.log": ("oom", "kv_cache", None),
    "28-crash_other-h20-errno98-address-already-in-use.log": ("crashed", "warmup", "port_in_use"),
    "30-crash_other-nccl-init-unhandled-system-error-sigquit.log": ("crashed", "nccl_init", "nccl"),
    "31-crash_other-driver-cudaErrorInsufficientDriver-scheduler.log": ("crashed", "launch", "driver"),
    # no frames or progress before the OOM: the default for an OOM before the KV pool, weight_load
    "32-oom-nunchaku-scheduler-dead-month-day-prefix.log": ("oom", "weight_load", None),
    # a healthy start cut short: hung only because the test says it has been silent for an hour
    "33-starting-tp8-kv-allocated-capture-begin-cut.log": ("hung", "cuda_graph", None),
    # sigquit first, exception line not in the excerpt: a crash of unknown cause, placed by its frames
    "34-crash_other-rtxpro6000-glm52-nvfp4-sigquit-first-cuda-graph-init.log": (
        "crashed",
        "cuda_graph",
        "other",
    ),
    # old format ("[HH:MM:SS TPn]", "Exception in run_tp_server:"), cut inside the capture traceback
    "35-crash_other-deepseek-v25-old-format-run-tp-server-capture-cut.log": ("crashed", "cuda_graph", "other"),
    # docker compose prefixes, starts mid-traceback; "Capture cuda graph failed: " with no reason is no OOM
    "36-crash_other-dsv32-compose-prefix-capture-failed-no-reason.log": ("crashed", "cuda_graph", "other"),
    # no marker, no progress: the overlap thread's forward frames place the OOM at runtime
    "37-oom_runtime-overlap-thread-cuda-error-oom-no-marker.log": ("oom", "runtime", None),
    "38-crash_other-old-controller-single-decode-cut.log": ("crashed", "ready", "other"),
    "39-crash_other-mi300-capture-scheduler-exception-cut.log": ("crashed", "cuda_graph", "other"),
    "40-crash_other-gpt2-warmup-prefill-scheduler-exception-cut.log": ("crashed", "warmup", "other"),
    "41-crash_other-npu-qwen35-sigquit-first-model-runner-cut.log": ("crashed", "launch", "other"),
    # host memory (Errno 12), not GPU memory
    "42-crash_other-h20-errno12-host-memory-faulthandler.log": ("crashed", "launch", "other"),
    # the scheduler logs the traceback under its own rank prefix; cut inside it
    "43-crash_other-phi35-rank-prefixed-traceback-capture-cut.log": ("crashed", "cuda_graph", "other"),
    "44-hang-dp8-capture-custom-allreduce-registering-addresses.log": ("hung", "cuda_graph", None),
    # constructed (README): the schedulers cannot initialise CUDA at set_device; no GPU a smaller layout could use
    "45-crash_other-gpu-unavailable-uvm-node-closed-set-device-journal.log": (
        "crashed",
        "nccl_init",
        "gpu_unavailable",
    ),
    # constructed: the launcher's get_device() finds no accelerator; PyTorch's warning before it says why
    "46-crash_other-gpu-unavailable-launcher-no-accelerator-cuda-warning-journal.log": (
        "crashed",
        "launch",
        "gpu_unavailable",
    ),
}

# logs that end inside a traceback with no failure marker before it: only their end says they failed
CUT_INSIDE_A_TRACEBACK = {"43-crash_other-phi35-rank-prefixed-traceback-capture-cut.log"}

# OOM figures as the text states them (MiB, capacity GiB); None where the text does not say
OOM_FIGURES = {
    "04-oom_cuda_graph-deepep-h20-capture-oom.log": (7, 448.0, None, None),  # cut after "95.00"
    "05-oom_weight_load-r9700-qwen36-moe-create-weights.log": (1, 256.0, 70.0, 31.86),
    "06-oom_kv_cache-deepseek-r1-tke-not-enough-memory.log": (None, None, None, None),
    "14-oom_weight_load-gemma3-12b-4070tisuper-create-weights.log": (0, 114.0, 54.38, 15.58),
    "24-oom_runtime-llama4-scout-h100-tp8-400k-prefill-embedding.log": (5, 3.43 * 1024, 2.64 * 1024, 79.44),
    "27-oom_kv_cache-mistral7b-old-not-enought-memory.log": (None, None, None, None),
    "32-oom-nunchaku-scheduler-dead-month-day-prefix.log": (0, 150.0, 125.38, 23.52),
}

CLASS_OF_STATE = {
    "oom": "oom_",
    "crashed": "crash_",
    "hung": "hang",
    "ready": "ready",
    "starting": "starting",
}


def _index() -> list[dict]:
    with open(LOGS / "INDEX.tsv", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def _text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def test_index_and_expectations_cover_every_shipped_log():
    files = {p.name for p in LOGS.glob("*.log")}
    indexed = {row["file"] for row in _index()}
    assert files == indexed, "every log needs a row (with its source) in INDEX.tsv, and only those"
    assert files == set(EXPECTED), "every shipped log needs an expected classification here"
    assert all(row["source"].strip() for row in _index())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_shipped_log_is_classified_right(name):
    state, phase, cause = EXPECTED[name]
    verdict = classify(_text(name), idle_seconds=3600, hang_seconds=600)
    assert (verdict.state, verdict.phase, verdict.cause) == (state, phase, cause)
    if state == "oom":
        assert verdict.oom is not None and verdict.oom.phase == phase
    else:
        assert verdict.oom is None
    assert verdict.advice


@pytest.mark.parametrize("row", _index(), ids=lambda row: row["file"])
def test_verdict_agrees_with_the_index_label(row):
    label = row["class"]
    # a start cut short is "starting"; the hang label is for a log known to have gone silent
    idle = 3600 if label == "hang" else None
    verdict = classify(_text(row["file"]), idle_seconds=idle, hang_seconds=600)
    assert label.startswith(CLASS_OF_STATE[verdict.state])
    if label.startswith("oom_") and label != "oom_unknown_phase":
        assert verdict.oom.phase == label[len("oom_") :]


@pytest.mark.parametrize("name", sorted(OOM_FIGURES))
def test_oom_figures_are_the_numbers_in_the_text(name):
    gpu, tried, free, capacity = OOM_FIGURES[name]
    oom = classify(_text(name)).oom
    assert oom.gpu == gpu
    assert oom.tried_to_allocate_mib == pytest.approx(tried, abs=0.01) if tried else oom.tried_to_allocate_mib is None
    assert oom.free_mib == pytest.approx(free, abs=0.01) if free else oom.free_mib is None
    assert oom.capacity_gib == pytest.approx(capacity, abs=0.01) if capacity else oom.capacity_gib is None


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if e[0] in ("oom", "crashed")))
def test_the_deciding_line_is_a_line_of_the_log(name):
    verdict = classify(_text(name))
    lines = _text(name).split("\n")
    assert verdict.line in lines[verdict.line_number - 1]


def test_field_observation_oom_message():
    """docs/facts.md §1: the TP4 EP2 crash on the RTX PRO 6000 host."""
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB. GPU 2 has a total "
        "capacity of 94.97 GiB of which 136.94 MiB is free. Including non-PyTorch memory, this process "
        "has 94.83 GiB memory in use."
    )
    assert parse_oom_message(text) == {
        "gpu": 2,
        "tried_to_allocate_mib": 672.0,
        "free_mib": 136.94,
        "capacity_gib": 94.97,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.58 GiB total capacity; "
            "14.21 GiB already allocated; 3.06 MiB free; 14.50 GiB reserved in total by PyTorch)",
            {"gpu": 0, "tried_to_allocate_mib": 20.0, "free_mib": 3.06, "capacity_gib": 15.58},
        ),
        (
            "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 KiB (GPU 0; "
            "11.17 GiB total capacity; 10.90 GiB already allocated; 576.00 KiB free; 30.96 MiB cached)",
            {"gpu": 0, "tried_to_allocate_mib": 1.0, "free_mib": 0.56, "capacity_gib": 11.17},
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
            "capacity of 94.97 GiB of which 0 bytes is free.",
            {"gpu": 3, "tried_to_allocate_mib": 2048.0, "free_mib": 0.0, "capacity_gib": 94.97},
        ),
    ],
)
def test_oom_units_are_normalised_to_mib(text, expected):
    assert parse_oom_message(text) == expected


def test_prefixes_are_stripped_and_ranks_read():
    (journal,) = split_line(
        "Nov 29 16:00:01 gpu-host-01 python3[4242]: [2025-11-29 16:00:01 DP0 TP3 EP3] Load weight begin. "
        "avail mem=93.61 GB"
    )
    assert journal.message == "Load weight begin. avail mem=93.61 GB"
    assert (journal.rank, journal.tp_rank) == ("DP0 TP3 EP3", 3)
    (iso,) = split_line("2025-11-29T16:00:01+0000 host sglang[7]: [2025-11-29 16:00:01 TP0 PP1] Memory pool end.")
    assert (iso.rank, iso.message) == ("TP0 PP1", "Memory pool end.")


def test_a_journal_export_classifies_like_the_raw_log():
    name = "14-oom_weight_load-gemma3-12b-4070tisuper-create-weights.log"
    journal = [f"Nov 29 16:00:{i % 60:02d} host python3[123]: {line}" for i, line in enumerate(_text(name).split("\n"))]
    assert classify(journal) == classify(_text(name))


def test_a_log_that_stops_while_starting_is_starting_then_hung():
    lines = _text("22-hang-rtx6000ada-tp2-stuck-nccl-init.log")
    assert classify(lines).state == "starting"
    assert classify(lines, idle_seconds=59, hang_seconds=60).state == "starting"
    hung = classify(lines, idle_seconds=60, hang_seconds=60)
    assert (hung.state, hung.phase) == ("hung", "nccl_init")
    assert "NCCL_P2P_DISABLE=1" in hung.advice


def test_hang_detection_follows_a_synthetic_clock():
    follower = LogFollower(started_at=0.0)
    assert follower.verdict(now=599.0, hang_seconds=600).state == "starting"
    assert follower.verdict(now=600.0, hang_seconds=600).phase == "launch"
    follower.feed("[2025-01-01 00:00:00 TP0] Init torch distributed begin.", now=10.0)
    follower.feed("[2025-01-01 00:00:01 TP0] Init torch distributed ends. mem usage=0.1 GB", now=11.0)
    follower.feed("[2025-01-01 00:00:01 TP0] Load weight begin. avail mem=93.61 GB", now=12.0)
    follower.feed("Loading safetensors checkpoint shards:  50% Completed | 31/62", now=400.0)
    assert follower.verdict(now=999.0, hang_seconds=600).state == "starting"
    hung = follower.verdict(now=1000.0, hang_seconds=600)
    assert (hung.state, hung.phase) == ("hung", "weight_load")
    assert hung.line.startswith("Loading safetensors")


def test_health_polls_in_the_access_log_are_not_progress():
    follower = LogFollower(started_at=0.0)
    follower.feed("[2025-01-01 00:00:00] INFO:     Uvicorn running on http://127.0.0.1:30000", now=5.0)
    for second in range(6, 700):
        follower.feed(
            f'[2025-01-01 00:00:00] INFO:     127.0.0.1:{40000 + second} - "GET /health HTTP/1.1" 503',
            now=second,
        )
    hung = follower.verdict(now=605.0, hang_seconds=600)
    assert (hung.state, hung.phase) == ("hung", "warmup")


def test_slowest_rank_names_the_hang_phase():
    follower = LogFollower(started_at=0.0)
    follower.feed("[2025-01-01 00:00:00 TP0] Load weight end. type=X, avail mem=6.09 GB", now=1.0)
    follower.feed("[2025-01-01 00:00:00 TP1] Load weight begin. avail mem=21.63 GB", now=2.0)
    assert follower.verdict(now=1000.0, hang_seconds=600).phase == "weight_load"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_incremental_api_equals_batch_api(name):
    follower = LogFollower(started_at=0.0)
    for line in _text(name).split("\n"):
        follower.feed(line, now=0.0)
    assert follower.finish() == classify(_text(name))


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if e[0] in ("oom", "crashed")))
def test_the_follower_decides_on_the_deciding_line(name):
    """Live following: the verdict is final once the deciding line (or its partner) is fed, not at EOF."""
    expected = classify(_text(name))
    follower = LogFollower(started_at=0.0)
    decided_at = None
    for number, line in enumerate(_text(name).split("\n"), start=1):
        verdict = follower.feed(line, now=0.0)
        if verdict.failed and verdict.final:
            decided_at = number
            break
    if decided_at is None:
        # a marker without its exception line, a bare exception without a marker, or a log cut inside a
        # traceback: the caller's grace or the end of the log decides, never a line on its own
        assert follower.pending_kind in ("marker", "exception") or name in CUT_INSIDE_A_TRACEBACK
        assert not follower.verdict().final
        assert follower.finish() == expected
        return
    # 01 starts mid-traceback with no failure marker around a strong NCCL error: decided at once too
    assert decided_at == expected.line_number
    assert follower.verdict() == expected


def test_sigquit_before_the_traceback_waits_for_the_exception_line():
    """Newer SGLang logs the parent's sigquit first (log 24): that alone must not decide the cause."""
    follower = LogFollower(started_at=0.0)
    pending = follower.feed(
        "[2026-06-28 13:36:54] Received sigquit from a child process. It usually means the child failed."
    )
    assert (pending.state, pending.final, follower.pending_kind) == ("crashed", False, "marker")
    follower.feed("[2026-06-28 13:36:54 TP0] Scheduler hit an exception: Traceback (most recent call last):")
    follower.feed('  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1, in load_model')
    verdict = follower.feed(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB. GPU 2 has a total "
        "capacity of 94.97 GiB of which 136.94 MiB is free."
    )
    assert (verdict.state, verdict.phase, verdict.final, verdict.oom.gpu) == ("oom", "weight_load", True, 2)


def test_a_marker_alone_is_a_crash_of_unknown_cause_at_the_end():
    verdict = classify(
        ["[2025-01-01 00:00:00] Received sigquit from a child process. It usually means the child failed."]
    )
    assert (verdict.state, verdict.cause) == ("crashed", "other")


def test_a_harmless_traceback_before_ready_does_not_fail_the_start():
    lines = [
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/dist-packages/foo.py", line 1, in probe',
        "ModuleNotFoundError: No module named 'vllm'",
        "[2025-01-01 00:00:00 TP0] Load weight begin. avail mem=93.61 GB",
        "[2025-01-01 00:00:09] The server is fired up and ready to roll!",
    ]
    assert classify(lines).state == "ready"


def test_memory_warnings_do_not_make_an_oom():
    lines = [
        "[2025-01-01 00:00:00 TP1] Failed to initialize lk_moe: CUDA out of memory. Tried to allocate 24.00 MiB.",
        "[2025-01-01 00:00:00 TP0] Memory pool end. avail mem=0.42 GB",
        "[2025-01-01 00:00:09] The server is fired up and ready to roll!",
    ]
    assert classify(lines).state == "ready"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (
            "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer",
            "bad_weights",
        ),
        (
            "RuntimeError: Assertion error (/deepgemm/csrc/apis/gemm.hpp:376): Unsupported architecture",
            "unsupported_arch",
        ),
        (
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU "
            "driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx",
            "driver",
        ),
        # no driver loaded is not a driver that does not fit: the host's GPUs are unavailable
        (
            "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU",
            "gpu_unavailable",
        ),
        (
            "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing "
            "env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.",
            "gpu_unavailable",
        ),
        ("RuntimeError: CUDA error: unspecified launch failure", "gpu_fault"),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error",
            "nccl",
        ),
        ("OSError: [Errno 98] Address already in use", "port_in_use"),
        ("ValueError: something nobody planned for", "other"),
    ],
)
def test_crash_causes(line, cause):
    lines = ["[2025-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):", line]
    verdict = classify(lines)
    assert (verdict.state, verdict.cause) == ("crashed", cause)
    assert verdict.line == line


def test_a_cuda_graph_failure_that_is_not_an_oom_is_a_crash():
    lines = [
        "[2025-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
        "[2025-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "Exception: Capture cuda graph failed: Ninja build failed.",
    ]
    verdict = classify(lines)
    assert (verdict.state, verdict.phase) == ("crashed", "cuda_graph")


@pytest.mark.parametrize(
    ("state", "phase", "cause", "must"),
    [
        ("oom", "weight_load", None, r"will not help.*layout that spreads the experts over more GPUs"),
        ("oom", "kv_cache", None, r"raise --mem-fraction-static"),
        ("oom", "cuda_graph", None, r"--cuda-graph-max-bs"),
        ("oom", "runtime", None, r"--chunked-prefill-size"),
        ("crashed", None, "nccl", r"NCCL_P2P_DISABLE=1"),
        ("crashed", None, "unsupported_arch", r"SGLANG_ENABLE_JIT_DEEPGEMM=0"),
        ("crashed", None, "driver", r"570"),
        ("crashed", None, "gpu_unavailable", r"no other layout fixes.*ls -l /dev/nvidia\*"),
        ("crashed", None, "gpu_fault", r"Xid 79"),
        ("crashed", None, "port_in_use", r"stale"),
        ("hung", "nccl_init", None, r"NCCL_P2P_DISABLE=1"),
    ],
)
def test_advice_follows_the_phase(state, phase, cause, must):
    assert re.search(must, advice_for(state, phase, cause))


# SGLang 0.5.23's renamed startup lines, as its format strings write them (srt/distributed/bootstrap.py,
# model_executor/model_runner_components/cuda_graph_setup.py): each moves the phase as 0.5.10's line did.
@pytest.mark.parametrize(("line", "phase"), [
    ("[2026-10-01 00:00:00 TP0] Init parallel begin.", "nccl_init"),
    ("[2026-10-01 00:00:01 TP0] Init parallel ends. elapsed=0.84 s, mem usage=0.10 GB", "weight_load"),
    ("[2026-10-01 00:00:09 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
     "avail mem=12.31 GB", "cuda_graph"),
    ("[2026-10-01 00:00:20 TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=8192",
     "cuda_graph"),
    ("[2026-10-01 00:00:31 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=11.2 s, "
     "mem usage=1.21 GB, avail mem=11.10 GB", "warmup"),
])
def test_0_5_23s_startup_lines_move_the_phase(line, phase):
    follower = LogFollower(started_at=0.0)
    if phase not in ("nccl_init", "weight_load"):  # the graphs are captured after the weights and the KV pool
        follower.feed("[2026-10-01 00:00:08 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000", now=1.0)
    before = follower.verdict(now=1.5, hang_seconds=600).phase
    follower.feed(line, now=2.0)
    assert (before, follower.verdict(now=3.0, hang_seconds=600).phase) != (phase, phase)
    assert follower.verdict(now=3.0, hang_seconds=600).phase == phase
