"""The correctness gate: what a client of the started server gets, judged before the start counts as good.

A server can start, pass /health and the flag check, and still answer garbage: NaN logits from a broken kernel on
sm_120 decode to runs of "!", a missing parser leaves the model's raw tokens in ``content``, a parser bug leaks the
answer into ``reasoning_content`` (docs/correctness-gate.md). Each check is one small chat request and a judgement of
its answer; ``CHECKS`` are run in order and the first failure is the verdict, with the answer as evidence.

- ``thinking`` (a model with a reasoning parser): a thinking-mode chat answers with ``content`` and
  ``reasoning_content`` both non-empty, apart (no ``<think>`` tags left in either);
- ``instant``: the same with ``chat_template_kwargs: {"thinking": false}`` answers with content and no reasoning;
- ``tool_call`` (a model with a tool-call parser): a request that offers one tool with a hyphenated name
  (``get-weather``, as MCP names tools) comes back as a parsed ``tool_calls`` entry with that name and JSON-object
  arguments, no raw tool tokens in ``content``;
- ``known_answer``: "What is 17 + 25?" is answered with 42;
- ``garbage``, on every answer: runs of "!" (NaN logits), U+FFFD replacement characters, one word repeated on and
  on, raw special tokens (``<|...|>``) in content.

Pure functions over request and answer dicts; the HTTP and the module's I/O are plugins/modules/sglang_answers.py's.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL = {"type": "function", "function": {
    "name": "get-weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
QUESTION, ANSWER = "What is 17 + 25? Answer with the number only.", "42"
# Tokens a chat answer is allowed: enough for a short thinking-mode answer, small enough to cost seconds.
MAX_TOKENS = {"thinking": 512, "instant": 64, "tool_call": 256, "known_answer": 16}
CHECKS = ("thinking", "instant", "tool_call", "known_answer")
EVIDENCE_CHARS = 200

_BANGS = re.compile(r"!{8,}")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>|</?think>")
REPEAT_RUN = 12  # the same word this many times in a row


def requests(model: str, reasoning: bool, tool_calls: bool) -> list[tuple[str, dict]]:
    """(check, chat request body) for the checks that apply to the served model's parsers."""
    def body(text: str, check: str, **extra: Any) -> dict:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS[check],
                "temperature": 0, "stream": False, **extra}

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


def judge(check: str, answer: dict) -> str | None:
    """Why the answer to ``check``'s request fails it, or None when it passes."""
    try:
        choice = answer["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return f"no chat message in the answer: {quote(json.dumps(answer)[:EVIDENCE_CHARS])}"
    content, reasoning = message.get("content"), message.get("reasoning_content")
    for field, text in (("content", content), ("reasoning_content", reasoning)):
        why = garbage(text)
        if why:
            return f"{field} is garbage, {why}: {quote(text)}"
    if content and _SPECIAL.search(content):
        return (f"content holds the model's raw tokens ({_SPECIAL.search(content).group(0)}), so the server's parser "
                f"did not apply: {quote(content)}")
    if check == "thinking":
        if not reasoning:
            return f"a thinking-mode answer without reasoning_content; content: {quote(content)}"
        if not content:
            return f"a thinking-mode answer with reasoning only, no content; reasoning_content: {quote(reasoning)}"
        if _SPECIAL.search(reasoning):
            return f"reasoning_content holds think tags: {quote(reasoning)}"
    elif check == "instant":
        if reasoning:
            return f"reasoning_content with thinking off (the answer leaks into it): {quote(reasoning)}"
        if not content:
            return "an empty answer"
    elif check == "tool_call":
        calls = message.get("tool_calls") or []
        if not calls:
            return f"no parsed tool_calls for a request that offers one tool; content: {quote(content)}"
        function = calls[0].get("function") or {}
        if function.get("name") != TOOL["function"]["name"]:
            return f"the tool call names {function.get('name')!r}, not {TOOL['function']['name']!r}"
        try:
            arguments = json.loads(function.get("arguments") or "")
        except ValueError:
            return f"the tool call's arguments are no JSON: {quote(function.get('arguments'))}"
        if not isinstance(arguments, dict):
            return f"the tool call's arguments are no JSON object: {quote(function.get('arguments'))}"
    elif check == "known_answer" and ANSWER not in re.findall(r"-?\d+", content or ""):
        return f"asked {QUESTION!r}, answered {quote(content)}"
    return None


def ask(url: str, body: dict, api_key: str | None, timeout: float) -> tuple[int, dict | None, str]:
    """POST one chat request: (HTTP status, the JSON answer or None, a short reason when there is none)."""
    import urllib.error

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
        return err.code, None, f"HTTP {err.code}"
    except (urllib.error.URLError, OSError, ValueError) as err:
        return 0, None, str(getattr(err, "reason", err))
    try:
        return status, json.loads(raw), ""
    except ValueError:
        return status, None, f"not JSON: {quote(raw[:EVIDENCE_CHARS].decode('utf-8', 'replace'))}"


def run(module) -> None:
    """The module's work, given its AnsibleModule: each check in order; fail_json at the first that fails."""
    import time

    params = module.params
    result: dict[str, Any] = {"changed": False, "passed": False, "checks": [], "failed_check": None, "evidence": None}
    if module.check_mode:
        module.exit_json(skipped=True, msg="Check mode: the answers were not checked.", **result)
    started = time.monotonic()
    for check, body in requests(params["model"], params["reasoning"], params["tool_calls"]):
        began = time.monotonic()
        status, answer, why = ask(params["url"], body, params["api_key"], params["timeout"])
        problem = judge(check, answer) if answer is not None else f"no answer ({why})"
        result["checks"].append({"name": check, "passed": problem is None, "problem": problem,
                                 "seconds": round(time.monotonic() - began, 2)})
        if problem is not None:
            result.update(failed_check=check, evidence=problem, elapsed=round(time.monotonic() - started, 2))
            module.fail_json(msg=f"The server answers wrongly: check {check} failed: {problem}", **result)
    result.update(passed=True, elapsed=round(time.monotonic() - started, 2))
    module.exit_json(msg=f"{len(result['checks'])} answer checks passed in {result['elapsed']} s.", **result)
