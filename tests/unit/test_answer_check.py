"""The correctness gate's judgement (plugins/module_utils/answer_check.py): each kind of wrong answer a broken server
gives fails the check it reaches, with a sentence that quotes it; right answers pass."""

from __future__ import annotations

import json

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import answer_check as A


def answer(content=None, reasoning=None, calls=None, finish="stop"):
    return {"choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content, "reasoning_content": reasoning,
                                     "tool_calls": calls}}]}


def call(name="get-weather", arguments='{"city": "Paris"}'):
    return [{"id": f"functions.{name}:0", "index": 0, "type": "function",
             "function": {"name": name, "arguments": arguments}}]


def test_the_requests_follow_the_models_parsers():
    both = A.requests("kimi-k2.6", reasoning=True, tool_calls=True)
    assert [c for c, _ in both] == list(A.CHECKS)
    bodies = dict(both)
    assert "chat_template_kwargs" not in bodies["thinking"]
    off = ("instant", "tool_call", "known_answer")
    assert all(bodies[c]["chat_template_kwargs"] == {"thinking": False} for c in off)
    assert bodies["tool_call"]["tools"][0]["function"]["name"] == "get-weather"
    assert all(b["model"] == "kimi-k2.6" and b["stream"] is False for b in bodies.values())
    plain = dict(A.requests("deepseek-v3", reasoning=False, tool_calls=False))
    assert list(plain) == ["instant", "known_answer"] and "chat_template_kwargs" not in plain["instant"]


@pytest.mark.parametrize(("check", "given"), [
    ("thinking", answer("Rayleigh scattering.", "Short wavelengths scatter more.")),
    ("instant", answer("Rayleigh scattering.")),
    ("tool_call", answer(None, None, call(), "tool_calls")),
    ("known_answer", answer("42")),
    ("known_answer", answer("The answer is 42.")),
])
def test_right_answers_pass(check, given):
    assert A.judge(check, given) is None


@pytest.mark.parametrize(("check", "given", "sentence"), [
    ("thinking", answer("!!!!!!!!!!!!!!!!"), "content is garbage, a run of '!' (what NaN logits decode to): '!!!!!!"),
    ("instant", answer("the sky \ufffd\ufffd blue"), "U+FFFD replacement characters"),
    ("instant", answer(" ".join(["blue"] * 12)), "the word 'blue' 12 times in a row"),
    ("thinking", answer("<think>hmm</think>The sky."), "content holds the model's raw tokens (<think>)"),
    ("tool_call", answer("<|tool_calls_section_begin|><|tool_call_begin|>functions.get-weather:0"),
     "content holds the model's raw tokens (<|tool_calls_section_begin|>)"),
    ("thinking", answer("The sky is blue."), "a thinking-mode answer without reasoning_content"),
    ("thinking", answer(None, "I think the sky"), "reasoning only, no content; reasoning_content: 'I think the sky'"),
    ("instant", answer(None, "The sky is blue."), "reasoning_content with thinking off (the answer leaks into it)"),
    ("instant", answer(""), "an empty answer"),
    ("tool_call", answer("I would call get-weather."), "no parsed tool_calls for a request that offers one tool"),
    ("tool_call", answer(None, None, call("get_weather")), "the tool call names 'get_weather', not 'get-weather'"),
    ("tool_call", answer(None, None, call(arguments="{city: Paris")), "arguments are no JSON"),
    ("tool_call", answer(None, None, call(arguments="[1]")), "arguments are no JSON object"),
    ("known_answer", answer("41"), "asked 'What is 17 + 25? Answer with the number only.', answered '41'"),
    ("known_answer", {"error": "bad"}, "no chat message in the answer"),
])
def test_each_wrong_answer_fails_with_its_evidence(check, given, sentence):
    problem = A.judge(check, given)
    assert problem is not None and sentence in problem, problem


def test_evidence_is_cut_to_a_quote():
    problem = A.judge("instant", answer("!" * 5000))
    assert len(problem) < 300 and problem.endswith("…'")
    assert json.dumps(problem)  # it goes into facts and reports
