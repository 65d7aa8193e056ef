"""The main process of `python -m sglang.launch_server` (the simulator).

Parses SGLang's flags, checks them as SGLang does, plans the start-up of every scheduler rank, starts one
process per rank, serves HTTP once the ranks are ready, and on a rank's failure dies like SGLang:
`Received sigquit from a child process. It usually means the child failed.` then SIGKILL to the whole tree.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from . import faults as F
from . import gpu as G
from . import hostfs as H
from . import release as R
from . import tracebacks as TB
from .args import parse_args
from .clock import Clock
from .http import State, make_server
from .logs import emit, line
from .metrics import Metrics
from .model import ConfigError, load_config
from .plan import T_WARMUP, build_plan, default_mem_settings
from .scheduler import prefill_message

CHILDREN: list[subprocess.Popen] = []
_DYING = threading.Event()
_DEATH_CLAIMED = threading.Lock()


def claim_death() -> bool:
    """True for the first caller only, and never waits. The server's death is claimed from signal handlers, and
    Python runs a handler in the main thread between any two bytecodes, also inside the handler itself: when all
    ranks fail together, their SIGQUITs arrive one after the other, and a second on_sigquit ran inside the first
    one's _DYING.set(), after it had taken the Event's lock and before it set the flag; is_set() said no, and its
    own set() then waited for that lock forever (the main thread in a futex wait, no 'Received sigquit' line: CI
    saw it about once in 40 starts; a stress run of the fault tests with all ranks failing, 2 in 70). A lock taken
    without blocking cannot deadlock its own holder."""
    if not _DEATH_CLAIMED.acquire(blocking=False):
        return False
    _DYING.set()
    return True
# The HTTP server's state once it serves (serve() sets it): SIGTERM drains it before the tree goes down.
_SERVING: list[State] = []
# TokenizerManager.sigterm_watchdog's period: it looks for the SIGTERM flag, then for requests left, every 5 s.
DRAIN_LOG_INTERVAL = 5.0


# The signals SGLang's main process handles. Python runs a handler in the main thread, but the kernel hands a
# process-directed signal to any thread that does not block it: one caught by a helper thread leaves the main
# thread asleep and the server alive. So every helper thread is born with them blocked (a thread inherits the
# mask of the thread that creates it: blocking them only once it runs left a window, which CI hit), and the main
# thread waits in short sleeps (wait_to_be_killed), so that a handler a stray delivery queued still runs.
MAIN_THREAD_SIGNALS = {signal.SIGQUIT, signal.SIGTERM, signal.SIGINT}


def start_helper_thread(target, *args) -> threading.Thread:
    """A daemon thread that leaves MAIN_THREAD_SIGNALS to the main thread (threads it starts inherit this)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
    try:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a signal that came meanwhile is delivered now
    return t


def wait_to_be_killed() -> None:
    """The main thread's idle wait: signal handlers run within a second of any delivery."""
    while True:
        time.sleep(1)


def kill_process_tree(include_parent: bool) -> None:
    """sglang.srt.utils.kill_process_tree: SIGKILL children, then (optionally) ourselves."""
    for p in CHILDREN:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    if include_parent:
        os.kill(os.getpid(), signal.SIGKILL)


def visible_gpus(spec: dict) -> list[int]:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = int(spec["count"])
    if cvd is None:
        return list(range(count))
    out = []
    for tok in cvd.split(","):
        tok = tok.strip()
        if not tok.isdigit() or int(tok) >= count:
            break  # CUDA stops at the first invalid entry
        out.append(int(tok))
    return out


INTERNAL_ARGS = ("release", "reported", "graphs", "dp_conflict")  # the simulator's own, not SGLang's fields


def server_args_repr(args) -> str:
    """What the engine logs after `server_args=`: 0.5.10's dataclass repr, 0.5.23's resolved record as a dict
    (engine.py _server_args_for_logging: ServerArgs.resolved_dict())."""
    fields = {k: getattr(args, k) for k in sorted(vars(args)) if not k.startswith("_") and k not in INTERNAL_ARGS}
    if args.release == "0.5.10":
        return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"
    fields = {k: v for k, v in fields.items() if k not in ("cuda_graph_max_bs", "cuda_graph_bs")}
    return repr({**fields, **args.reported, "cuda_graph_config": args.graphs})


