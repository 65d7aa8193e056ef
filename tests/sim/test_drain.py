"""SIGTERM drains the simulated server as SGLang's graceful exit does: /health turns 503 and new requests
are refused at once, requests in flight finish, then it exits; SGL_FORCE_SHUTDOWN=1 skips the wait."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request

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
