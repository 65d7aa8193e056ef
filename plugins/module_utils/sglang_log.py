"""Classify an SGLang server's start-up log: ready, starting, oom, crashed or hung.

Pure standard library, no I/O: the readiness module feeds it journal lines as they arrive, the
``moefleet diagnose`` command feeds it a saved log. One implementation for both.

Signals follow SGLang's own log lines (python/sglang/srt/model_executor/model_runner.py,
cuda_graph_runner.py, managers/scheduler.py, entrypoints/http_server.py):

    Init torch distributed begin. / Init torch distributed ends. mem usage=...
    Load weight begin. avail mem=... GB / Load weight end. ... avail mem=... GB
    KV Cache is allocated. #tokens: ... / Memory pool end. avail mem=... GB
    Capture cuda graph begin. ... / Capture cuda graph end. Time elapsed: ...
    Uvicorn running on http://... / The server is fired up and ready to roll!

A start-up failure in a scheduler child logs ``Scheduler hit an exception: Traceback ...`` and the
parent ``Received sigquit from a child process``; the two can come in either order, and the same
shape follows an OOM, a bad checkpoint or a NCCL failure, so the exception line decides, never the
sigquit. The OOM phase comes from the traceback's frames first (load_model/create_weights →
weight_load, init_memory_pool → kv_cache, CUDA-graph capture → cuda_graph, event_loop/run_batch →
runtime) and from the last progress line the failing rank printed otherwise.

A crash names its cause (CAUSES) from the exception line, or from a warning before it (a CUDA initialization
warning, nvidia-smi's error) when the exception line says nothing. A host whose GPUs CUDA or NVML cannot use
(device nodes missing or closed to the unit, no driver loaded, driver and libraries of different versions, a
lost GPU) is ``gpu_unavailable``, with advice that follows the reason (GPU_REASONS, gpu_reason); a GPU that
failed while running a kernel (unspecified launch failure, an uncorrectable ECC error) is ``gpu_fault``.

Public API:

    classify(lines, idle_seconds=None, hang_seconds=None) -> Verdict   (reads newest-first logs too)
    is_log(lines) -> bool, newest_first(lines) -> bool
    LogFollower(started_at=None): .feed(line, now=None) -> Verdict, .verdict(now=None, hang_seconds=None),
        .finish() -> Verdict, .phase, .last_progress_at, .pending_since, .lines_seen
    parse_oom_message(text) -> dict | None
    gpu_reason(*lines) -> str | None   (one of GPU_REASONS)
    advice_for(state, phase=None, cause=None, reason=None) -> str
    split_line(raw) -> list[ParsedLine]
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

STATES = ("ready", "starting", "oom", "crashed", "hung")
OOM_PHASES = ("weight_load", "kv_cache", "cuda_graph", "runtime")
CAUSES = ("nccl", "port_in_use", "bad_weights", "unsupported_arch", "driver", "gpu_unavailable", "gpu_fault", "other")
# Why a gpu_unavailable crash could not use the GPUs (gpu_reason); each has its own advice.
GPU_REASONS = (
    "driver_mismatch",
    "no_driver",
    "fabric_manager",
    "gpu_lost",
    "busy",
    "missing_gpu",
    "no_device",
    "no_cuda",
)
# Where a start can stand, in order; a hang names the one it stopped in.
PROGRESS_PHASES = ("launch", "nccl_init", "weight_load", "kv_cache", "cuda_graph", "warmup", "ready")

# --- line prefixes -------------------------------------------------------------------------------

# Colour codes, as a terminal writes them (ESC) and as people paste them: "\x1b[31m", "\033[0m",
# "\u001b[36m", "\e[1m", "^[[0;32m".
_ANSI = re.compile(r"(?:\x1b|\\x1b|\\033|\\u001b|\\e|\^\[)\[[0-9;?]*[A-Za-z]")
# journalctl's short / short-precise / short-iso / short-full export:
# "Nov 29 16:00:01 host python3[123]: ", "2025-11-29T16:00:01+0000 host ...", "Sat 2025-11-29 16:00:01 UTC host ..."
_JOURNAL_PREFIX = re.compile(
    r"^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [A-Z]{2,5})"
    r" \S+ [^\s:\[]+(?:\[\d+\])?: "
)
# what container and cloud loggers put in front, outermost first; each may follow another:
# docker compose "svc-1  | ", kubectl --prefix "[pod/name/container] ", a timestamp (docker logs -t,
# kubectl --timestamps, CloudWatch, GCP, optionally after a severity such as "E " or "ERROR "),
# CloudWatch's epoch milliseconds
_COLLECTOR_PREFIXES = (
    re.compile(r"^[A-Za-z0-9][\w.-]*\s+\|(?: |$)"),
    re.compile(r"^\[(?:pod|deployment|statefulset|job|daemonset)/[^\]\s]+\] "),
    re.compile(
        r"^(?:[A-Z]{1,9}\s+)?(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)(?:Z|[+-]\d\d:?\d\d| UTC)?[\t ]+"
    ),
    re.compile(r"^\d{13}[\t ]+"),
)
# SGLang's own prefix: "[2025-01-01 00:00:00 TP0] ", "[... DP0 TP0 EP0] ", "[... TP0 PP0] ",
# "[06-09 17:46:28] ", and before 0.4 "[23:17:01 TP4] "
_SGLANG_PREFIX = re.compile(
    r"\[(?P<ts>(?:(?:\d{4}-)?\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?)(?P<ranks>(?: [A-Z][A-Z_]*\d+)*)\] ?"
)
_RANK_TOKEN = re.compile(r"([A-Z][A-Z_]*?)(\d+)")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class ParsedLine:
    """One log line with collector prefixes removed and SGLang's rank prefix parsed."""

    text: str  # the line without journal/collector prefix (what an operator would grep)
    message: str  # the text after SGLang's "[time ranks] " prefix, or the whole text
    rank: str | None  # "TP0", "DP0 TP0", "TP0 PP1"; None for launcher lines and raw output
    tp_rank: int | None
    stamp: str | None = None  # the line's time as text that sorts (collector's first, else SGLang's)
    framed: bool = False  # it came with a journal, collector or SGLang prefix, or as a journal entry