def check_args(args) -> None:
    """Checks SGLang runs in the main process before any scheduler starts (exception -> exit 1)."""
    if args.tp_size < 1 or args.pp_size < 1 or args.ep_size < 1 or args.dp_size < 1:
        raise ValueError("tp_size, pp_size, ep_size and dp_size must be positive")
    if args.tp_size % args.ep_size != 0:
        raise ValueError(f"tp_size {args.tp_size} must be divisible by ep_size {args.ep_size}")
    if getattr(args, "dp_conflict", None):  # 0.5.23 _handle_data_parallelism
        raise ValueError(args.dp_conflict)
    if args.enable_dp_attention and args.tp_size % args.dp_size != 0:
        # 0.5.23 asserts tp_size % attn_dp_size == 0 without a message
        raise AssertionError("" if args.release != "0.5.10" else
                             "tp_size must be divisible by dp_size when dp attention is enabled")
    if args.enable_dp_lm_head and not args.enable_dp_attention:
        raise AssertionError("Please enable dp attention when setting enable_dp_lm_head. ")
    if (args.tp_size * args.pp_size) % args.nnodes != 0:
        raise ValueError("tp_size * pp_size must be divisible by the number of nodes.")
    if args.pp_size > 1 and (args.speculative_algorithm is not None or args.enable_mixed_chunk):
        raise ValueError("Pipeline parallelism is not compatible with overlap schedule, speculative decoding, "
                         "or mixed chunked prefill.")
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static < 1:
        raise AssertionError(f"mem_fraction_static must be in (0, 1), got {args.mem_fraction_static}")


