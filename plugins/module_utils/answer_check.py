"""The correctness gate: what a client of the started server gets, judged before the start counts as good.

A server can start, pass /health and the flag check, and still answer garbage: NaN logits from a broken kernel on
sm_120 decode to runs of "!", a missing parser leaves the model's raw tokens in ``content``, a parser bug leaks the
answer into ``reasoning_content`` (docs/correctness-gate.md). Each check is one small chat request and a judgement of
its answer; ``CHECKS`` are run in order.

- ``thinking`` (a model with a reasoning parser): a thinking-mode chat answers with ``content`` and
  ``reasoning_content`` both non-empty, apart (no ``<think>`` tags left in either);
- ``instant``: the same with ``chat_template_kwargs: {"thinking": false}`` answers with content and no reasoning;
- ``tool_call`` (a model with a tool-call parser): a request that offers one tool with a hyphenated name
  (``get-weather``, as MCP names tools) comes back as a parsed ``tool_calls`` entry with that name and JSON-object
  arguments, no raw tool tokens in ``content``;
- ``known_answer``: "What is 17 + 25?" is answered with 42 (a token of its own anywhere in the answer);
- ``garbage``, on every answer: runs of "!" (NaN logits), U+FFFD replacement characters, one word repeated on and
  on, raw special tokens (``<|...|>``) in content.

Each request samples as the served model's clients are told to (``sampling``, from the model's entry of the role's
``sglang_service_models``: thinking and instant mode each); a model without one gets no sampling fields, so the
server's own defaults apply. An answer the token budget cut (``finish_reason: "length"``) before it said what a check
looks for is no evidence of a broken server: the check is asked once more with ``RETRY_FACTOR`` times the budget, and
cut again it is *inconclusive*, as is a check left unanswered within its wall-time cap. Only what the server's
structure gets wrong (garbage, tags or raw tokens, no reasoning parser, no parsed tool call, a wrong known answer)
is ``wrong_output``. A request the server never answers because it went away (refused, reset, closed) is
``server_gone``: the role then judges the server's death from its journal, as it judges any other.

Pure functions over request and answer dicts, and ``run``, the sglang_answers module's I/O
(plugins/modules/sglang_answers.py).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Mapping
from typing import Any

TOOL = {"type": "function", "function": {
    "name": "get-weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
QUESTION, ANSWER = "What is 17 + 25? Answer with the number only.", "42"
# 42 as a token of its own: not part of 142, 420 or 42.5, not -42.
_ANSWER = re.compile(r"(?<![\w.\-])42(?!\w|\.\d)")
# Tokens a chat answer may take. Thinking: the thought and the answer share max_tokens, and Moonshot asks at least
# 16k for K2.6's thinking mode (its thoughts run to hundreds or thousands of tokens). Thinking off: a sentence, a
# tool call, a number, with room to spare at any temperature.
MAX_TOKENS = {"thinking": 16384, "instant": 256, "tool_call": 1024, "known_answer": 64}
# A check whose answer the budget cut is asked once more with this many times its budget.
RETRY_FACTOR = 2
CHECKS = ("thinking", "instant", "tool_call", "known_answer")
# The sampling mode each check's request is sent in.
MODE = {"thinking": "thinking", "instant": "instant", "tool_call": "instant", "known_answer": "instant"}
# The request fields a model entry's sampling may set, per mode.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")
EVIDENCE_CHARS = 200

# A check's verdict.
PASSED, WRONG, CUT, INCONCLUSIVE = "passed", "wrong_output", "cut", "inconclusive"

_BANGS = re.compile(r"!{8,}")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>|</?think>")
REPEAT_RUN = 12  # the same word this many times in a row


class ServerGone(Exception):
    """The request got no HTTP answer because the server is not there (refused, reset, closed without a response)."""


class NoAnswerInTime(Exception):
    """The request got no answer within its timeout; the server may still be decoding it."""


def sampling_fields(sampling: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """``{mode: {field: value}}`` from a model entry's ``sampling`` (``{thinking: {temperature, top_p}, instant:
    {...}}``); raises ValueError, a sentence, for a mode or field the gate does not know or a value that is no
    number. None or empty: no fields (the server's defaults)."""
    if not sampling:
        return {}
    if not isinstance(sampling, Mapping):
        raise ValueError(f"sampling must map thinking and instant to their fields, got {sampling!r}.")
    out: dict[str, dict[str, float]] = {}
    for mode, fields in sampling.items():
        if mode not in ("thinking", "instant"):
            raise ValueError(f"sampling has a mode {mode!r}; the modes are thinking and instant.")
        if not isinstance(fields, Mapping):
            raise ValueError(f"sampling.{mode} must map fields to numbers, got {fields!r}.")
        out[mode] = {}
        for key, value in fields.items():
            if key not in SAMPLING_KEYS:
                raise ValueError(f"sampling.{mode} has a field {key!r}; the fields are {', '.join(SAMPLING_KEYS)}.")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"sampling.{mode}.{key} must be a number, got {value!r}.")
            out[mode][key] = int(value) if key == "top_k" else float(value)
    return out


