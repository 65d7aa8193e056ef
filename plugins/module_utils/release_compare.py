"""The short benchmark an upgrade runs on each host, and its judgement: is the new SGLang release slower than the one
it replaces, on the same host, at the host's profile?

Pure standard library; the HTTP client is Ansible's ``open_url`` (imported when a measurement runs), so the
judgement is importable anywhere. Used by ``plugins/modules/sglang_speed.py`` (the measurement, on the host) and
the role ``sglang_service`` (the judgement, through the ``release_compare`` filter).

The measurement: ``prompts`` streamed ``/generate`` requests of ``input_tokens`` prompt tokens (``input_ids``, the
same ids every run, so the cache and the tokenizer play no part) and ``output_tokens`` generated tokens each
(``ignore_eos``, greedy), ``concurrency`` at a time, for the output throughput (tokens generated over that part's
wall time); before them, the first ``TTFT_PROBES`` prompts alone, one after the other, for the time to first token
(the median; the first streamed chunk that carries a token). Alone, because with others in flight a request's
first token waits for their prefill chunks in the scheduler's queue: measured on the simulator, the same server's
median time to first token at 4 in flight moved by a third between two measurements, its throughput by 5 %.

Run-to-run noise is measured first: each side (the release serving before, the new one after) runs ``runs`` times
in a row. A side's figure is its best run (the highest throughput, the lowest time to first token): whatever else
runs on the host can only slow a run down, so the best run is the one least disturbed. Its noise is how far the
second best run is from the best. The new release is slower when a figure is worse by more than the tolerance plus
the larger noise of the two sides, so a noisy host needs a larger difference to be judged and a quiet one a smaller.
Each side's runs follow each other instead of alternating with the other side's: switching releases is a restart,
which on a real host is a model load of many minutes.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

# The token ids of the prompts: ordinary vocabulary (Kimi K2's tokenizer has 163,840 ids; these are words in any
# of SGLang's tokenizers' ranges), drawn with a fixed seed so that every run and every release gets the same prompts.
_ID_RANGE = (1000, 20000)
METRICS = (("output_tok_s", "output throughput", "tok/s", True), ("ttft_ms", "time to first token", "ms", False))
TTFT_PROBES = 4  # requests sent alone at the start of each run, for the time to first token


def prompt_ids(prompts: int, input_tokens: int, seed: int = 0) -> list[list[int]]:
    """The prompts' token ids: the same for a given seed."""
    draw = random.Random(seed)
    return [[draw.randint(*_ID_RANGE) for _ in range(input_tokens)] for _ in range(prompts)]