def main(argv: list[str] | None = None) -> None:
    try:
        R.current()
    except R.UnknownRelease as exc:
        emit(f"sglang (moefleet simulator): {exc}")
        sys.exit(1)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    clock = Clock()
    clock.logical = 0.0
    main_pid = os.getpid()
    try:
        check_args(args)
        cfg = load_config(args.model_path)
    except (ValueError, AssertionError, ConfigError) as exc:
        kind = type(exc).__name__ if not isinstance(exc, ConfigError) else "OSError"
        emit(TB.main_exception(kind, str(exc), [
            (os.path.join(TB.PKG, "srt/server_args.py"), 4551, "prepare_server_args",
             "return ServerArgs.from_cli_args(raw_args)"),
            (os.path.join(TB.PKG, "srt/server_args.py"), 620, "__post_init__", "self.check_server_args()"),
        ]))
        sys.exit(1)
    # A fault matches the flags as given (null: not on the command line), so before the defaults are filled.
    faults = F.active_faults(args, clock)
    # ServerArgs.__post_init__ fills the memory defaults (and logs the DP-attention and PP notes) before
    # the engine logs server_args=, so the line shows the computed values, not None.
    spec = G.load_spec()
    default_mem_settings(args, cfg, int(spec["memory_total_mib"]))
    if args.enable_dp_attention and args.release != "0.5.10":  # parallel_hook._handle_data_parallelism
        line(clock, "", f"DP attention is enabled. chunked prefill size is adjusted from "
                        f"{args._chunked_prefill_before_dp} to {args.chunked_prefill_size}.")
    elif args.enable_dp_attention:
        line(clock, "", f"DP attention is enabled. The chunked prefill size is adjusted to "
                        f"{args.chunked_prefill_size} to avoid MoE kernel issues. ")
    if args.pp_size > 1:
        line(clock, "", "Pipeline parallelism is incompatible with overlap schedule.")
    for note in getattr(args, "_resolution_notes", ()):
        line(clock, "", note)
    if args.trust_remote_code:  # the tokenizer's code, copied by transformers into $HF_HOME/modules
        try:
            H.copy_remote_code(args.model_path)
        except H.HostDenied as exc:
            emit(str(exc))
            sys.exit(1)
    line(clock, "", f"server_args={server_args_repr(args)}")
    visible = visible_gpus(spec)
    if any(f["fault"] == "stale_gpu_process" for f in faults):
        F.ensure_stale_holder(next(f for f in faults if f["fault"] == "stale_gpu_process"), spec)
    plan = build_plan(args, cfg, spec, dict(os.environ), faults, visible, exclude_pids=set())

    def on_sigquit(*_):
        if not claim_death():  # the first caller logs and kills the tree
            return
        fails = [e[0] for rp in plan.ranks for e in rp.events if e[1] == "fail"]
        clock.logical = (min(fails) if fails else clock.sim_now()) + 0.1
        line(clock, "", "Received sigquit from a child process. It usually means the child failed.")
        kill_process_tree(include_parent=True)

    def on_sigterm(*_):
        if _SERVING and _SERVING[0].draining:
            return  # a second SIGTERM while draining: the first one's wait goes on
        serving = bool(_SERVING) and not _DYING.is_set()
        if serving:
            drain(_SERVING[0], clock)
        claim_death()
        for p in CHILDREN:
            G.remove_state(p.pid)
        if serving:  # sigterm_watchdog's end: kill_process_tree(os.getpid(), include_parent=True)
            kill_process_tree(include_parent=True)
        # Before it serves SGLang has no SIGTERM handler (it is installed with the first request): Python's
        # default ends the main process by the signal, and the ranks go with it.
        kill_process_tree(include_parent=False)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGQUIT, on_sigquit)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)

    arch = cfg.architecture
    ready_r, ready_w = os.pipe()
    env = dict(os.environ, SGLANG_SIM_READY_FD=str(ready_w), PYTHONPATH=os.pathsep.join(
        [os.path.dirname(TB.PKG)] + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]))
    for rp in plan.ranks:
        job = {"parent": main_pid, "prefix": rp.rank.log_prefix, "title": rp.rank.proc_title,
               "visible": visible, "arch": arch, "events": rp.events, "gpu": rp.rank.gpu_id,
               "p2p_check": args.tp_size == 2 and not getattr(args, "disable_custom_all_reduce", False)}
        p = subprocess.Popen([sys.executable, "-m", "sglang._sim.rank"], stdin=subprocess.PIPE, env=env,
                             pass_fds=(ready_w,))
        p.stdin.write(json.dumps(job).encode() + b"\n")
        p.stdin.flush()
        CHILDREN.append(p)
    os.close(ready_w)
    got = 0
    while got < len(CHILDREN):  # every rank process is up before the simulated clock starts
        if not select.select([ready_r], [], [], 0.2)[0]:
            if any(p.poll() is not None for p in CHILDREN) and not _DYING.is_set():
                time.sleep(0.5)  # a rank died before it was up: its SIGQUIT is on the way
                on_sigquit()
            continue
        chunk = os.read(ready_r, 64)
        if not chunk:
            break
        got += len(chunk)
    clock.wall_start = time.time()
    for p in CHILDREN:
        with contextlib.suppress(BrokenPipeError):
            p.stdin.write(f"{clock.wall_start!r}\n".encode())
            p.stdin.close()

    start_helper_thread(_watch_children, clock)

    if plan.ready_at is None:  # start-up fails (a rank sends SIGQUIT) or hangs: wait to be killed
        wait_to_be_killed()
    clock.sleep_until(plan.ready_at)
    # Like SGLang's main process, serve only once every scheduler says it is ready: a rank that spent real
    # time on its host (a first Triton compile) is later than the plan.
    began, ready = time.time(), 0
    while ready < len(CHILDREN) and not _DYING.is_set():
        if select.select([ready_r], [], [], 0.2)[0]:
            chunk = os.read(ready_r, 64)
            if not chunk:
                break
            ready += chunk.count(b"2")
    os.close(ready_r)
    clock.wall_start += time.time() - began
    if _DYING.is_set():
        wait_to_be_killed()
    serve(args, plan, cfg, clock, faults)