def requests(model: str, reasoning: bool, tool_calls: bool,
             sampling: Mapping[str, Any] | None = None) -> list[tuple[str, dict]]:
    """(check, chat request body) for the checks that apply to the served model's parsers, each sampled as
    ``sampling`` (sampling_fields) says for its mode."""
    fields = sampling_fields(sampling)

    def body(text: str, check: str, **extra: Any) -> dict:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS[check],
                **fields.get(MODE[check], {}), "stream": False, **extra}

    off = {"chat_template_kwargs": {"thinking": False}} if reasoning else {}
    out = []
    if reasoning:
        out.append(("thinking", body("In one sentence: why is the sky blue?", "thinking")))
    out.append(("instant", body("In one sentence: why is the sky blue?", "instant", **off)))
    if tool_calls:
        out.append(("tool_call", body("What is the weather in Paris right now? Use the tool.", "tool_call",
                                      tools=[TOOL], tool_choice="auto", **off)))
    out.append(("known_answer", body(QUESTION, "known_answer", **off)))
    return out


def quote(text: Any) -> str:
    text = "" if text is None else str(text)
    return repr(text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + "…")


def garbage(text: str | None) -> str | None:
    """Why ``text`` looks like a broken model's output, or None."""
    if not text:
        return None
    if _BANGS.search(text):
        return "a run of '!' (what NaN logits decode to)"
    if "\ufffd" in text:
        return "U+FFFD replacement characters (bytes that are no text)"
    run, last = 0, None
    for word in text.split():
        run = run + 1 if word == last else 1
        last = word
        if run >= REPEAT_RUN:
            return f"the word {word!r} {REPEAT_RUN} times in a row"
    return None


