"""SIGTERM drains the simulated server as SGLang's graceful exit does: /health turns 503 and new requests
are refused at once, requests in flight finish, then it exits; SGL_FORCE_SHUTDOWN=1 skips the wait."""

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


def test_sigterm_finishes_the_requests_in_flight_and_refuses_new_ones(lab):
    srv = lab.start(*TP8, env=SLOW)
    srv.wait_ready()
    out: dict = {}
    t = threading.Thread(target=stream, args=(srv.port, out))
    t.start()
    time.sleep(0.5)  # the request runs
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert srv.get("/health")[0] == 503
    assert post_status(srv.port) == 503
    assert srv.proc.poll() is None, "it waits for the request in flight"
    t.join(30)
    assert out.get("done") and out["chunks"] > 100, out
    assert srv.wait_exit(10) == -signal.SIGTERM
    assert "Gracefully exiting... Remaining number of requests 1." in srv.log
    assert "Gracefully exiting... Remaining number of requests 0." in srv.log


def test_sigterm_with_nothing_running_exits_at_once(lab):
    srv = lab.start(*TP8)
    srv.wait_ready()
    started = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.wait_exit(10) == -signal.SIGTERM
    assert time.monotonic() - started < 3


def test_force_shutdown_skips_the_wait(lab):
    srv = lab.start(*TP8, env={**SLOW, "SGL_FORCE_SHUTDOWN": "1"})
    srv.wait_ready()
    out: dict = {}
    t = threading.Thread(target=stream, args=(srv.port, out, 600))
    t.start()
    time.sleep(0.5)
    started = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.wait_exit(10) == -signal.SIGTERM
    assert time.monotonic() - started < 3
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