def _journal_entry(piece: str) -> str | None:
    """The message of one ``journalctl -o json`` entry (or a docker json-file line); None otherwise."""
    if not (piece.startswith("{") and piece.endswith("}")):
        return None
    try:
        entry = json.loads(piece)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    message = entry.get("MESSAGE", entry.get("log"))
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        message = bytes(message).decode("utf-8", errors="replace")  # journald's form for non-UTF-8 text
    return message if isinstance(message, str) else None


def _sortable(stamp: str) -> str:
    """'Nov 29 16:00:01' as '11-29 16:00:01'; ISO and SGLang forms already sort as text."""
    if stamp[:3] in _MONTHS and stamp[3:4] == " ":
        return f"{_MONTHS.index(stamp[:3]) + 1:02d}-{stamp[4:6].strip():0>2} {stamp[7:]}"
    return stamp.replace("T", " ")


def _strip_prefixes(piece: str) -> tuple[str, str | None, bool]:
    """The text without colour codes and outer prefixes, the outermost time stamp, and whether any was found."""
    text = _ANSI.sub("", piece)
    stamp, framed = None, False
    if text.startswith("MESSAGE="):  # journalctl -o export: one FIELD=value per line
        return text[len("MESSAGE=") :], None, True
    for _ in range(4):  # a few prefixes deep at most: compose + timestamp + journal ...
        before = text
        match = _JOURNAL_PREFIX.match(text)
        if match is None:
            for pattern in _COLLECTOR_PREFIXES:
                match = pattern.match(text)
                if match:
                    break
        if match is None:
            break
        text = text[match.end() :]
        framed = True
        if stamp is None and "ts" in match.groupdict() and match.group("ts"):
            stamp = _sortable(match.group("ts"))
        if text == before:
            break
    return text, stamp, framed


def split_line(raw: str) -> list[ParsedLine]:
    """Split one raw line (tqdm redraws with carriage returns) and parse each piece."""
    out = []
    raw = raw.rstrip("\n")
    entry = _journal_entry(raw.strip())
    pieces = entry.rstrip("\n").split("\n") if entry is not None else [raw]
    for whole in pieces:
        for piece in whole.split("\r"):
            text, stamp, framed = _strip_prefixes(piece)
            text = text.rstrip()
            match = _SGLANG_PREFIX.search(text)
            rank = tp_rank = None
            message = text
            if match and (match.start() == 0 or "Scheduler hit an exception" in text[match.end() :]):
                message = text[match.end() :]
                ranks = match.group("ranks").strip()
                rank = ranks or None
                stamp = stamp or match.group("ts")
                framed = True
                for name, number in _RANK_TOKEN.findall(ranks):
                    if name == "TP":
                        tp_rank = int(number)
            out.append(
                ParsedLine(
                    text=text,
                    message=message,
                    rank=rank,
                    tp_rank=tp_rank,
                    stamp=stamp,
                    framed=framed or entry is not None,
                )
            )
    return out


# --- what the lines mean -------------------------------------------------------------------------

# (regex on the message, phase reached once it is printed). 0.5.10's lines, and where 0.5.23 renamed one its line too:
# "Init parallel begin." / "Init parallel ends." (srt/distributed/bootstrap.py), "Capture target decode CUDA graph
# begin." / "... prefill CUDA graph ..." (model_executor/model_runner_components/cuda_graph_setup.py; the role is
# target or draft).
_MILESTONES = (
    (re.compile(r"Init torch distributed begin|Init parallel begin"), "nccl_init"),
    (re.compile(r"Init torch distributed ends|Init parallel ends"), "weight_load"),
    (re.compile(r"Load weight begin"), "weight_load"),
    (re.compile(r"Load weight end"), "kv_cache"),
    (re.compile(r"KV Cache is allocated"), "kv_cache"),
    (re.compile(r"Memory pool end"), "cuda_graph"),
    (re.compile(r"Capture (?:piecewise |(?:target|draft) (?:decode|prefill) )?cuda graph begin", re.I), "cuda_graph"),
    (re.compile(r"^Capturing batches \(bs="), "cuda_graph"),  # tqdm's capture bar, all a warning-level log shows
    (re.compile(r"Capture (?:piecewise |(?:target|draft) (?:decode|prefill) )?cuda graph end", re.I), "warmup"),
    (re.compile(r"^max_total_num_tokens="), "warmup"),
    (re.compile(r"Uvicorn running on |Application startup complete"), "warmup"),
    (re.compile(r"The server is fired up and ready to roll"), "ready"),
)
_READY = re.compile(r"The server is fired up and ready to roll")
# our own health polls show up as access-log lines: they are not progress
_ACCESS_LOG = re.compile(r'^(?:INFO:\s+)?\S+:\d+ - "(?:GET|POST|HEAD|PUT|DELETE|OPTIONS) ')

# Lines that say a child failed; the exception line that goes with them says why.
_FAILURE_MARKER = re.compile(
    r"Scheduler hit an exception|DataParallelController hit an exception"
    r"|Received sigquit from a child process|scheduler is dead|Initialization failed\. warmup error"
    r"|Detokenizer(?:Manager)? hit an exception|TokenizerManager hit an exception"
    # before 0.4 (managers/controller_*.py, tp_worker.py): "Exception in run_tp_server:" and the like
    r"|Exception in (?:run_tp_server|ModelTpServer|ControllerSingle|ControllerMulti|DetokenizerManager):"
)
_MARKER = "failure_marker"  # internal cause of a pending verdict: a child failed, reason not read yet
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<func>\S+)')
# "RuntimeError: ...", "torch.OutOfMemoryError: ...", "tvm.error.InternalError: ...", "Exception: ...", and
# pynvml's generated classes: "pynvml.NVMLError_DriverNotLoaded: Driver Not Loaded"
_EXCEPTION_LINE = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)(?:_[A-Za-z]\w*)?)(?::\s*(?P<msg>.*))?$"
)