def drain(state: State, clock: Clock) -> None:
    """SGLang 0.5.10's graceful exit on SIGTERM (SignalHandler.sigterm_handler, TokenizerManager.sigterm_watchdog):
    /health turns 503 at once, requests keep being taken (new ones too), and a watchdog looking every 5 s lets
    the server go once none is left; SGL_FORCE_SHUTDOWN=1 skips the wait. The caller then SIGKILLs the ranks
    and the server itself (kill_process_tree(include_parent=True)), so systemd sees a main process killed by
    SIGKILL. Runs in the main thread (the signal handler); the HTTP threads keep streaming meanwhile. A second
    SIGTERM while it waits changes nothing; under steady load it never ends, and systemd's SIGKILL after
    TimeoutStopSec= does."""
    state.draining = True
    # asyncio's add_signal_handler calls the handler without arguments
    line(clock, "", "SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
    since = time.monotonic() - state.ready_since
    time.sleep(DRAIN_LOG_INTERVAL - since % DRAIN_LOG_INTERVAL)  # the watchdog's next look
    while True:
        if os.environ.get("SGL_FORCE_SHUTDOWN", "").lower() in ("1", "true"):
            line(clock, "", "Signal SIGTERM received while force shutdown flag set. Force exiting.")
            return
        remaining = state.running
        rids = [f"sim-{i}" for i in range(remaining)]
        line(clock, "", f"Gracefully exiting... Remaining number of requests {remaining}. "
                        f"Remaining requests remaining_rids={rids}.")
        if remaining == 0:
            return
        time.sleep(DRAIN_LOG_INTERVAL)


def _watch_children(clock: Clock) -> None:
    """TokenizerManager's watchdog: a scheduler that disappears takes the server down."""
    while not _DYING.is_set():
        for i, p in enumerate(CHILDREN):
            if p.poll() is not None and claim_death():
                clock.logical = None
                line(clock, "", f"Rank {i} scheduler is dead. Please check if there are relevant logs.")
                kill_process_tree(include_parent=True)
        time.sleep(0.2)


def serve(args, plan, cfg, clock: Clock, faults: list[dict]) -> None:
    tp0 = next(rp.rank for rp in plan.ranks if rp.rank.tp_rank == 0 and rp.rank.pp_rank == 0)
    state = State(args, plan, cfg, clock, tp0.log_prefix, slowdown=F.slowdown(faults, clock))
    start_helper_thread(state.scheduler.run)
    state.runtime_oom_after = F.runtime_oom_after(faults)
    state.garbage = any(f["fault"] == "garbage" for f in faults)
    state.parsers_apply = not any(f["fault"] == "parser_missing" for f in faults)
    tp0_proc = CHILDREN[plan.ranks.index(next(rp for rp in plan.ranks if rp.rank is tp0))]
    state.runtime_oom = lambda: tp0_proc.send_signal(signal.SIGUSR1)  # rank.py: OOM in the forward pass
    if args.enable_metrics:  # each scheduler's series names its process (pid) where SGLang's do
        state.metrics = Metrics(args, plan, [p.pid for p in CHILDREN], (state.s1, state.agg))
    _SERVING.append(state)
    emit(f"INFO:     Started server process [{os.getpid()}]")
    emit("INFO:     Waiting for application startup.")
    emit("INFO:     Application startup complete.")
    bind_error = None
    srv = None
    if any(f["fault"] == "port_in_use" for f in faults):
        bind_error = errno.EADDRINUSE
    else:
        try:
            srv = make_server(args.host, args.port, state)
        except OSError as exc:
            bind_error = exc.errno
    if bind_error is not None:
        reason = os.strerror(bind_error).lower() if bind_error != errno.EADDRINUSE else "address already in use"
        emit(f"ERROR:    [Errno {bind_error}] error while attempting to bind on address "
             f"('{args.host}', {args.port}): {reason}")
        emit("INFO:     Waiting for application shutdown.")
        emit("INFO:     Application shutdown complete.")
        claim_death()
        kill_process_tree(include_parent=False)  # launch_server's finally: kill_process_tree(include_parent=False)
        sys.exit(1)
    start_helper_thread(srv.serve_forever)
    emit(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    # warm-up request (http_server._wait_and_warmup)
    clock.sleep_sim(0.5)
    emit(f'INFO:     127.0.0.1:{40000 + os.getpid() % 20000} - "GET /model_info HTTP/1.1" 200 OK')
    warmup = [("/model_info", "GET")]
    if not args.skip_server_warmup:
        line(clock, tp0.log_prefix, prefill_message(1, 7, 0.0, 0, 0, 0.0))
        clock.sleep_sim(T_WARMUP)
        emit(f'INFO:     127.0.0.1:{40001 + os.getpid() % 20000} - "POST /generate HTTP/1.1" 200 OK')
        warmup.append(("/generate", "POST"))
    if state.metrics is not None:  # the warm-up's requests went through the metrics middleware too
        for endpoint, method in warmup:
            state.metrics.http_begin(endpoint, method)
            state.metrics.http_end(endpoint, method, 200)
        state.metrics.warmed_up(args.skip_server_warmup)
    state.ready = True
    state.ready_since = time.monotonic()
    line(clock, "", "The server is fired up and ready to roll!")
    wait_to_be_killed()
