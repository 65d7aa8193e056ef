"""The correctness gate's cost per start, measured on the simulator (docs/correctness-gate.md, "Cost per start"): the
gate's requests with Kimi K2.6's sampling from the role's model entry, each answer's completion tokens (the server's
own ``usage``), and the seconds they take at the simulator's single-stream decode speed of each layout
(sglang/_sim/throughput.py, calibrated to the field figures of docs/facts.md §1). No time is measured: tokens over
tok/s. ``pytest -s`` prints the table the doc quotes."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.moefleet.serving.plugins.module_utils import answer_check
from role_defaults import role_defaults
from sglang._sim import throughput

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = role_defaults("sglang_service")
SAMPLING = DEFAULTS["sglang_service_models"]["kimi-k2.6"]["sampling"]
PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
TP8EP4 = ("--tp-size", "8", "--ep-size", "4", "--mem-fraction-static", "0.8")


def test_the_gates_tokens_per_start_and_their_seconds_at_the_simulators_decode_speed(lab, monkeypatch):
    srv = lab.start(*TP8EP4, *PARSERS)
    srv.wait_ready()
    asked, ask = [], answer_check.ask

    def recording(url, body, api_key, timeout):
        status, answer, why = ask(url, body, api_key, timeout)
        asked.append((body, answer))
        return status, answer, why

    monkeypatch.setattr(answer_check, "ask", recording)
    tokens = {}
    for check, body in answer_check.requests("kimi-k2.6", True, True, SAMPLING):
        del asked[:]
        done = answer_check.ask_check(srv.url(""), check, body, None, 60, lambda: 0.0)
        assert done["state"] in (answer_check.PASSED, answer_check.INCONCLUSIVE), done
        assert all(b["temperature"] == SAMPLING[answer_check.MODE[check]]["temperature"] for b, _ in asked)
        tokens[check] = sum(a["usage"]["completion_tokens"] for _, a in asked)  # a retry's tokens count too
        assert all(0 < a["usage"]["completion_tokens"] <= b["max_tokens"] for b, a in asked), (check, asked)
    total = sum(tokens.values())
    print(f"\ngate tokens per check: {tokens}; in all {total}")
    for layout, (s1, _) in throughput.CALIBRATION.items():
        print(f"  {layout}: {s1:.0f} tok/s single stream -> {total / s1:.1f} s per start")
    assert set(tokens) == set(answer_check.CHECKS)