_OOM_TEXT = re.compile(
    r"(?:CUDA|HIP) out of memory|OutOfMemoryError|CUDA error: out of memory"
    r"|Not enough?t? memory\. Please try to increase --mem-fraction-static"
)
_KV_POOL_TEXT = re.compile(r"Not enough?t? memory\. Please try to increase --mem-fraction-static")
# 0.5.23 says "Capture prefill CUDA graph failed" for its prefill graph (runner/prefill_cuda_graph_runner.py).
_GRAPH_TEXT = re.compile(r"Capture (?:piecewise |prefill )?cuda graph failed", re.I)
# model_executor/model_runner_kv_cache_mixin.py: the warning printed just before SGLang's KV-pool failure
# ("Not enough memory ...", raised when the token capacity is <= 0) when --max-total-tokens is set
_NO_KV_TOKENS = re.compile(r"max_total_tokens=\d+ is larger than the profiled value (?:-\d+|0)\b")


class _AnyOf:
    """Several patterns read as one: ``search`` gives the first match of any."""

    def __init__(self, patterns) -> None:
        self.patterns = tuple(patterns)

    def search(self, text: str):
        for pattern in self.patterns:
            match = pattern.search(text)
            if match:
                return match
        return None


# Why CUDA or NVML could not use the host's GPUs (cause gpu_unavailable), as PyTorch (c10/cuda/CUDAFunctions.cpp,
# torch/cuda/__init__.py), the CUDA runtime (cudaError_t names and strings), NVML (nvidia-smi, pynvml) and SGLang
# (utils/common.py get_device) word it; the first that matches names the reason, each reason has its own advice.
_GPU_UNAVAILABLE = (
    # kernel module and user-space driver of different versions: a driver update without a reboot (CUDA error 803)
    (
        "driver_mismatch",
        re.compile(
            r"Driver/library version mismatch|NVML/RM version mismatch|LIB_RM_VERSION_MISMATCH"
            r"|NVMLError_LibRmVersionMismatch|unsupported display driver / cuda driver combination"
            r"|SystemDriverMismatch|SYSTEM_DRIVER_MISMATCH",
            re.I,
        ),
    ),
    # no kernel driver to talk to (cudaErrorInsufficientDriver with no driver version at all, in PyTorch's words)
    (
        "no_driver",
        re.compile(
            r"Found no NVIDIA driver|couldn't communicate with the NVIDIA driver|NVML_ERROR_DRIVER_NOT_LOADED"
            r"|NVMLError_DriverNotLoaded|: Driver Not Loaded\b"
        ),
    ),
    # CUDA error 802: on NVSwitch (HGX) hosts, nvidia-fabricmanager is not running
    (
        "fabric_manager",
        re.compile(r"system not yet initialized|cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY", re.I),
    ),
    # a GPU that stopped answering: Xid 79 in the kernel log, "GPU is lost" in NVML
    ("gpu_lost", re.compile(r"GPU is lost|GPU_IS_LOST|NVMLError_GpuIsLost|fallen off the bus", re.I)),
    # cudaErrorDevicesUnavailable (46): exclusive compute mode held by another process, or a node not allowed
    (
        "busy",
        re.compile(
            r"CUDA-capable device\(s\) is/are busy or unavailable|CUDA-capable devices are busy or unavailable"
            r"|cudaErrorDevicesUnavailable|CUDA_ERROR_DEVICE_UNAVAILABLE",
            re.I,
        ),
    ),
    # cudaErrorInvalidDevice (101): a rank's GPU index past the GPUs CUDA can open
    ("missing_gpu", re.compile(r"invalid device ordinal|cudaErrorInvalidDevice\b|CUDA_ERROR_INVALID_DEVICE\b", re.I)),
    # cuInit cannot open the GPUs: /dev/nvidia-uvm or /dev/nvidiactl missing or closed to the process
    # (CUDA_ERROR_UNKNOWN, cudaErrorNoDevice, cudaErrorInitializationError), NVML the same ("Unknown Error")
    (
        "no_device",
        re.compile(
            r"CUDA unknown error - this may be due to an incorrectly set up environment|No CUDA GPUs are available"
            r"|no CUDA-capable device is detected|cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE"
            r"|CUDA driver initialization failed|Failed to initialize NVML: Unknown Error"
            r"|NVMLError_NoPermission|NVML_ERROR_NO_PERMISSION|refuses to start: the NVIDIA device nodes? ",
            re.I,
        ),
    ),
    # SGLang's get_device(): torch.cuda.is_available() was False; PyTorch's warning before it says why
    ("no_cuda", re.compile(r"No accelerator \([^)]*\)(?: or platform plugin)? is available")),
)
# moefleet's own check before a start (the unit's ExecStartPre, files/sglang-device-check) refusing it because a
# node DeviceAllow= names is missing (reason no_device): decisive like an exception line, though it is none
_DEVICE_REFUSAL = re.compile(r"refuses to start: the NVIDIA device nodes? .* missing")
# reasons that name no cause of their own, the vaguest last: a more specific reason read earlier in the log
# (PyTorch's CUDA warning, nvidia-smi's error) explains them
_GPU_GENERIC = ("no_device", "no_cuda")
_MAX_HINT_LINES = 20
# a GPU that failed while running work: a kernel that faulted, an ECC error, a GPU gone mid-run
_GPU_FAULT = re.compile(
    r"unspecified launch failure|cudaErrorLaunchFailure|CUDA_ERROR_LAUNCH_FAILED"
    r"|uncorrectable ECC error encountered|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE"
    r"|CUDA error: unknown error",
    re.I,
)


def gpu_reason(*lines: str | None) -> str | None:
    """Why the GPUs could not be used (one of GPU_REASONS), from the deciding line and then the earlier lines that
    hinted at it: the first specific reason, else the least vague generic one, else None."""
    best = None
    for line in lines:
        reason = next((r for r, pattern in _GPU_UNAVAILABLE if line and pattern.search(line)), None)
        if reason is None:
            continue
        if reason not in _GPU_GENERIC:
            return reason
        if best is None or _GPU_GENERIC.index(reason) < _GPU_GENERIC.index(best):
            best = reason
    return best


