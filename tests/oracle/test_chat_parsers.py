"""The simulator's chat answers are SGLang's: the simulated Kimi K2.6 writes its raw tokens (sim/sglang/sglang/_sim/
chat.py, raw), the simulator's server turns them into a message as serving_chat does (chat.message), and real SGLang
0.5.10's parsers (KimiK2Detector, the kimi_k2 ReasoningParser, serving_chat's tool-call processing) turn the same raw
text into the same message. Fails if the simulator's parsed output differs from SGLang's own in any field."""

from __future__ import annotations

import sys

import oracle
import pytest

sys.path.insert(0, str(oracle.SIM_SGLANG))
from sglang._sim import chat  # noqa: E402  (the simulator's package, not SGLang's)
from sglang._sim.http import _content_text, completion_words  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get-weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer"}},
                                                "required": ["city", "days"]}}}
SEARCH = {"type": "function", "function": {"name": "web.search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
EARLIER_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "functions.web.search:0", "type": "function", "function": {"name": "web.search", "arguments": "{}"}}]}
TOOL_ANSWER = {"role": "tool", "tool_call_id": "functions.web.search:0", "content": "nothing found"}

CASES = {
    "thinking": {"messages": [{"role": "user", "content": "Why is the sky blue?"}]},
    "instant": {"messages": [{"role": "user", "content": "Why is the sky blue?"}],
                "chat_template_kwargs": {"thinking": False}},
    "thinking, asked true": {"messages": [{"role": "user", "content": "hello"}],
                             "chat_template_kwargs": {"thinking": True}},
    "another family's key": {"messages": [{"role": "user", "content": "hello"}],
                             "chat_template_kwargs": {"enable_thinking": False}},
    "known answer": {"messages": [{"role": "user", "content": "What is 17 + 25? Answer with the number only."}],
                     "chat_template_kwargs": {"thinking": False}},
    "tool call, hyphenated name": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    "tool call, instant": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
                           "chat_template_kwargs": {"thinking": False}},
    "tool call after an earlier one": {"messages": [{"role": "user", "content": "Find it"}, EARLIER_CALL, TOOL_ANSWER,
                                                    {"role": "user", "content": "And the weather?"}],
                                       "tools": [WEATHER, SEARCH]},
    "tools offered, choice none": {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER],
                                   "tool_choice": "none"},
    "cut by max_tokens": {"messages": [{"role": "user", "content": "Tell me a long story"}], "max_tokens": 6},
    "cut by max_tokens, instant": {"messages": [{"role": "user", "content": "Tell me a long story"}], "max_tokens": 6,
                                   "chat_template_kwargs": {"thinking": False}},
}
PARSERS = {"both kimi_k2": ("kimi_k2", "kimi_k2"), "none": (None, None), "tools only": (None, "kimi_k2"),
           "reasoning only": ("kimi_k2", None)}


def _simulated(body: dict, reasoning_parser, tool_call_parser, garbage=False, model=chat.KIMI):
    prompt = "\n".join(_content_text(m.get("content")) for m in body["messages"])
    thought = chat.thought_tokens(body, prompt) if chat.thinks(body, model) and not garbage else 0  # as http.py
    words, finish = completion_words(prompt, body.get("max_tokens"), thought=thought)
    text, finish = chat.raw(body, words, finish, _content_text, garbage=garbage, model=model, thought=thought)
    message, finish_reason = chat.message(text, body, finish, reasoning_parser, tool_call_parser)
    return text, finish, message, finish_reason


def _without_random_ids(message: dict) -> dict:
    """serving_chat gives non-Kimi tool calls a random id (call_ and 24 hex): compared by its form."""
    calls = [{**c, "id": "call_" if str(c["id"]).startswith("call_") and len(c["id"]) == 29 else c["id"]}
             for c in message.get("tool_calls") or []] or None
    return {**message, "tool_calls": calls}


