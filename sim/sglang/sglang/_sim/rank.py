"""One scheduler rank (`sglang::scheduler_TPn`): plays its part of the start-up plan.

Started by the main process with `python -m sglang._sim.rank`, the plan as JSON on stdin. Like SGLang's
scheduler processes it dies with its parent (prctl PR_SET_PDEATHSIG=SIGKILL), holds its GPU memory in the
state directory, and on a start-up failure logs `Scheduler hit an exception:` and sends SIGQUIT to its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time

from . import gpu as G
from . import tracebacks as TB
from .clock import Clock
from .logs import emit, line

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1


def _prctl(option: int, arg) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def set_title(title: str) -> None:
    _prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]))


def die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def failure_text(kind: str, payload, arch: str) -> str:
    if kind == "oom_weights":
        message, tensor = payload
        if tensor.endswith(("w_kc", "w_vc")):
            return TB.oom_post_load(message)
        return TB.oom_weights(message, tensor, arch)
    if kind == "kv":
        return TB.kv_not_enough()
    if kind == "oom_kv_alloc":
        return TB.oom_kv_alloc(payload[0])
    if kind == "graph":
        return TB.graph_oom(payload[0])
    if kind == "nccl":
        return TB.nccl_error()
    if kind == "invalid_ordinal":
        return TB.invalid_ordinal()
    return f"Traceback (most recent call last):\nRuntimeError: {kind}"


def main() -> None:
    die_with_parent()
    job = json.loads(sys.stdin.readline())
    parent = job["parent"]
    if os.getppid() != parent:  # parent died before we armed PDEATHSIG
        sys.exit(0)
    title = job["title"]
    set_title(title)
    ready_fd = int(os.environ.pop("SGLANG_SIM_READY_FD", "-1"))
    if ready_fd >= 0:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    clock = Clock(float(sys.stdin.readline()))
    prefix = job["prefix"]
    visible = job["visible"]
    pid = os.getpid()
    signal.signal(signal.SIGTERM, lambda *_: (G.remove_state(pid), os._exit(0)))
    for t, kind, payload in job["events"]:
        clock.sleep_until(t)
        if kind in ("log", "warn"):
            line(clock, prefix, payload)
        elif kind == "raw":
            emit(payload)
        elif kind == "mem":
            used = {visible[int(g)]: int(b) for g, b in payload.items()}
            G.write_state(pid, title, used, {"server_pid": parent})
        elif kind == "fail":
            fkind, fpayload = payload
            line(clock, prefix, "Scheduler hit an exception: " + failure_text(fkind, fpayload, job["arch"]))
            with contextlib.suppress(ProcessLookupError):
                os.kill(parent, signal.SIGQUIT)
            while True:
                time.sleep(3600)
        elif kind == "hang":
            while True:
                time.sleep(3600)
        elif kind == "ready":
            pass
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
