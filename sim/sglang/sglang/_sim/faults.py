"""Injected faults: env SGLANG_SIM_FAULTS = JSON list of {"fault": NAME, "flags": {...}, ...}.

A fault applies to this start when every entry of its optional "flags" equals the parsed flag (null: the
flag is unset) and every entry of its optional "env" equals the environment (null: unset); flag keys as
ServerArgs fields or as flags: "tp_size", "tp-size", "--tp-size"); without "flags" it applies to every
start. Optional "release": "0.5.23" (or a list of releases) limits it to starts of the simulator as that SGLang release
(_sim/release.py), so a unit whose environment carries the fault list serves healthily on 0.5.10 and shows the fault
once upgraded to 0.5.23: a release that regressed. Other keys ("profile", comments) are ignored. Optional "gpus": [ids]
restricts the OOM faults to those GPUs and places the stale process; optional "mib" sizes the stale process's memory
on each of its GPUs; "after_requests" (oom_runtime, default 0) is how many client requests the server answers before
the next one runs out of memory in the forward pass. "garbage": the server starts and serves, but every answer is a
run of "!" (what NaN logits decode to; FACTS: NVFP4 and Marlin-MoE kernels on sm_120). "parser_missing": the server
reports its --tool-call-parser and --reasoning-parser but answers with the model's raw tokens, as one whose parsers did
not apply. "slow": the server serves correctly but every prefill and decode step takes "factor" (default 1.2) times as
long in simulated time, so a benchmark sees throughput divided by it (20 % slower) and longer TTFT and ITL: a
release with a performance regression.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from . import gpu as G
from . import release as R
from .clock import Clock
from .logs import line

FAULTS = ("oom_weight_load", "oom_kv_cache", "oom_cuda_graph", "crash", "hang", "stale_gpu_process",
          "port_in_use", "oom_runtime", "garbage", "parser_missing", "slow")
SLOW_FACTOR = 1.2  # "slow" without "factor": 20 % slower


def _norm(key: str) -> str:
    return key.lstrip("-").replace("-", "_")


def _matches(args, flags: dict) -> bool:
    for key, want in (flags or {}).items():
        have = getattr(args, _norm(key), None)
        if want is None:  # null: the flag must be left at its default (unset)
            if have is not None:
                return False
        elif isinstance(have, bool) or isinstance(want, bool):
            if bool(have) != (want if isinstance(want, bool) else str(want).lower() in ("1", "true", "yes")):
                return False
        elif have is None or str(have) != str(want):
            try:
                if float(have) != float(want):
                    return False
            except (TypeError, ValueError):
                return False
    return True


def _env_matches(env: dict | None) -> bool:
    """Optional "env": {VAR: value or null}; null means the variable must be unset (e.g. a P2P hang
    that NCCL_P2P_DISABLE=1 avoids: {"NCCL_P2P_DISABLE": null})."""
    for var, want in (env or {}).items():
        have = os.environ.get(var)
        if (want is None and have is not None) or (want is not None and have != str(want)):
            return False
    return True


def active_faults(args, clock: Clock) -> list[dict]:
    raw = os.environ.get("SGLANG_SIM_FAULTS", "").strip()
    if not raw:
        return []
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        line(clock, "", f"SGLANG_SIM_FAULTS is not valid JSON, ignored: {exc}")
        return []
    if isinstance(entries, dict):
        entries = [entries]
    out = []
    for e in entries:
        if not isinstance(e, dict) or e.get("fault") not in FAULTS:
            line(clock, "", f"SGLANG_SIM_FAULTS: unknown fault entry ignored: {e!r}")
            continue
        release = e.get("release")
        releases = [release] if isinstance(release, str) else release
        if release is not None and not (isinstance(releases, list) and all(isinstance(r, str) for r in releases)):
            line(clock, "", f"SGLANG_SIM_FAULTS: a fault's \"release\" is a release or a list of them, entry "
                            f"ignored: {e!r}")
            continue
        if release is not None and R.current() not in releases:
            continue
        if _matches(args, e.get("flags")) and _env_matches(e.get("env")):
            out.append(e)
    return out


def slowdown(faults: list[dict], clock: Clock) -> float:
    """How many times longer prefill and decode take: an active "slow" fault's "factor" (default SLOW_FACTOR),
    else 1.0."""
    for f in faults:
        if f["fault"] == "slow":
            factor = f.get("factor", SLOW_FACTOR)
            if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0:
                return float(factor)
            line(clock, "", f"SGLANG_SIM_FAULTS: slow's \"factor\" must be a positive number (1.2: 20 % slower), "
                            f"not {factor!r}; {SLOW_FACTOR} is used.")
            return SLOW_FACTOR
    return 1.0


def ensure_stale_holder(fault: dict, spec: dict) -> None:
    """Leave a detached `sglang::scheduler_TP0` holding GPU memory, unless one from this fault is alive."""
    for rec in G.live_processes():
        if rec.get("stale"):
            return
    gpus = fault.get("gpus") if isinstance(fault.get("gpus"), list) else [0]
    mib = int(fault.get("mib", 81920))
    cmd = [sys.executable, "-m", "sglang._sim.stale", json.dumps({"gpus": gpus, "mib": mib})]
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x])
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=env)
    p.wait()  # the first child forks the holder and exits
    for _ in range(100):  # wait until the holder has written its state
        if any(rec.get("stale") for rec in G.live_processes()):
            return
        import time
        time.sleep(0.02)


def runtime_oom_after(faults: list[dict]) -> int | None:
    """Requests served before the runtime OOM of an active oom_runtime fault; None without one."""
    for f in faults:
        if f["fault"] == "oom_runtime":
            try:
                return max(0, int(f.get("after_requests", 0)))
            except (TypeError, ValueError):
                return 0
    return None
