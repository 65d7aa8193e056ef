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
from . import hostfs as H
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
    if kind == "prefill_graph":
        return TB.prefill_graph_oom(payload[0])
    if kind == "nccl":
        return TB.nccl_error()
    if kind == "invalid_ordinal":
        return TB.invalid_ordinal()
    return f"Traceback (most recent call last):\nRuntimeError: {kind}"


# What a rank does to its host when it reaches a phase (the log line that opens it), as real SGLang does.
def host_step(message: str, job: dict) -> None:
    visible = job["visible"]
    if message.startswith(("Init torch distributed begin", "Init parallel begin")):  # 0.5.10, 0.5.23
        H.cuda_init(job["gpu"], visible)  # set_device
        H.nccl_segment()  # the communicators' shared memory
        if job.get("p2p_check"):  # custom all-reduce on a 2-GPU TP group
            H.p2p_access_cache(visible, writer=job["gpu"] == 0)
    elif message.startswith("Load weight end"):
        H.triton_first_kernel()  # weight post-processing runs the first Triton kernels
        H.flashinfer_jit()


def fail(clock: Clock, prefix: str, parent: int, text: str) -> None:
    line(clock, prefix, "Scheduler hit an exception: " + text)
    # SGLang's scheduler sends one SIGQUIT and waits to be killed (the server's handler takes the first of several
    # ranks' signals without blocking: server.claim_death).
    with contextlib.suppress(ProcessLookupError):
        os.kill(parent, signal.SIGQUIT)
    while True:
        time.sleep(3600)


def runtime_oom_text(gpu: int, used: int) -> str:
    """PyTorch's OOM for a prefill's activations on this rank's GPU, which holds `used` bytes once serving
    (weights, KV pool, CUDA graphs: all PyTorch's but the CUDA context and NCCL's buffers)."""
    total = G.torch_total_bytes(G.load_spec())
    outside = min(used, G.CUDA_CONTEXT_BYTES + G.NCCL_COMM_BYTES)
    a = G.CachingAllocator(device=gpu, total=total, pid=os.getpid(), non_pytorch=outside)
    a.segments.append(G.Segment(used - outside, used - outside))
    a.allocated = used - outside
    alloc = -(-(a.device_free() + 512 * G.MiB) // G.K_ROUND_LARGE) * G.K_ROUND_LARGE
    return TB.oom_forward(a.oom_message(alloc))


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
        os.write(ready_fd, b"1")  # up; b"2" follows when this rank is ready to serve
    clock = Clock(float(sys.stdin.readline()))
    prefix = job["prefix"]
    visible = job["visible"]
    pid = os.getpid()
    signal.signal(signal.SIGTERM, lambda *_: (G.remove_state(pid), os._exit(0)))
    used = {"bytes": 0}
    # fault oom_runtime: the server's main process signals the rank whose forward pass runs out of memory
    signal.signal(signal.SIGUSR1, lambda *_: fail(clock, prefix, parent, runtime_oom_text(job["gpu"], used["bytes"])))
    for t, kind, payload in job["events"]:
        clock.sleep_until(t)
        if kind in ("log", "warn"):
            line(clock, prefix, payload)
            if kind == "log":
                began = time.time()
                try:
                    host_step(payload, job)
                except H.HostDenied as exc:
                    fail(clock, prefix, parent, str(exc))
                clock.wall_start += time.time() - began  # real work (a compile) delays the rest of the plan
        elif kind == "raw":
            emit(payload)
        elif kind == "mem":
            held = {visible[int(g)]: int(b) for g, b in payload.items()}
            G.write_state(pid, title, held, {"server_pid": parent})
            used["bytes"] = sum(held.values())
        elif kind == "fail":
            fkind, fpayload = payload
            fail(clock, prefix, parent, failure_text(fkind, fpayload, job["arch"]))
        elif kind == "hang":
            while True:
                time.sleep(3600)
        elif kind == "ready" and ready_fd >= 0:
            os.write(ready_fd, b"2")
            os.close(ready_fd)
            ready_fd = -1
    # Serving: the next kernel launch on a GPU that fell off the bus fails (sim/lab/lab.py fault HOST xid79)
    physical = visible[job["gpu"]] if job["gpu"] < len(visible) else job["gpu"]
    while physical not in G.lost_gpus():
        time.sleep(0.2)
    fail(clock, prefix, parent, TB.gpu_lost_forward())


if __name__ == "__main__":
    main()