def _problem(check: str, answer: dict) -> tuple[str | None, bool]:
    """(why the answer fails ``check`` or None, whether that is only something missing, which a cut answer lacks
    without being wrong)."""
    try:
        choice = answer["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return f"no chat message in the answer: {quote(json.dumps(answer)[:EVIDENCE_CHARS])}", False
    content, reasoning = message.get("content"), message.get("reasoning_content")
    for field, text in (("content", content), ("reasoning_content", reasoning)):
        why = garbage(text)
        if why:
            return f"{field} is garbage, {why}: {quote(text)}", False
    if content and _SPECIAL.search(content):
        return (f"content holds the model's raw tokens ({_SPECIAL.search(content).group(0)}), so the server's parser "
                f"did not apply: {quote(content)}"), False
    if check == "thinking":
        if not reasoning:
            return f"a thinking-mode answer without reasoning_content; content: {quote(content)}", False
        if _SPECIAL.search(reasoning):
            return f"reasoning_content holds think tags: {quote(reasoning)}", False
        if not content:
            return (f"a thinking-mode answer with reasoning only, no content; reasoning_content: {quote(reasoning)}",
                    True)
    elif check == "instant":
        if reasoning:
            return f"reasoning_content with thinking off (the answer leaks into it): {quote(reasoning)}", False
        if not content:
            return "an empty answer", True
    elif check == "tool_call":
        calls = message.get("tool_calls") or []
        if not calls:
            return f"no parsed tool_calls for a request that offers one tool; content: {quote(content)}", True
        function = calls[0].get("function") or {}
        if function.get("name") != TOOL["function"]["name"]:
            return f"the tool call names {function.get('name')!r}, not {TOOL['function']['name']!r}", False
        try:
            arguments = json.loads(function.get("arguments") or "")
        except ValueError:
            return f"the tool call's arguments are no JSON: {quote(function.get('arguments'))}", False
        if not isinstance(arguments, dict):
            return f"the tool call's arguments are no JSON object: {quote(function.get('arguments'))}", False
    elif check == "known_answer" and not _ANSWER.search(content or ""):
        return f"asked {QUESTION!r}, answered {quote(content)}", True
    return None, False


def judge(check: str, answer: dict) -> str | None:
    """Why the answer to ``check``'s request fails it, or None when it passes."""
    return _problem(check, answer)[0]


def finish_reason(answer: Any) -> str | None:
    try:
        return answer["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def assess(check: str, answer: dict) -> tuple[str, str | None]:
    """(PASSED, None), (WRONG, why), or (CUT, why): the budget cut the answer (``finish_reason: "length"``) before it
    held what the check looks for, and nothing in it is wrong."""
    problem, missing_only = _problem(check, answer)
    if problem is None:
        return PASSED, None
    if missing_only and finish_reason(answer) == "length":
        return CUT, problem
    return WRONG, problem


def _lost(err: BaseException) -> BaseException:
    """The error under urllib's URLError wrapping."""
    reason = getattr(err, "reason", None)
    return reason if isinstance(reason, BaseException) else err


def ask(url: str, body: dict, api_key: str | None, timeout: float) -> tuple[int, dict | None, str]:
    """POST one chat request: (HTTP status, the JSON answer or None, a short reason when there is none). Raises
    NoAnswerInTime when nothing came within ``timeout`` seconds, ServerGone when no HTTP answer came otherwise."""
    import http.client
    import urllib.error

    from ansible.module_utils.urls import ConnectionError as UrlConnectionError
    from ansible.module_utils.urls import open_url

    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        with open_url(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body), headers=headers,
                      method="POST", timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        try:
            detail = err.read()[:EVIDENCE_CHARS].decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            detail = ""
        return err.code, None, f"HTTP {err.code}" + (f": {quote(detail)}" if detail else "")
    except (urllib.error.URLError, UrlConnectionError, OSError, http.client.HTTPException) as err:
        cause = _lost(err)
        if isinstance(cause, (TimeoutError, socket.timeout)):
            raise NoAnswerInTime(f"no answer within {round(timeout)} s") from err
        raise ServerGone(str(cause) or type(cause).__name__) from err
    try:
        return status, json.loads(raw), ""
    except ValueError:
        return status, None, f"not JSON: {quote(raw[:EVIDENCE_CHARS].decode('utf-8', 'replace'))}"


def ask_check(url: str, check: str, body: dict, api_key: str | None, seconds: float, clock) -> dict:
    """Ask ``check`` within ``seconds`` of wall time, and once more with RETRY_FACTOR times the budget when the budget
    cut the answer: ``{"name", "state" (PASSED, WRONG or INCONCLUSIVE), "problem", "max_tokens" (the last budget
    asked), "tries"}``. Raises ServerGone. ``clock`` is time.monotonic (a parameter for the tests)."""
    deadline = clock() + seconds
    budget, cut, tries = body["max_tokens"], [], 0

    def verdict(state: str, problem: str | None) -> dict:
        return {"name": check, "state": state, "problem": problem, "max_tokens": budget, "tries": tries}

    while True:
        left = deadline - clock()
        if left <= 0:
            break
        tries += 1
        try:
            _, answer, why = ask(url, {**body, "max_tokens": budget}, api_key, left)
        except NoAnswerInTime as err:
            return verdict(INCONCLUSIVE, f"{err}, the wall-time cap of this check (a thought longer than the cap "
                                         "allows at this decode speed, or a server that makes no progress)")
        if answer is None:
            return verdict(WRONG, f"no answer ({why})")
        state, problem = assess(check, answer)
        if state != CUT:
            return verdict(state, problem)
        cut.append(f"cut at {budget} tokens (finish_reason length): {problem}")
        if len(cut) == 2 or deadline - clock() <= 0:
            break
        budget *= RETRY_FACTOR
    if not cut:
        return verdict(INCONCLUSIVE, f"not asked: no time within the wall-time cap of {round(seconds)} s")
    if len(cut) == 1:
        return verdict(INCONCLUSIVE, f"{cut[0]}; no time left within {round(seconds)} s to ask again with "
                                     f"{budget * RETRY_FACTOR} tokens")
    return verdict(INCONCLUSIVE, f"{cut[1]}; the first answer was cut at {budget // RETRY_FACTOR} tokens too")


def run(module) -> None:
    """The module's work, given its AnsibleModule: each check in order. It fails at the first wrong answer, and at
    a server that went away (``server_gone``); inconclusive checks pass with a warning."""
    import time

    params = module.params
    result: dict[str, Any] = {"changed": False, "passed": False, "checks": [], "failed_check": None, "evidence": None,
                              "inconclusive": [], "server_gone": False, "error": None}
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be a positive number of seconds, got {params['timeout']}.", **result)
    try:
        bodies = requests(params["model"], params["reasoning"], params["tool_calls"], params["sampling"])
    except ValueError as err:
        module.fail_json(msg=f"The answer checks cannot be asked: {err}", **result)
    if module.check_mode:
        module.exit_json(skipped=True, msg="Check mode: the answers were not checked.", **result)
    started = time.monotonic()
    for check, body in bodies:
        began = time.monotonic()
        try:
            done = ask_check(params["url"], check, body, params["api_key"], params["timeout"], time.monotonic)
        except ServerGone as err:
            result["checks"].append({"name": check, "state": "unanswered", "passed": False, "problem": str(err),
                                     "max_tokens": body["max_tokens"], "tries": 1,
                                     "seconds": round(time.monotonic() - began, 2)})
            result.update(failed_check=check, server_gone=True, error=str(err),
                          evidence=f"the server went away during check {check} ({err})",
                          elapsed=round(time.monotonic() - started, 2))
            module.fail_json(msg=f"The server went away during check {check} ({err}): judge it from its log.",
                             **result)
        result["checks"].append({**done, "passed": done["state"] == PASSED,
                                 "seconds": round(time.monotonic() - began, 2)})
        if done["state"] == WRONG:
            result.update(failed_check=check, evidence=done["problem"], elapsed=round(time.monotonic() - started, 2))
            module.fail_json(msg=f"The server answers wrongly: check {check} failed: {done['problem']}", **result)
        if done["state"] == INCONCLUSIVE:
            result["inconclusive"].append(check)
            module.warn(f"Answer check {check} was inconclusive: {done['problem']}")
    result.update(passed=True, elapsed=round(time.monotonic() - started, 2))
    settled = len(result["checks"]) - len(result["inconclusive"])
    also = f"; inconclusive: {', '.join(result['inconclusive'])}" if result["inconclusive"] else ""
    module.exit_json(msg=f"{settled} answer checks passed in {result['elapsed']} s{also}.", **result)