def _same_as_sglang(cases: list[tuple[str, dict, str | None, str | None]], model: str = chat.KIMI) -> dict:
    """Each (what, request, reasoning parser, tool-call parser) answered by the simulator and, from the simulator's
    raw text, by SGLang's own parsers (the oracle): asserts the messages and finish reasons are the same (a random
    tool-call id compared by its form); returns the simulator's messages by ``what``."""
    runs, requests = [], []
    for what, body, reasoning_parser, tool_call_parser in cases:
        text, finish, message, finish_reason = _simulated(body, reasoning_parser, tool_call_parser, model=model)
        runs.append((what, text, message, finish_reason))
        requests.append({"op": "chat", "request": body, "text": text, "reasoning_parser": reasoning_parser,
                         "tool_call_parser": tool_call_parser,
                         "finish_reason": {"type": finish, "matched": 163586 if finish == "stop" else None}})
    problems = []
    for (what, text, message, finish_reason), real in zip(runs, oracle.ask(requests), strict=True):
        seen = _without_random_ids({k: message[k] for k in ("content", "reasoning_content", "tool_calls")})
        if seen != _without_random_ids(real["message"]) or finish_reason != real["finish_reason"]:
            problems.append(f"{what}: raw {text!r}\n  simulator {seen} {finish_reason}\n  SGLang    {real['message']} "
                            f"{real['finish_reason']}")
    assert not problems, "\n".join(problems)
    return {what: message for what, _, message, _ in runs}


def test_the_simulators_parsed_answers_are_sglangs():
    parsed = _same_as_sglang([(f"{case} / parsers {setting}", {"model": "kimi-k2.6", **request}, *parsers)
                              for case, request in CASES.items() for setting, parsers in PARSERS.items()])
    # the cases reach what a gate looks at: a parsed call with a hyphenated name and valid JSON, reasoning kept apart
    call = parsed["tool call, hyphenated name / parsers both kimi_k2"]["tool_calls"][0]
    assert call["function"]["name"] == "get-weather" and call["id"] == "functions.get-weather:0"
    assert parsed["tool call after an earlier one / parsers both kimi_k2"]["tool_calls"][0]["id"] == \
        "functions.get-weather:2"  # SGLang's double count, reproduced
    assert parsed["thinking / parsers both kimi_k2"]["reasoning_content"] and \
        parsed["thinking / parsers both kimi_k2"]["content"]
    assert "<think>" in parsed["thinking / parsers none"]["content"]


@pytest.mark.parametrize("parsers", [("kimi_k2", "kimi_k2"), (None, None)])
def test_garbage_stays_garbage_through_sglangs_parsers(parsers):
    body = {"model": "kimi-k2.6", **CASES["tool call, hyphenated name"]}
    text, finish, message, finish_reason = _simulated(body, *parsers, garbage=True)
    real = oracle.ask([{"op": "chat", "request": body, "text": text, "reasoning_parser": parsers[0],
                        "tool_call_parser": parsers[1], "finish_reason": {"type": finish, "matched": 163586}}])[0]
    assert {k: message[k] for k in real["message"]} == real["message"] and set(text) == {"!"}
    assert not real["message"]["tool_calls"]


def test_a_deepseek_v3_style_model_answers_as_sglangs_deepseekv3_parser_says():
    """The second model family (a DeepSeek-V3 architecture, docs/models.md): no thinking, DeepSeek-V3's tool-call
    tokens, --tool-call-parser deepseekv3 (with and without the parser)."""
    cases = ("instant", "known answer", "tool call, hyphenated name", "tool call after an earlier one",
             "tools offered, choice none", "cut by max_tokens")
    parsed = _same_as_sglang([(f"{case} / tool parser {parser}", {"model": "deepseek-v3", **CASES[case]}, None, parser)
                              for case in cases for parser in ("deepseekv3", None)], model=chat.DEEPSEEK)
    assert parsed["tool call, hyphenated name / tool parser deepseekv3"]["tool_calls"][0]["function"]["name"] == \
        "get-weather"
    assert "<｜tool▁calls▁begin｜>" in parsed["tool call, hyphenated name / tool parser None"]["content"]