_CAUSE_PATTERNS = (
    (
        "port_in_use",
        re.compile(r"address already in use|\[Errno 98\]|EADDRINUSE", re.I),
    ),
    (
        "nccl",
        re.compile(
            r"NCCL error|nccl\w*Error\b|DistBackendError|ProcessGroupNCCL|ncclSystemError|ncclInternalError"
            r"|ncclUnhandledCudaError|ncclRemoteError|Watchdog caught collective operation timeout"
        ),
    ),
    (
        "bad_weights",
        re.compile(
            r"MetadataIncompleteBuffer|SafetensorError|Error while deserializing header|HeaderTooLarge"
            r"|InvalidHeaderDeserialization|incomplete metadata|Cannot find any model weights"
            r"|file is not a zip file|PytorchStreamReader failed"
        ),
    ),
    (
        "unsupported_arch",
        re.compile(
            r"Unsupported architecture|no kernel image is available for execution"
            r"|Unknown recipe|Unknown SF transformation|Unsupported gpu architecture"
            r"|is not compatible with the current PyTorch installation|only supported on SM\d+"
        ),
    ),
    (
        # the driver does not fit this CUDA build or GPU (a driver that is not loaded at all: gpu_unavailable)
        "driver",
        re.compile(
            r"driver version is insufficient|NVIDIA driver on your system is too old"
            r"|cudaErrorInsufficientDriver|forward compatibility was attempted",
            re.I,
        ),
    ),
    ("gpu_unavailable", _AnyOf(pattern for _, pattern in _GPU_UNAVAILABLE)),
    ("gpu_fault", _GPU_FAULT),
)
# frames that say the checkpoint itself was being read: a KeyError or shape mismatch there means
# the checkpoint does not match (wrong, partial or mis-converted shards)
_WEIGHT_READ_FUNCS = {
    "load_weights",
    "load_weights_and_postprocess",
    "weight_loader",
    "_load_w13",
    "_load_w2",
}
_WEIGHT_MISMATCH = re.compile(r"^(?:KeyError|AssertionError)$|size mismatch|shape mismatch|does not match", re.I)

# frames of the forward pass serving requests (model_executor/model_runner.py, managers/scheduler.py,
# tp_worker*.py; before 0.4 tp_worker.forward_step/forward_decode_batch and controller loops)
_RUNTIME_FUNCS = {
    "run_batch",
    "forward_batch_generation",
    "process_batch_result",
    "handle_generate_request",
    "forward_extend",
    "forward_decode",
    "forward_idle",
    "forward_split_prefill",
    "replay",
    "forward_thread_func",
    "forward_thread_func_",
    "forward_step",
    "forward_fill_batch",
    "forward_decode_batch",
    "exposed_step",
    "loop_for_forward",
}
# frames that only CUDA-graph capture runs (replay at runtime is a runtime frame)
_GRAPH_FUNCS = {
    "init_cuda_graphs",
    "init_all_cuda_graphs",
    "capture",
    "capture_one_batch_size",
    "init_device_graphs",
}
_KV_FUNCS = {"init_memory_pool", "alloc_memory_pool", "profile_max_num_token", "init_memory_pool_and_cache"}
_DIST_FUNCS = {"init_torch_distributed", "initialize_model_parallel", "init_distributed_environment"}
_OOM_PHASE_OF = {"kv_cache": "kv_cache", "cuda_graph": "cuda_graph", "warmup": "runtime", "ready": "runtime"}
_LOAD_FUNCS = {
    "load_model",
    "get_model",
    "_initialize_model",
    "create_weights",
    "load_weights",
    "load_weights_and_postprocess",
    "make_layers",
}

# --- OOM figures ---------------------------------------------------------------------------------

_UNIT_TO_MIB = {
    "B": 1 / 2**20,
    "bytes": 1 / 2**20,
    "KiB": 1 / 1024,
    "MiB": 1.0,
    "GiB": 1024.0,
    "TiB": 1024.0**2,
}
_SIZE = r"(?P<{0}>\d+(?:\.\d+)?)(?: ?(?P<{0}_unit>bytes|B|KiB|MiB|GiB|TiB)\b)?"
# PyTorch >= 2.1: "Tried to allocate 672.00 MiB. GPU 2 has a total capacity of 94.97 GiB of which
# 136.94 MiB is free."
_OOM_NEW = re.compile(
    r"Tried to allocate "
    + _SIZE.format("tried")
    + r"\.?(?: GPU (?P<gpu>\d+) has a total capac\w* of "
    + _SIZE.format("capacity")
    + r"(?: of which "
    + _SIZE.format("free")
    + r" is free)?)?"
)
# PyTorch < 2.1: "Tried to allocate 20.00 MiB (GPU 0; 15.58 GiB total capacity; 14.21 GiB already allocated;
# 3.06 MiB free; ..."
_OOM_OLD = re.compile(
    r"Tried to allocate "
    + _SIZE.format("tried")
    + r" \(GPU (?P<gpu>\d+); "
    + _SIZE.format("capacity")
    + r" total capacity;(?:[^;]*;)*? "
    + _SIZE.format("free")
    + r" free"
)
_OOM_OLD_HEAD = re.compile(
    r"Tried to allocate "
    + _SIZE.format("tried")
    + r" \(GPU (?P<gpu>\d+); "
    + _SIZE.format("capacity")
    + r" total capacity"
)


def _to_mib(number: str | None, unit: str | None) -> float | None:
    if number is None or unit is None:  # a figure cut off before its unit is not a figure
        return None
    return round(float(number) * _UNIT_TO_MIB[unit], 2)


def parse_oom_message(text: str) -> dict | None:
    """PyTorch's OOM figures in MiB (capacity in GiB); None when the text has no 'Tried to allocate'."""
    match = _OOM_NEW.search(text)
    if match and match.group("gpu") is None:
        match = _OOM_OLD.search(text) or _OOM_OLD_HEAD.search(text) or match
    if not match:
        return None
    groups = match.groupdict()
    capacity = _to_mib(groups.get("capacity"), groups.get("capacity_unit"))
    return {
        "gpu": int(groups["gpu"]) if groups.get("gpu") is not None else None,
        "tried_to_allocate_mib": _to_mib(groups["tried"], groups.get("tried_unit")),
        "free_mib": _to_mib(groups.get("free"), groups.get("free_unit")),
        "capacity_gib": round(capacity / 1024, 2) if capacity is not None else None,
    }


