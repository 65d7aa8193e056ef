#!/usr/bin/env python3
"""A bounded load client: a fixed number of streamed chat completions at a fixed rate, then it stops.

    python tests/router_load.py URL... [--count N] [--rate R] [--max-tokens T] [--model M] [--api-key-file F]
                                [--json FILE]

Request i starts at i / R seconds (open loop: a slow answer does not delay the next request), each in its
own thread, each a POST URL/v1/chat/completions with "stream": true read to its "data: [DONE]". A request
fails when it gets no 200, the stream breaks, or [DONE] never comes. Prints (or writes to --json) the
counts, the p50/p99 end-to-end latency and each failure's reason. With a key, each request sends
`Authorization: Bearer KEY` (read from a file on the command line: never in the process list). Standard library only.
`under_load` runs a command (a rollout) with such loads one after another from its start to its end: the router lab
(tests/integration/test_router_lab.py) and the rollout part of the bench (tests/bench/run.py, part e) measure their
rollouts with it.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import IO


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def one_request(url: str, model: str, max_tokens: int, i: int, timeout: float,
                api_key: str = "", seen: dict | None = None) -> tuple[bool, float, str]:
    """One streamed request; `seen`, when given, gets the response's x-smg-routed-worker-id (the gateway's worker)."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                       "messages": [{"role": "user", "content": f"request {i}: say something"}]}).encode()
    headers = {"content-type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers=headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if seen is not None:
                seen["worker"] = resp.headers.get("x-smg-routed-worker-id")
            if resp.status != 200:
                return False, time.monotonic() - started, f"HTTP {resp.status}"
            for line in resp:
                if line.startswith(b"data: [DONE]"):
                    return True, time.monotonic() - started, ""
        return False, time.monotonic() - started, "stream ended without [DONE]"
    except urllib.error.HTTPError as exc:
        if seen is not None:
            seen["worker"] = exc.headers.get("x-smg-routed-worker-id")
        return False, time.monotonic() - started, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, reset, timed out, broken chunked encoding
        return False, time.monotonic() - started, f"{type(exc).__name__}: {exc}"


class Load:
    """Runs the load in a background thread; result() waits for every request and returns the summary."""

    def __init__(self, url: str | list[str], count: int, rate: float, max_tokens: int = 64,
                 model: str = "kimi-k2.6", timeout: float = 120.0, api_key: str = "") -> None:
        # Several URLs (servers without a router in front): request i goes to URL i mod len, round robin.
        self.urls = [u.rstrip("/") for u in ([url] if isinstance(url, str) else url)]
        self.count, self.rate = count, rate
        self.max_tokens, self.model, self.timeout, self.api_key = max_tokens, model, timeout, api_key
        self.results: list[tuple[bool, float, str]] = []
        # each request's start and end on time.monotonic()'s clock, outcome, and the worker the gateway routed it to
        # (x-smg-routed-worker-id; None without a gateway or without an answer): which ones a fault cut, and where
        self.timed: list[tuple[float, float, bool, str, str | None]] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._driver = threading.Thread(target=self._drive, daemon=True)
        self.started = self.ended = 0.0

    def start(self) -> Load:
        self.started = time.monotonic()
        self._driver.start()
        return self

    def _one(self, i: int) -> None:
        began, seen = time.monotonic(), {}
        outcome = one_request(self.urls[i % len(self.urls)], self.model, self.max_tokens, i, self.timeout,
                              self.api_key, seen)
        with self._lock:
            self.results.append(outcome)
            self.timed.append((began, time.monotonic(), outcome[0], outcome[2], seen.get("worker")))

    def _drive(self) -> None:
        for i in range(self.count):
            delay = self.started + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = threading.Thread(target=self._one, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)

    def result(self) -> dict:
        self._driver.join()
        for t in self._threads:
            t.join()
        self.ended = time.monotonic()
        ok = [lat for good, lat, _ in self.results if good]
        reasons: dict[str, int] = {}
        for good, _, why in self.results:
            if not good:
                reasons[why] = reasons.get(why, 0) + 1
        p50, p99 = percentile(ok, 50), percentile(ok, 99)
        return {"sent": len(self.results), "ok": len(ok), "failed": len(self.results) - len(ok),
                "p50_s": round(p50, 3) if p50 is not None else None,
                "p99_s": round(p99, 3) if p99 is not None else None,
                "wall_s": round(self.ended - self.started, 1), "failures": reasons}


def under_load(cmd: list[str], urls: str | list[str], *, chunk: int, rate: float, max_tokens: int, api_key: str = "",
               cwd: str | None = None, env: dict | None = None, output: IO | int = subprocess.DEVNULL,
               ready: Callable[[], bool] | None = None) -> tuple[int, dict]:
    """Runs CMD (a rollout) with bounded loads of CHUNK requests at RATE to URLS, one after another, from its start
    to its end, and at least one whole chunk (ready: from the moment ready() first holds instead, while CMD runs).
    CMD's output goes to ``output``: a file, not a pipe read at the end, which fills and stops the playbook.
    Returns CMD's exit code and the totals: sent, ok, failed, failures by reason, p99_s of the requests answered
    (None for none), rollout_s (CMD's wall time)."""
    totals: dict = {"sent": 0, "ok": 0, "failed": 0, "failures": {}}
    latencies: list[float] = []
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=output, stderr=subprocess.STDOUT)
    chunks = 0
    while proc.poll() is None or not chunks:
        if ready is not None and not chunks and proc.poll() is None and not ready():
            time.sleep(1)
            continue
        load = Load(urls, chunk, rate, max_tokens, api_key=api_key).start()
        summary = load.result()
        chunks += 1
        latencies += [lat for good, lat, _ in load.results if good]
        for key in ("sent", "ok", "failed"):
            totals[key] += summary[key]
        for why, n in summary["failures"].items():
            totals["failures"][why] = totals["failures"].get(why, 0) + n
    rc = proc.wait()
    totals["rollout_s"] = round(time.monotonic() - started, 1)
    totals["p99_s"] = percentile(latencies, 99)
    return rc, totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="+", help="base URL of the router (or of each worker, taken in turn)")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rate", type=float, default=5.0, help="requests started per second")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default="kimi-k2.6")
    parser.add_argument("--api-key-file", help="a file holding the API key the servers (or the router) require")
    parser.add_argument("--json", help="write the summary here as well")
    args = parser.parse_args()
    key = ""
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as fh:
            key = fh.read().strip()
    summary = Load(args.url, args.count, args.rate, args.max_tokens, args.model, api_key=key).start().result()
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