def _one(url: str, headers: dict, ids: list[int], output_tokens: int, timeout: float) -> dict:
    from ansible.module_utils.urls import open_url  # noqa: PLC0415  (Ansible's client: proxies, no urlopen)

    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": output_tokens, "ignore_eos": True, "temperature": 0}}
    began = time.monotonic()
    first = None
    tokens = 0
    try:
        with open_url(url.rstrip("/") + "/generate", data=json.dumps(body), headers=headers, method="POST",
                      timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                try:
                    meta = json.loads(line[5:]).get("meta_info") or {}
                except ValueError:
                    continue
                done = int(meta.get("completion_tokens") or 0)
                if done > 0 and first is None:
                    first = time.monotonic()
                tokens = max(tokens, done)
    except Exception as err:  # noqa: BLE001  (any failure of one request is that request's result)
        return {"ok": False, "error": str(getattr(err, "reason", err))[:200], "tokens": tokens}
    if first is None:
        return {"ok": False, "error": "no token streamed", "tokens": tokens}
    return {"ok": True, "ttft_ms": (first - began) * 1000.0, "tokens": tokens,
            "e2e_s": time.monotonic() - began}


def run_once(url: str, api_key: str | None, prompts: list[list[int]], output_tokens: int, concurrency: int,
             timeout: float) -> dict:
    """One run: every prompt, ``concurrency`` at a time. Its figures, or ``failed`` requests and the first error."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    queue = list(enumerate(prompts))
    results: list[dict | None] = [None] * len(prompts)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                index, ids = queue.pop(0)
            results[index] = _one(url, headers, ids, output_tokens, timeout)

    probes = [_one(url, headers, ids, min(output_tokens, 8), timeout) for ids in prompts[:TTFT_PROBES]]
    began = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(concurrency, len(prompts))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - began
    good = [r for r in results if r and r["ok"]]
    bad = [r for r in [*probes, *results] if not (r and r["ok"])]
    run: dict[str, Any] = {"requests": len(probes) + len(prompts), "failed": len(bad), "wall_s": round(wall, 3)}
    if bad:
        run["error"] = (bad[0] or {}).get("error", "no result")
    if good:
        run["output_tok_s"] = round(sum(r["tokens"] for r in good) / wall, 1) if wall > 0 else 0.0
    alone = [r["ttft_ms"] for r in probes if r["ok"]]
    if alone:
        run["ttft_ms"] = round(statistics.median(alone), 1)
    return run


def _ranked(runs: Sequence[Mapping[str, Any]], metric: str, higher_is_better: bool) -> list[float]:
    """A side's values of ``metric``, best first."""
    return sorted((float(r[metric]) for r in runs if r.get(metric) is not None), reverse=higher_is_better)


def _best(runs: Sequence[Mapping[str, Any]], metric: str, higher_is_better: bool) -> float | None:
    ranked = _ranked(runs, metric, higher_is_better)
    return ranked[0] if ranked else None


def _noise(runs: Sequence[Mapping[str, Any]], metric: str, higher_is_better: bool) -> float:
    """How far a side's second best run is from its best, relative to the best (0 with one run)."""
    ranked = _ranked(runs, metric, higher_is_better)
    return abs(ranked[0] - ranked[1]) / ranked[0] if len(ranked) > 1 and ranked[0] > 0 else 0.0


def compare(before: Mapping[str, Any], after: Mapping[str, Any], tolerance: float, host: str = "the host") -> dict:
    """``before``/``after``: a measurement each (``release``, ``runs``). The verdict: ``slower`` (with the reason),
    ``not_slower``, or ``unmeasured`` when a side has no complete run (a request failed: the new release is judged by
    the correctness gate and the readiness check, not here)."""
    old, new = str(before.get("release") or "the old release"), str(after.get("release") or "the new release")
    result: dict[str, Any] = {"before": dict(before), "after": dict(after), "tolerance": tolerance, "metrics": {}}
    sides = {"before": list(before.get("runs") or []), "after": list(after.get("runs") or [])}
    for side, runs in sides.items():
        if not runs or any(r.get("failed") for r in runs):
            broken = next((r for r in runs if r.get("failed")), None)
            why = f"{broken['failed']} of {broken['requests']} requests failed ({broken.get('error')})" if broken \
                else "nothing was measured"
            result.update(verdict="unmeasured", reason=f"The {side} side ({old if side == 'before' else new}) of the "
                                                       f"comparison on {host} is incomplete: {why}.")
            return result
    worse = []
    for metric, label, unit, higher_is_better in METRICS:
        was, now = _best(sides["before"], metric, higher_is_better), _best(sides["after"], metric, higher_is_better)
        noise = max(_noise(sides["before"], metric, higher_is_better), _noise(sides["after"], metric, higher_is_better))
        if not was or now is None:
            continue
        change = now / was - 1.0
        loss = -change if higher_is_better else change
        result["metrics"][metric] = {"before": round(was, 1), "after": round(now, 1), "change": round(change, 4),
                                     "noise": round(noise, 4), "threshold": round(tolerance + noise, 4)}
        if loss > tolerance + noise:
            worse.append(f"{label} {was:.1f} -> {now:.1f} {unit} ({change:+.0%})")
    noise_all = max((m["noise"] for m in result["metrics"].values()), default=0.0)
    if worse:
        result["verdict"] = "slower"
        result["reason"] = (f"SGLang {new} is slower than {old} on {host}: {', '.join(worse)}, beyond the "
                            f"{tolerance:.0%} tolerance plus the {noise_all:.0%} run-to-run noise measured on each; "
                            f"switching back to {old}.")
    else:
        shown = ", ".join(f"{label} {result['metrics'][m]['before']} -> {result['metrics'][m]['after']} {unit}"
                          for m, label, unit, _ in METRICS if m in result["metrics"])
        result["verdict"] = "not_slower"
        result["reason"] = f"SGLang {new} is not slower than {old} on {host}: {shown}."
    return result