# --- advice --------------------------------------------------------------------------------------

_ADVICE = {
    ("oom", "weight_load"): (
        "The weights did not fit while loading, before the KV pool is even sized, so a higher "
        "--mem-fraction-static will not help: use a layout that spreads the experts over more GPUs "
        "(the profile's fallback) and make sure no stale process holds GPU memory."
    ),
    ("oom", "kv_cache"): (
        "The weights loaded but too little memory was left for the KV pool: raise --mem-fraction-static "
        "a little, or lower --context-length or --max-running-requests."
    ),
    ("oom", "cuda_graph"): (
        "The KV pool left too little room to capture CUDA graphs: lower --cuda-graph-max-bs, or lower "
        "--mem-fraction-static a little to leave room for the graphs."
    ),
    ("oom", "runtime"): (
        "The server ran out of memory while running a batch: lower --chunked-prefill-size, "
        "--max-running-requests or --context-length."
    ),
    ("crashed", "nccl"): (
        "NCCL failed to set up or run its communicators: try the pcie_shm NCCL set (NCCL_P2P_DISABLE=1) "
        "and check IOMMU/ACS (iommu=pt in /proc/cmdline, ACSCtl in lspci -vvv)."
    ),
    ("crashed", "port_in_use"): (
        "The port is already taken: find the process holding it (ss -ltnp), usually a stale SGLang server "
        "from an earlier start, and stop it before starting again."
    ),
    ("crashed", "bad_weights"): (
        "The checkpoint could not be read as this model: re-verify the shards against the pinned revision "
        "(a truncated shard gives MetadataIncompleteBuffer) and check that the checkpoint matches the model "
        "and its quantization."
    ),
    ("crashed", "unsupported_arch"): (
        "A kernel has no build for this GPU (sm_120 on RTX PRO 6000 Blackwell): set "
        "SGLANG_ENABLE_JIT_DEEPGEMM=0 and use an SGLang build with sm_120 kernels (cu128 or newer)."
    ),
    ("crashed", "driver"): (
        "The NVIDIA driver does not fit this CUDA build or GPU: Blackwell needs driver branch 570 or newer "
        "with the open kernel modules; check nvidia-smi and /proc/driver/nvidia/version."
    ),
    ("crashed", "gpu_unavailable"): (
        "CUDA could not use this host's GPUs, which no other layout fixes: check nvidia-smi, ls -l /dev/nvidia*, "
        "lsmod | grep nvidia and journalctl -k | grep -i xid, fix the host, then restart sglang.service."
    ),
    ("crashed", "gpu_fault"): (
        "A GPU failed while running a kernel: look for Xid errors (journalctl -k | grep -i xid) and at nvidia-smi; "
        "Xid 79 (fallen off the bus) or an ECC Xid (48, 63, 64, 94, 95) is the hardware: reboot, and if it comes "
        "back check the GPU (nvidia-smi -q -d ECC, power, seating); with no Xid a kernel of this build faulted."
    ),
    ("crashed", "other"): (
        "The server failed for a reason this classifier does not know: read the deciding line and the "
        "traceback above it in the log excerpt."
    ),
    ("hung", "launch"): (
        "Nothing was logged after the start: check the unit's command line and that the virtualenv's "
        "Python starts at all."
    ),
    ("hung", "nccl_init"): (
        "Start-up stalled while NCCL set up its communicators: try the pcie_shm NCCL set "
        "(NCCL_P2P_DISABLE=1) and check IOMMU/ACS (iommu=pt, ACSCtl)."
    ),
    ("hung", "weight_load"): (
        "Weight loading made no progress: check the disk holding the weights and that no other process "
        "holds the GPUs; a ~600 GB model takes many minutes, so raise the hang timeout if the disk is slow."
    ),
    ("hung", "kv_cache"): (
        "Start-up stalled sizing the KV pool, which the ranks agree on with a collective: check for a dead "
        "rank and try the pcie_shm NCCL set (NCCL_P2P_DISABLE=1)."
    ),
    ("hung", "cuda_graph"): (
        "CUDA-graph capture stalled; it runs collectives on every rank: try the pcie_shm NCCL set "
        "(NCCL_P2P_DISABLE=1), or --disable-cuda-graph to confirm."
    ),
    ("hung", "warmup"): (
        "The server listens but its warm-up request never finished: a rank is stuck in a collective, so "
        "try the pcie_shm NCCL set (NCCL_P2P_DISABLE=1) and check IOMMU/ACS."
    ),
}


