"""The simulator's chat endpoint answers as SGLang serving Kimi K2.6 does (sim/sglang/sglang/_sim/chat.py; the oracle
test compares its parsing with SGLang's own), and the correctness gate's checks (plugins/module_utils/answer_check.py)
judge its answers: all pass with the parsers, and each failure a broken server shows is named with its evidence."""

from __future__ import annotations

import json

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import answer_check

PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
TP8 = ("--tp-size", "8", "--mem-fraction-static", "0.8")


def gate(srv, reasoning=True, tool_calls=True) -> list[tuple[str, str | None, dict]]:
    out = []
    for check, body in answer_check.requests("kimi-k2.6", reasoning, tool_calls):
        status, answer, why = answer_check.ask(srv.url(""), body, None, 30)
        assert status == 200, why
        out.append((check, answer_check.judge(check, answer), answer))
    return out


def test_with_its_parsers_every_check_passes_and_the_answers_are_parsed(lab):
    srv = lab.start(*TP8, *PARSERS)
    srv.wait_ready()
    results = gate(srv)
    assert [(c, p) for c, p, _ in results] == [(c, None) for c in answer_check.CHECKS]
    answers = {c: a["choices"][0] for c, _, a in results}
    assert answers["thinking"]["message"]["reasoning_content"] and answers["thinking"]["message"]["content"]
    assert answers["instant"]["message"]["reasoning_content"] is None
    call = answers["tool_call"]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get-weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert answers["tool_call"]["finish_reason"] == "tool_calls" and call["id"] == "functions.get-weather:0"
    assert answers["known_answer"]["message"]["content"] == "42"


def test_without_parsers_the_raw_tokens_reach_the_client_and_the_gate_says_so(lab):
    srv = lab.start(*TP8)
    srv.wait_ready()
    check, problem, answer = gate(srv)[0]
    assert check == "thinking" and "content holds the model's raw tokens (<think>)" in problem, problem
    assert "</think>" in answer["choices"][0]["message"]["content"]
    # the tool call too: the section stays text
    _, problem, answer = next(r for r in gate(srv) if r[0] == "tool_call")
    assert "<|tool_calls_section_begin|>" in answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["message"]["tool_calls"] is None


@pytest.mark.parametrize(("fault", "sentence"), [
    ("garbage", "is garbage, a run of '!' (what NaN logits decode to): '!!!!!!!!"),
    ("parser_missing", "content holds the model's raw tokens (<think>), so the server's parser did not apply"),
])
def test_a_server_that_starts_and_answers_wrongly_is_caught_by_the_first_check(lab, fault, sentence):
    srv = lab.start(*TP8, *PARSERS, faults=[{"fault": fault}])
    srv.wait_ready()  # it starts, passes /health and reports its parsers: only its answers are wrong
    status, info = srv.get("/server_info")
    assert json.loads(info)["reasoning_parser"] == "kimi_k2"
    check, problem, _ = gate(srv)[0]
    assert check == "thinking" and sentence in problem, problem


def test_as_0_5_23_every_check_passes_and_the_answers_are_that_releases(lab):
    """0.5.23's serving_chat (tests/oracle/test_chat_parsers.py holds it against that wheel): a tool call's content
    is "" rather than null, and a call after earlier ones is numbered by its place in the answer."""
    srv = lab.start(*TP8, *PARSERS, release="0.5.23")
    srv.wait_ready()
    results = gate(srv)
    assert [(c, p) for c, p, _ in results] == [(c, None) for c in answer_check.CHECKS]
    tool_call = next(a for c, _, a in results if c == "tool_call")["choices"][0]
    assert tool_call["message"]["content"] == "" and tool_call["finish_reason"] == "tool_calls"
    assert tool_call["message"]["tool_calls"][0]["id"] == "functions.get-weather:0"
    body = {"model": "kimi-k2.6", "max_tokens": 1024, "tools": [answer_check.TOOL],
            "chat_template_kwargs": {"thinking": False}, "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "functions.get-weather:0", "type": "function",
                                                                "function": {"name": "get-weather",
                                                                             "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.get-weather:0", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"}]}
    status, answer, _ = answer_check.ask(srv.url(""), body, None, 30)
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert status == 200 and (call["id"], call["index"]) == ("functions.get-weather:1", 0)  # 0.5.10: :2, index 1
