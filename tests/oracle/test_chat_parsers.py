"""The simulator's chat answers are SGLang's, release by release: the simulated Kimi K2.6 writes its raw tokens
(sim/sglang/sglang/_sim/chat.py, raw), the simulator's server turns them into a message as serving_chat does
(chat.message, as the release it is), and each supported release's own ``_build_chat_response`` (its KimiK2Detector,
kimi_k2 ReasoningParser and tool-call processing; driver.py's chat op) turns the same raw text into the same message.
Fails if the simulator's parsed output differs from that release's in any field. The correctness gate
(plugins/module_utils/answer_check.py) is then judged on each release's parsing of the model's answers, and where
0.5.23 parses Kimi K2's output differently from 0.5.10 the difference is pinned (test_what_each_release_makes_of_*)."""

from __future__ import annotations

import sys

import env
import oracle
import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import answer_check

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
RELEASES = env.supported()
PARSERS = {"both kimi_k2": ("kimi_k2", "kimi_k2"), "none": (None, None), "tools only": (None, "kimi_k2"),
           "reasoning only": ("kimi_k2", None)}


def _simulated(body: dict, reasoning_parser, tool_call_parser, release: str, garbage=False, model=chat.KIMI):
    prompt = "\n".join(_content_text(m.get("content")) for m in body["messages"])
    thought = chat.thought_tokens(body, prompt) if chat.thinks(body, model) and not garbage else 0  # as http.py
    words, finish = completion_words(prompt, body.get("max_tokens"), thought=thought)
    text, finish = chat.raw(body, words, finish, _content_text, garbage=garbage, model=model, thought=thought)
    message, finish_reason = chat.message(text, body, finish, reasoning_parser, tool_call_parser, release=release)
    return text, finish, message, finish_reason


def _chat_request(body: dict, text: str, finish: str, reasoning_parser, tool_call_parser) -> dict:
    return {"op": "chat", "request": body, "text": text, "reasoning_parser": reasoning_parser,
            "tool_call_parser": tool_call_parser,
            "finish_reason": {"type": finish, "matched": 163586 if finish == "stop" else None}}


def _without_random_ids(message: dict) -> dict:
    """serving_chat gives non-Kimi tool calls a random id (call_ and 24 hex): compared by its form."""
    calls = [{**c, "id": "call_" if str(c["id"]).startswith("call_") and len(c["id"]) == 29 else c["id"]}
             for c in message.get("tool_calls") or []] or message.get("tool_calls")
    return {**message, "tool_calls": calls}


def _same_as_sglang(cases: list[tuple[str, dict, str | None, str | None]], release: str,
                    model: str = chat.KIMI) -> dict:
    """Each (what, request, reasoning parser, tool-call parser) answered by the simulator as ``release`` and, from
    the simulator's raw text, by that release's own serving_chat (the oracle): asserts the messages and finish
    reasons are the same (a random tool-call id compared by its form); returns the simulator's (message, finish
    reason) by ``what``."""
    runs, requests = [], []
    for what, body, reasoning_parser, tool_call_parser in cases:
        text, finish, message, finish_reason = _simulated(body, reasoning_parser, tool_call_parser, release,
                                                          model=model)
        runs.append((what, text, message, finish_reason))
        requests.append(_chat_request(body, text, finish, reasoning_parser, tool_call_parser))
    problems = []
    for (what, text, message, finish_reason), real in zip(runs, oracle.ask(requests, release), strict=True):
        seen = _without_random_ids({k: message[k] for k in ("content", "reasoning_content", "tool_calls")})
        if seen != _without_random_ids(real["message"]) or finish_reason != real["finish_reason"]:
            problems.append(f"{what}: raw {text!r}\n  simulator {seen} {finish_reason}\n  SGLang {release} "
                            f"{real['message']} {real['finish_reason']}")
    assert not problems, "\n".join(problems)
    return {what: (message, finish_reason) for what, _, message, finish_reason in runs}