# gpu_unavailable, by reason (gpu_reason): what is wrong with the host and how to see and fix it
_GPU_ADVICE = {
    "no_device": (
        "CUDA could not open the GPUs: the device nodes are missing or closed to the unit, whose DeviceAllow= "
        "is resolved when it starts (a node made later stays closed). Check ls -l /dev/nvidia* (nvidiactl, "
        "nvidia-uvm, one nvidiaN per GPU) and systemctl status nvidia-uvm-devices.service "
        "nvidia-persistenced.service; once the nodes exist, restart sglang.service."
    ),
    "no_cuda": (
        "PyTorch found no usable GPU (torch.cuda.is_available() is False); the CUDA warning above says why. "
        "Check nvidia-smi, ls -l /dev/nvidia* and that the venv's PyTorch is a CUDA build "
        "(python -c 'import torch; print(torch.version.cuda)'); then restart sglang.service."
    ),
    "no_driver": (
        "The NVIDIA kernel driver is not loaded (or its nodes are missing): lsmod | grep nvidia, then "
        "modprobe nvidia and read its error; after a kernel update the module may not be built for the running "
        "kernel (dkms status, headers for uname -r), and Secure Boot refuses an unsigned one (mokutil --sb-state)."
    ),
    "driver_mismatch": (
        "The loaded kernel module and the driver's libraries are different versions, usually a driver update "
        "without a reboot: compare cat /proc/driver/nvidia/version with dpkg -l | grep nvidia, reboot the host, "
        "and keep the driver branch pinned so it does not move under a running host."
    ),
    "fabric_manager": (
        "CUDA reports the system not yet initialized (error 802): on an NVSwitch host nvidia-fabricmanager is "
        "not running or not the driver's version (systemctl status nvidia-fabricmanager); start it, then "
        "restart sglang.service."
    ),
    "gpu_lost": (
        "A GPU fell off the bus or is lost (Xid 79): journalctl -k | grep -i xid and nvidia-smi name it; only "
        "a reboot brings it back, and if it is lost again check its power, seating and temperature."
    ),
    "busy": (
        "CUDA sees the GPUs but may not use them: a GPU in Exclusive_Process compute mode held by another "
        "process (nvidia-smi; nvidia-smi -c DEFAULT), a node closed to the unit (ls -l /dev/nvidia* against "
        "systemctl cat sglang.service) or a GPU in a bad state (journalctl -k | grep -i xid)."
    ),
    "missing_gpu": (
        "Fewer GPUs can be opened than the layout uses: compare nvidia-smi -L and ls /dev/nvidia[0-9]* with the "
        "profile's GPU count; a GPU missing from both fell off the bus (journalctl -k | grep -i xid: reboot), "
        "one present but closed to the unit needs the deploy run again, which allows the nodes it finds."
    ),
}


def advice_for(state: str, phase: str | None = None, cause: str | None = None, reason: str | None = None) -> str:
    """One sentence that says what to change, following the OOM phase, crash cause or hang phase; for a
    gpu_unavailable crash, following its reason (gpu_reason) where known."""
    if state == "ready":
        return "The server is ready."
    if state == "starting":
        return f"The server is still starting (phase {phase or 'launch'}); wait for it or look again later."
    if state == "crashed" and cause == "gpu_unavailable" and reason in _GPU_ADVICE:
        return _GPU_ADVICE[reason]
    key = (state, cause if state == "crashed" else phase)
    return _ADVICE.get(key, _ADVICE[("crashed", "other")])


# --- verdicts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OomDetails:
    phase: str
    gpu: int | None
    tried_to_allocate_mib: float | None
    free_mib: float | None
    capacity_gib: float | None
    rank: str | None = None

    def to_dict(self) -> dict:
        return {
            "phase": self.phase,
            "gpu": self.gpu,
            "tried_to_allocate_mib": self.tried_to_allocate_mib,
            "free_mib": self.free_mib,
            "capacity_gib": self.capacity_gib,
            "rank": self.rank,
        }


@dataclass(frozen=True)
class Verdict:
    """What the log says. ``final`` is False while a failure is seen but its exception line is not."""

    state: str
    phase: str | None = None  # oom: the OOM phase; hung/starting/crashed: the start-up phase reached
    oom: OomDetails | None = None
    cause: str | None = None  # crashed only
    line: str | None = None  # the deciding line
    line_number: int | None = None  # 1-based, counting the lines fed
    rank: str | None = None
    advice: str = ""
    final: bool = True

    @property
    def failed(self) -> bool:
        return self.state in ("oom", "crashed", "hung")

    def to_dict(self) -> dict:
        return {
            "state": self.state,
            "phase": self.phase,
            "oom": self.oom.to_dict() if self.oom else None,
            "cause": self.cause,
            "line": self.line,
            "line_number": self.line_number,
            "rank": self.rank,
            "advice": self.advice,
        }


def _max_phase(a: str, b: str) -> str:
    return a if PROGRESS_PHASES.index(a) >= PROGRESS_PHASES.index(b) else b


@dataclass
class _Traceback:
    rank: str | None = None
    funcs: list = field(default_factory=list)
    files: list = field(default_factory=list)
    closed: bool = False  # its exception line was seen
    open_at_end: bool = False  # frames seen, no exception line and no progress since: a log cut inside it


