"""SIGTERM drains the simulated server as SGLang 0.5.10's graceful exit does (tokenizer_manager.py): /health turns
503 at once while requests, new ones too, are still taken; a watchdog looking every 5 s lets it go once none is
left, and it ends by SIGKILLing its ranks and itself; SGL_FORCE_SHUTDOWN=1 skips the wait. Before it serves
there is no handler: SIGTERM ends it by the signal."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

TP8 = ("--tp-size", "8", "--mem-fraction-static", "0.8")
# Requests decode on a slow clock of their own, so one streamed answer lasts about two seconds.
SLOW = {"SGLANG_SIM_SERVE_TIME_SCALE": "10"}


def stream(port: int, out: dict, max_tokens: int = 300) -> None:
    body = json.dumps({"model": "kimi-k2.6", "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            lines = [line for line in resp if line.startswith(b"data:")]
        out["done"] = lines[-1].startswith(b"data: [DONE]")
        out["chunks"] = len(lines)
    except (OSError, ValueError) as exc:
        out["error"] = repr(exc)


def post_status(port: int) -> int:
    body = json.dumps({"messages": [{"role": "user", "content": "late"}], "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_sigterm_finishes_the_requests_in_flight_still_takes_new_ones_and_ends_by_sigkill(lab):
    srv = lab.start(*TP8, env=SLOW)
    srv.wait_ready()
    out: dict = {}
    t = threading.Thread(target=stream, args=(srv.port, out))
    t.start()
    time.sleep(0.5)  # the request runs
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert srv.get("/health")[0] == 503
    assert post_status(srv.port) == 200, "SGLang 0.5.10 refuses no request while it drains"
    assert srv.proc.poll() is None, "it waits for the request in flight"
    t.join(30)
    assert out.get("done") and out["chunks"] > 100, out
    # kill_process_tree(os.getpid(), include_parent=True): systemd sees the main process killed by SIGKILL
    assert srv.wait_exit(15) == -signal.SIGKILL
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in srv.log
    assert "Health check request received during shutdown. Returning 503." in srv.log
    assert "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in srv.log


def test_sigterm_with_nothing_running_exits_at_the_watchdogs_next_look(lab):
    srv = lab.start(*TP8)
    srv.wait_ready()
    started = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.wait_exit(10) == -signal.SIGKILL
    assert time.monotonic() - started < 5.5  # the watchdog looks every 5 s


def test_sigterm_before_it_serves_ends_it_by_the_signal(lab):
    # no SIGTERM handler until the first request: Python's default, no drain and no SIGKILL
    srv = lab.start(*TP8, env={"SGLANG_SIM_TIME_SCALE": "1"})
    time.sleep(1.0)
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.wait_exit(10) == -signal.SIGTERM
    assert "Draining requests" not in srv.log


def test_force_shutdown_skips_the_wait(lab):
    srv = lab.start(*TP8, env={**SLOW, "SGL_FORCE_SHUTDOWN": "1"})
    srv.wait_ready()
    out: dict = {}
    t = threading.Thread(target=stream, args=(srv.port, out, 5000))
    t.start()
    time.sleep(0.5)
    started = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.wait_exit(10) == -signal.SIGKILL
    assert time.monotonic() - started < 5.5  # the watchdog's first look, not the request's end
    assert "Signal SIGTERM received while force shutdown flag set. Force exiting." in srv.log
    t.join(30)
    assert not out.get("done"), "the request in flight was cut off"


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
        return [int(p) for p in fh.read().split()]


def _stop_as_systemd(srv, kill_mode: str, timeout: float = 15.0) -> float:
    """systemctl stop of a unit running the server, as systemd sends its signals for this KillMode:
    control-group: SIGTERM to every process of the group at once; mixed: SIGTERM to the main process alone,
    SIGKILL to whatever is left once it is gone. Returns the seconds the stop took."""
    ranks = _children(srv.proc.pid)
    assert ranks, "the server runs its scheduler processes"
    started = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    if kill_mode == "control-group":
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    srv.wait_exit(timeout)
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return time.monotonic() - started


@pytest.mark.parametrize("kill_mode", ["mixed", "control-group"])
def test_a_stop_finishes_the_requests_in_flight_only_under_kill_mode_mixed(lab, kill_mode):
    """sglang.service's KillMode=mixed: the main process drains while its schedulers keep decoding. Under
    control-group the schedulers get SIGTERM too, die at once, and every request in flight is cut."""
    srv = lab.start(*TP8, env=SLOW)
    srv.wait_ready()
    outs: list[dict] = [{} for _ in range(3)]
    threads = [threading.Thread(target=stream, args=(srv.port, out)) for out in outs]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the requests run
    took = _stop_as_systemd(srv, kill_mode)
    for t in threads:
        t.join(30)
    finished = sum(bool(out.get("done")) for out in outs)
    if kill_mode == "mixed":
        assert finished == 3, outs
        assert took > 0.5, "the stop waited for the requests"
        assert "Gracefully exiting... Remaining number of requests 0." in srv.log
    else:
        assert finished == 0, outs