@pytest.mark.parametrize("release", RELEASES)
def test_the_simulators_parsed_answers_are_sglangs(release):
    parsed = _same_as_sglang([(f"{case} / parsers {setting}", {"model": "kimi-k2.6", **request}, *parsers)
                              for case, request in CASES.items() for setting, parsers in PARSERS.items()], release)
    messages = {what: message for what, (message, _) in parsed.items()}
    # the cases reach what a gate looks at: a parsed call with a hyphenated name and valid JSON, reasoning kept apart
    call = messages["tool call, hyphenated name / parsers both kimi_k2"]["tool_calls"][0]
    assert call["function"]["name"] == "get-weather" and call["id"] == "functions.get-weather:0"
    assert messages["thinking / parsers both kimi_k2"]["reasoning_content"] and \
        messages["thinking / parsers both kimi_k2"]["content"]
    assert "<think>" in messages["thinking / parsers none"]["content"]


def test_what_each_release_makes_of_a_call_after_earlier_ones():
    """The model numbers its call by the conversation's calls (here 1: one earlier call). 0.5.10 adds the earlier
    calls to that number again (id functions.get-weather:2, index 1); 0.5.23 numbers the call by its place in the
    answer (id functions.get-weather:1, index 0). The simulator follows each (the test above); the gate asks
    single-turn questions and reads neither."""
    body = {"model": "kimi-k2.6", **CASES["tool call after an earlier one"]}
    expected = {"0.5.10": ("functions.get-weather:2", 1), "0.5.23": ("functions.get-weather:1", 0)}
    for release in RELEASES:
        assert release in expected, f"SGLang {release}: say how it numbers a later call (expected, in this test)"
        text, finish, _, _ = _simulated(body, "kimi_k2", "kimi_k2", release)
        (real,) = oracle.ask([_chat_request(body, text, finish, "kimi_k2", "kimi_k2")], release)
        (call,) = real["message"]["tool_calls"]
        assert (call["id"], call["index"]) == expected[release], release


# Raw Kimi K2 outputs the simulated model does not write, on which the releases' parsers differ: (raw text, the
# request's tools), and per release what serving_chat answers (content, reasoning_content, the calls' (name, id),
# finish reason) and whether the gate's check passes on it.
TOOL_BODY = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
             "tools": [answer_check.TOOL], "chat_template_kwargs": {"thinking": False}}
BARE = ("<|tool_calls_section_begin|><|tool_call_begin|>0<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
        "<|tool_call_end|><|tool_calls_section_end|>")
UNREADABLE = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get-weather:0<|tool_calls_section_end|>"
THINKING_BODY = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "Why is the sky blue?"}]}
DIFFERENCES = {
    # a call that names no function, only the conversation's call counter: 0.5.23 takes the only tool offered,
    # 0.5.10 reads no call and leaves the raw tokens in content
    "bare counter": ("tool_call", TOOL_BODY, BARE, {
        "0.5.10": ((BARE, None, [], "tool_calls"), False),
        "0.5.23": (("", None, [("get-weather", "functions.get-weather:0")], "tool_calls"), True)}),
    # a section the detector cannot read: 0.5.10 answers the raw tokens with finish_reason tool_calls and no call,
    # 0.5.23 the text before the section with stop
    "unreadable section": ("tool_call", TOOL_BODY, UNREADABLE, {
        "0.5.10": ((UNREADABLE, None, [], "tool_calls"), False),
        "0.5.23": (("", None, None, "stop"), False)}),
    # whitespace around the thought and the answer: 0.5.10 strips it, 0.5.23 keeps it
    "spaced thought": ("thinking", THINKING_BODY, "<think> Rayleigh scattering. </think> Scattering. ", {
        "0.5.10": (("Scattering.", "Rayleigh scattering. ", None, "stop"), True),
        "0.5.23": ((" Scattering. ", " Rayleigh scattering. ", None, "stop"), True)}),
    # a second <think> inside the thought: 0.5.10 drops every one, 0.5.23 only the leading ones, so the gate's
    # thinking check finds a think tag in reasoning_content on 0.5.23
    "think tag inside the thought": ("thinking", THINKING_BODY, "<think>Light<think> scatters.</think>Blue.", {
        "0.5.10": (("Blue.", "Light scatters.", None, "stop"), True),
        "0.5.23": (("Blue.", "Light<think> scatters.", None, "stop"), False)}),
}