class LogFollower:
    """Follow a live log line by line; the verdict is known as soon as its deciding line is fed.

    ``now`` is any monotonic clock in seconds (the caller's); it is only used for hang detection.
    """

    def __init__(self, started_at: float | None = None) -> None:
        self.lines_seen = 0
        self.last_progress_at = started_at
        self.pending_since: float | None = None  # a failure marker or bare exception awaits its partner
        self._rank_phase: dict[str, str] = {}
        self._launcher_phase = "launch"
        self._ready_line: tuple[str, int] | None = None
        self._failure: Verdict | None = None
        self._pending: Verdict | None = None
        self._marker_seen = False
        self._hint_cause: str | None = None
        self._hint_lines: list[str] = []  # the first lines that hinted at a cause (a CUDA warning, nvidia-smi's error)
        self._tb = _Traceback()
        self._last_line: str | None = None
        self._last_line_number: int | None = None

    # -- progress --
    @property
    def phase(self) -> str:
        """The start-up phase reached: the slowest rank's, unless the launcher already moved on."""
        ranked = [self._rank_phase[r] for r in self._rank_phase]
        slowest = min(ranked, key=PROGRESS_PHASES.index) if ranked else "launch"
        return _max_phase(self._launcher_phase, slowest)

    def _phase_of(self, rank: str | None) -> str:
        if rank and rank in self._rank_phase:
            return _max_phase(self._launcher_phase, self._rank_phase[rank])
        return self.phase

    # -- feeding --
    def feed(self, raw: str, now: float | None = None) -> Verdict:
        self.lines_seen += 1
        for parsed in split_line(raw):
            self._feed_one(parsed, now)
        return self.verdict(now)

    def feed_many(self, lines, now: float | None = None) -> Verdict:
        for raw in lines:
            self.feed(raw, now)
        return self.verdict(now)

    def _feed_one(self, line: ParsedLine, now: float | None) -> None:
        if self._failure is not None:
            return
        text, message = line.text, line.message
        if text.strip() and not _ACCESS_LOG.search(message):
            self._last_line, self._last_line_number = text, self.lines_seen
            if now is not None:
                self.last_progress_at = now
        for pattern, reached in _MILESTONES:
            if pattern.search(message):
                if line.rank:
                    self._rank_phase[line.rank] = _max_phase(self._rank_phase.get(line.rank, "launch"), reached)
                else:
                    self._launcher_phase = _max_phase(self._launcher_phase, reached)
                if self.pending_kind == "exception":  # the start went on: that traceback was not fatal
                    self._pending = self.pending_since = None
                self._tb.open_at_end = False
                break
        if _READY.search(message):
            self._ready_line = (text, self.lines_seen)

        if _TRACEBACK.search(text):
            if self._tb.closed or not self._tb.funcs:
                self._tb = _Traceback(rank=line.rank or self._tb.rank)
            elif line.rank:
                self._tb.rank = line.rank
        frame = _FRAME.match(text)
        if frame:
            self._tb.funcs.append(frame.group("func"))
            self._tb.files.append(frame.group("file"))
            self._tb.open_at_end = not self._tb.closed
            return

        if _NO_KV_TOKENS.search(message):
            # SGLang raises "Not enough memory" right after this line; a log cut here, or a marker that
            # follows, is that KV-pool OOM (an older draft model prints it too and goes on: progress clears it)
            if self._pending is None:
                self._pending = self._oom_verdict(text, "kv_cache", line.rank)
                self.pending_since = now
            return

        if _FAILURE_MARKER.search(text):
            self._marker_seen = True
            if line.rank:  # "[.. TP3] Scheduler hit an exception:", "[.. TP4] Exception in run_tp_server:"
                self._tb.rank = line.rank
            if self.pending_kind == "exception":
                self._decide(self._pending)
                return
            if self._pending is None:
                self._pending = Verdict(
                    state="crashed",
                    cause=_MARKER,
                    line=text,
                    line_number=self.lines_seen,
                    rank=line.rank,
                    final=False,
                )
                self.pending_since = now

        exc = _EXCEPTION_LINE.match(text) if not line.rank else None
        if exc is None and not (_CAUSE_PATTERNS[0][1].search(text) or _DEVICE_REFUSAL.search(text)):
            for cause, pattern in _CAUSE_PATTERNS[3:]:  # arch/driver/GPU warnings explain a later bare crash
                if pattern.search(text):
                    self._hint_cause = self._hint_cause or cause
                    if len(self._hint_lines) < _MAX_HINT_LINES:
                        self._hint_lines.append(text)
                    break
            return
        verdict, strong = self._judge(text, exc, line)
        self._tb.closed = exc is not None
        if strong or self._marker_seen:
            self._decide(verdict)
        elif self._pending is None:
            self._pending = verdict  # a bare exception: fatal only if a failure marker or the exit follows
            self.pending_since = now

    @property
    def pending_kind(self) -> str | None:
        """None, "marker" (a child failed, its reason not read yet) or "exception" (no marker yet)."""
        if self._pending is None:
            return None
        return "marker" if self._pending.cause == _MARKER else "exception"

    def _judge(self, text: str, exc, line: ParsedLine) -> tuple[Verdict, bool]:
        """The verdict one exception (or port) line gives, and whether it is decisive on its own."""
        rank = self._tb.rank or line.rank
        if _OOM_TEXT.search(text):
            return self._oom_verdict(text, self._oom_phase(text, rank), rank), True
        cause = None
        for name, pattern in _CAUSE_PATTERNS:
            if pattern.search(text):
                cause = name
                break
        strong = cause is not None
        if cause is None and exc is not None:
            read_weights = _WEIGHT_READ_FUNCS.intersection(self._tb.funcs)
            if read_weights and (_WEIGHT_MISMATCH.search(exc.group("name")) or _WEIGHT_MISMATCH.search(text)):
                cause = "bad_weights"
        cause = cause or self._hint_cause or "other"
        phase = self._frames_phase() or self._phase_of(rank)
        return Verdict(
            state="crashed",
            phase=phase,
            cause=cause,
            line=text,
            line_number=self.lines_seen,
            rank=rank,
            advice=self._crash_advice(cause, text if strong else None),
        ), strong

    def _crash_advice(self, cause: str, line: str | None = None) -> str:
        """The advice for a crash of this cause; a gpu_unavailable one follows its reason, read from the deciding
        line and the lines that hinted before it."""
        reason = gpu_reason(line, *self._hint_lines) if cause == "gpu_unavailable" else None
        return advice_for("crashed", cause=cause, reason=reason)

    def _oom_verdict(self, text: str, phase: str, rank: str | None) -> Verdict:
        figures = parse_oom_message(text) or {}
        oom = OomDetails(
            phase=phase,
            gpu=figures.get("gpu"),
            tried_to_allocate_mib=figures.get("tried_to_allocate_mib"),
            free_mib=figures.get("free_mib"),
            capacity_gib=figures.get("capacity_gib"),
            rank=rank,
        )
        return Verdict(
            state="oom",
            phase=phase,
            oom=oom,
            line=text,
            line_number=self.lines_seen,
            rank=rank,
            advice=advice_for("oom", phase),
        )

    def _frames_phase(self) -> str | None:
        """The start-up phase the traceback's frames were in, or None when they do not say."""
        funcs = set(self._tb.funcs)
        if funcs & _GRAPH_FUNCS:
            return "cuda_graph"
        if funcs & _RUNTIME_FUNCS or any(f.startswith("event_loop") for f in funcs):
            return "ready"
        if any("cuda_graph_runner" in f for f in self._tb.files):
            return "cuda_graph"
        if funcs & _KV_FUNCS or any("memory_pool" in f for f in self._tb.files):
            return "kv_cache"
        if funcs & _LOAD_FUNCS:
            return "weight_load"
        if funcs & _DIST_FUNCS:
            return "nccl_init"
        return None

    def _oom_phase(self, text: str, rank: str | None) -> str:
        if _GRAPH_TEXT.search(text):
            return "cuda_graph"
        if _KV_POOL_TEXT.search(text):
            return "kv_cache"
        reached = self._frames_phase() or self._phase_of(rank)
        # before the KV pool is sized everything on the GPU is weights (or someone else's memory)
        return _OOM_PHASE_OF.get(reached, "weight_load")

    def _decide(self, verdict: Verdict) -> None:
        if verdict.cause == _MARKER:  # a marker alone: the child failed, nobody said why
            verdict = Verdict(
                state="crashed",
                phase=self._frames_phase() or self._phase_of(verdict.rank),
                cause=self._hint_cause or "other",
                line=verdict.line,
                line_number=verdict.line_number,
                rank=verdict.rank,
                advice=self._crash_advice(self._hint_cause or "other"),
            )
        self._failure = Verdict(**{**verdict.__dict__, "final": True})
        self._pending = None

    # -- reading the verdict --
    def verdict(self, now: float | None = None, hang_seconds: float | None = None) -> Verdict:
        """The verdict so far. A failure seen without its partner line comes back with final=False."""
        if self._failure is not None:
            return self._failure
        if self._pending is not None:
            pending = self._pending
            if pending.cause == _MARKER:
                cause = self._hint_cause or "other"
                pending = Verdict(
                    state="crashed",
                    phase=self._frames_phase() or self._phase_of(pending.rank),
                    cause=cause,
                    line=pending.line,
                    line_number=pending.line_number,
                    rank=pending.rank,
                    advice=self._crash_advice(cause),
                    final=False,
                )
            return Verdict(**{**pending.__dict__, "final": False})
        if self._ready_line is not None:
            text, number = self._ready_line
            return Verdict(state="ready", line=text, line_number=number, advice=advice_for("ready"))
        phase = self.phase
        if (
            hang_seconds is not None
            and now is not None
            and self.last_progress_at is not None
            and now - self.last_progress_at >= hang_seconds
        ):
            return Verdict(state="hung", phase=phase, advice=advice_for("hung", phase), line=self._last_line)
        return Verdict(state="starting", phase=phase, advice=advice_for("starting", phase), final=False)

    def finish(self) -> Verdict:
        """No more lines will come: a failure still waiting for its partner line is taken as it is, and a
        log that ends inside a traceback (cut before its exception line) is a crash placed by its frames."""
        if self._failure is None and self._pending is None and self._tb.open_at_end and self._ready_line is None:
            self._pending = Verdict(
                state="crashed",
                cause=_MARKER,
                line=self._last_line,
                line_number=self._last_line_number,
                rank=self._tb.rank,
            )
        if self._failure is None and self._pending is not None:
            self._decide(self._pending)
        return self.verdict()