@pytest.mark.parametrize("release", RELEASES)
def test_what_each_release_makes_of_kimi_k2_output_the_simulator_does_not_write(release):
    asks = [_chat_request(body, text, "stop", "kimi_k2", "kimi_k2") for _, body, text, _ in DIFFERENCES.values()]
    problems = []
    for (case, (check, _, text, expected)), real in zip(DIFFERENCES.items(), oracle.ask(asks, release), strict=True):
        assert release in expected, f"SGLang {release}: say what it answers to {case!r} (DIFFERENCES, this file)"
        message = real["message"]
        calls = None if message["tool_calls"] is None else [(c["function"]["name"], c["id"])
                                                            for c in message["tool_calls"]]
        seen = (message["content"], message["reasoning_content"], calls, real["finish_reason"])
        passes = answer_check.judge(check, {"choices": [{"message": message,
                                                         "finish_reason": real["finish_reason"]}]}) is None
        if (seen, passes) != expected[release]:
            problems.append(f"{case}: {text!r}\n  SGLang {release}: {seen}, gate passes: {passes}\n"
                            f"  expected: {expected[release]}")
        # the simulator's server parses such text as the release does (its model writes no bare counter, and its
        # parser reads none)
        if not (case == "bare counter" and release != "0.5.10"):
            body = DIFFERENCES[case][1]
            mine, finish = chat.message(text, body, "stop", "kimi_k2", "kimi_k2", release=release)
            if ({k: mine[k] for k in message}, finish) != (message, real["finish_reason"]):
                problems.append(f"{case}: the simulator as {release} answers {mine} {finish}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("release", RELEASES)
def test_the_gates_checks_judge_each_releases_parsing(release):
    """The correctness gate's own requests, answered by the simulated model's raw text through the release's parsers:
    every check passes with both parsers; without them (the parser_missing fault) the thinking and tool_call checks
    fail, and the garbage fault fails every check."""
    def verdicts(reasoning_parser, tool_call_parser, garbage=False):
        bodies = answer_check.requests("kimi-k2.6", True, True)
        asks = []
        for _, body in bodies:
            text, finish, _, _ = _simulated(body, reasoning_parser, tool_call_parser, release, garbage=garbage)
            asks.append(_chat_request(body, text, finish, reasoning_parser, tool_call_parser))
        return {check: answer_check.judge(check, {"choices": [{"message": real["message"],
                                                                "finish_reason": real["finish_reason"]}]})
                for (check, _), real in zip(bodies, oracle.ask(asks, release), strict=True)}

    assert verdicts("kimi_k2", "kimi_k2") == dict.fromkeys(answer_check.CHECKS)
    missing = verdicts(None, None)
    assert missing["thinking"] and missing["tool_call"] and not missing["known_answer"], missing
    assert all(verdicts("kimi_k2", "kimi_k2", garbage=True).values())


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("parsers", [("kimi_k2", "kimi_k2"), (None, None)])
def test_garbage_stays_garbage_through_sglangs_parsers(parsers, release):
    body = {"model": "kimi-k2.6", **CASES["tool call, hyphenated name"]}
    text, finish, message, finish_reason = _simulated(body, *parsers, release, garbage=True)
    (real,) = oracle.ask([_chat_request(body, text, finish, *parsers)], release)
    assert {k: message[k] for k in real["message"]} == real["message"] and set(text) == {"!"}
    assert not real["message"]["tool_calls"]


@pytest.mark.parametrize("release", RELEASES)
def test_a_deepseek_v3_style_model_answers_as_sglangs_deepseekv3_parser_says(release):
    """The second model family (a DeepSeek-V3 architecture, docs/models.md): no thinking, DeepSeek-V3's tool-call
    tokens, --tool-call-parser deepseekv3 (with and without the parser)."""
    cases = ("instant", "known answer", "tool call, hyphenated name", "tool call after an earlier one",
             "tools offered, choice none", "cut by max_tokens")
    parsed = _same_as_sglang([(f"{case} / tool parser {parser}", {"model": "deepseek-v3", **CASES[case]}, None, parser)
                              for case in cases for parser in ("deepseekv3", None)], release, model=chat.DEEPSEEK)
    messages = {what: message for what, (message, _) in parsed.items()}
    assert messages["tool call, hyphenated name / tool parser deepseekv3"]["tool_calls"][0]["function"]["name"] == \
        "get-weather"
    assert "<｜tool▁calls▁begin｜>" in messages["tool call, hyphenated name / tool parser None"]["content"]