def _lines_of(lines) -> list[str]:
    if isinstance(lines, str):
        return lines.split("\n")  # not splitlines(): tqdm's carriage returns are not new lines
    return list(lines)


def newest_first(lines) -> bool:
    """Whether a saved log runs newest first, as some log viewers export it.

    By its time stamps when they say (more steps back in time than forward), else by its tracebacks:
    read backwards, "Traceback (most recent call last):" comes right after a frame instead of before one,
    and the exception line before its frames instead of after them.
    """
    parsed = [piece for raw in _lines_of(lines) for piece in split_line(raw) if piece.text.strip()]
    stamps = [p.stamp for p in parsed if p.stamp]
    back = sum(1 for a, b in zip(stamps, stamps[1:], strict=False) if b < a)
    forward = sum(1 for a, b in zip(stamps, stamps[1:], strict=False) if b > a)
    if back != forward:
        return back > forward
    votes = 0
    for i, piece in enumerate(parsed):
        if _TRACEBACK.search(piece.message):
            before = parsed[i - 1].text if i > 0 else ""
            after = parsed[i + 1].text if i + 1 < len(parsed) else ""
            votes += 1 if _FRAME.match(before) and not _FRAME.match(after) else -1
        elif _EXCEPTION_LINE.match(piece.text):  # an excerpt without a header: frames come before its exception
            frames_before = any(_FRAME.match(p.text) for p in parsed[max(0, i - 3) : i])
            frames_after = any(_FRAME.match(p.text) for p in parsed[i + 1 : i + 4])
            votes += (frames_after and not frames_before) - (frames_before and not frames_after)
    return votes > 0


def is_log(lines) -> bool:
    """Whether the text reads as log output at all: a line with a journal, collector or SGLang prefix, a
    journal entry, or a Python traceback. A README or a config file has none of these."""
    for raw in _lines_of(lines):
        for piece in split_line(raw):
            if piece.framed or _TRACEBACK.search(piece.text) or _FRAME.match(piece.text):
                return True
    return False


# SGLang logs its arguments once at each launch, before any rank starts: where a log holds several starts (a
# whole unit's journal export), the last start is the one judged, not the first failure in the file. 0.5.10 logs the
# dataclass (server_args=ServerArgs(...)), 0.5.23 its resolved record as a dict (server_args={...}).
_LAUNCH = re.compile(r"\bserver_args=(?:ServerArgs\(|\{)")


def launches(lines) -> list[int]:
    """The indices of the lines (oldest first) where a launch begins."""
    return [i for i, raw in enumerate(_lines_of(lines)) if any(_LAUNCH.search(p.message) for p in split_line(raw))]


def classify(lines, idle_seconds: float | None = None, hang_seconds: float | None = None) -> Verdict:
    """Classify a whole log (a string or an iterable of lines), oldest or newest line first; of a log holding
    several starts, its last start (line numbers still count from the top of the log as given).

    ``idle_seconds`` is how long the log has been silent after its last line; with ``hang_seconds``
    a log that ends while starting is ``hung`` once idle_seconds >= hang_seconds.
    """
    lines = _lines_of(lines)
    reversed_ = newest_first(lines)
    if reversed_:
        lines = lines[::-1]
    skipped = (launches(lines) or [0])[-1]
    follower = LogFollower(started_at=0.0)
    for raw in lines[skipped:]:
        follower.feed(raw, now=0.0)
    verdict = follower.finish()
    if verdict.state == "starting" and idle_seconds is not None:
        verdict = follower.verdict(now=float(idle_seconds), hang_seconds=hang_seconds)
    if verdict.line_number is not None:
        number = verdict.line_number + skipped
        verdict = replace(verdict, line_number=len(lines) + 1 - number if reversed_ else number)
    return verdict
