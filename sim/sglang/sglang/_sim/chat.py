"""What the simulated Kimi K2.6 writes for a chat request, and what SGLang's chat endpoint makes of it.

The model's raw text uses K2's tokens (docs/kimi-k2-parsers.md): thinking as ``<think>…</think>`` first (on unless
the request sends ``chat_template_kwargs: {"thinking": false}``), then the answer, or a tool-call section
``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{JSON}<|tool_call_end|>
<|tool_calls_section_end|>`` when the request offers tools. ``message`` is serving_chat's non-streaming answer: with
``--reasoning-parser kimi_k2`` the thinking is split into ``reasoning_content`` (forced unless the request turns
thinking off: a text without ``</think>`` is all reasoning), with ``--tool-call-parser kimi_k2`` and tools in the
request the section becomes ``tool_calls`` and ``finish_reason`` ``stop`` becomes ``tool_calls``. Without a parser
the tokens stay in ``content``, as a server started without them answers.

Where the release's code differs, ``message`` follows the release (_sim/release.py):

- 0.5.10: a call's ``index`` is the number the model wrote (IDX) and its id ``functions.NAME:N`` with N = earlier
  calls in the conversation + IDX (the model counts the conversation's calls itself, so the earlier ones count
  twice); ``finish_reason`` becomes ``tool_calls`` once the section begins, and a section without a call it can read
  stays in ``content``, raw, with an empty ``tool_calls``; the reasoning and the text after ``</think>`` are
  stripped of surrounding whitespace; an empty ``content`` is null.
- 0.5.23: ``index`` is the call's position in the answer and N = earlier calls + that position (the model's IDX is
  ignored); without a call it can read the answer is no tool call (``finish_reason`` stays, ``tool_calls`` null)
  and the text before the section is the content; whitespace is kept; an empty ``content`` is ``""``.

tests/oracle/test_chat_parsers.py runs each release's own ``_build_chat_response`` on ``raw`` and compares.

The simulated model answers a sum it is asked (``What is 17 + 25?``) with the number, so a known-answer check can
tell it from a broken one; the ``garbage`` fault makes every answer a run of ``!`` (what NaN logits decode to).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re

from . import release as R

KIMI, DEEPSEEK = "kimi_k2", "deepseekv3"  # the model families the simulator writes for (family())
THINK_START, THINK_END = "<think>", "</think>"
# DeepSeek-V3's tool-call tokens (function_call/deepseekv3_detector.py), written as the model writes them
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_CALL = re.compile(re.escape(DS_CALL_BEGIN) + ".*?" + re.escape(DS_CALL_END), re.S)
_DS_DETAIL = re.compile(re.escape(DS_CALL_BEGIN) + "(.*)" + re.escape(DS_SEP) + "(.*)\n```json\n(.*)\n```"
                        + re.escape(DS_CALL_END), re.S)
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
# serving_chat / KimiK2Detector: a call's id, and the arguments up to the call's end (nested objects survive)
_CALL = re.compile(re.escape(CALL_BEGIN) + r"\s*([\w.\-]+:\d+)\s*" + re.escape(ARGUMENT_BEGIN) + r"\s*(\{.*?\})\s*"
                   + re.escape(CALL_END), re.S)
_CALL_ID = re.compile(r"^(?:functions\.)?([\w.\-]+):(\d+)$")
_SUM = re.compile(r"(-?\d+)\s*\+\s*(-?\d+)")
SAMPLE = {"string": "Paris", "integer": 3, "number": 2.5, "boolean": True, "array": [], "object": {}}


# How long Kimi K2.x thinks, in tokens: log-normal, median 1200, sigma 0.8 (10th percentile ~430, 90th ~3300,
# 99th ~7700), kept within 100..16000. No public per-answer distribution of K2.6's thought lengths was found; the
# figure follows what Moonshot's K2-Thinking/K2.6 model cards and recipes imply: thinking mode wants temperature
# 1.0 and max_tokens of at least 16k, and 4096 is called too small a budget (thinking eats it), so thoughts of
# thousands of tokens are ordinary and most fit well within 16k.
THOUGHT_MEDIAN, THOUGHT_SIGMA, THOUGHT_MIN, THOUGHT_MAX = 1200, 0.8, 100, 16000


def thought_tokens(body: dict, prompt: str) -> int:
    """The length of this request's thought. Temperature 0 (greedy) thinks the same for the same prompt; above 0 the
    length is drawn from the distribution, reproducibly when the request sends a ``seed``. No temperature is
    SGLang's default, 1.0."""
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else float(temperature)
    if temperature <= 0:
        rng = random.Random(hashlib.sha256(prompt.encode()).hexdigest())
    elif body.get("seed") is not None:
        rng = random.Random(hashlib.sha256(f"{prompt}\0{body['seed']}\0{temperature}".encode()).hexdigest())
    else:
        rng = random.Random()
    n = round(math.exp(math.log(THOUGHT_MEDIAN) + THOUGHT_SIGMA * rng.gauss(0.0, 1.0)))
    return max(THOUGHT_MIN, min(THOUGHT_MAX, n))


def thinks(body: dict, model: str) -> bool:
    return thinking_on(body) and model == KIMI


def family(architecture: str) -> str:
    """Kimi K2.x (KimiK2*/KimiK25* architectures) writes K2's tokens and thinks; anything else is taken as a
    DeepSeek-V3-style text model: no thinking, DeepSeek-V3's tool-call tokens."""
    return KIMI if architecture.startswith("KimiK2") else DEEPSEEK


def thinking_on(body: dict) -> bool:
    """K2.6's chat template thinks unless chat_template_kwargs says thinking: false."""
    kwargs = body.get("chat_template_kwargs") or {}
    return kwargs.get("thinking") is not False


def _offered_tools(body: dict) -> list[dict]:
    if body.get("tool_choice") == "none":
        return []
    return [t.get("function") or {} for t in body.get("tools") or [] if isinstance(t, dict)]


def _earlier_calls(body: dict) -> int:
    return sum(len(m.get("tool_calls") or []) for m in body.get("messages") or []
               if isinstance(m, dict) and m.get("role") == "assistant")


def _arguments(schema: dict) -> dict:
    props = (schema or {}).get("properties") or {}
    wanted = (schema or {}).get("required") or list(props)
    return {name: SAMPLE.get((props.get(name) or {}).get("type"), "Paris") for name in wanted}


def _last_user_text(body: dict, text_of) -> str:
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            return text_of(m.get("content"))
    return ""


def raw(body: dict, words: list[str], finish: str, text_of, garbage: bool = False,
        model: str = KIMI, thought: int = 0) -> tuple[str, str]:
    """The model's decoded output for the request and its finish reason: ``words`` are the tokens the server decoded
    for it (the first ``thought`` of them the thinking, when the model thinks), ``finish`` why the decoding stopped
    (``length``: max_tokens); ``model`` the family (family())."""
    if garbage:
        return "!" * max(8, len(words)), finish
    think = thinks(body, model)
    last = body.get("messages", [{}])[-1] if body.get("messages") else {}
    tools = _offered_tools(body)
    asked = _SUM.search(_last_user_text(body, text_of))
    if asked and not think and not tools:  # a short answer: it ends long before max_tokens
        return str(int(asked.group(1)) + int(asked.group(2))), "stop"
    # The thought comes first; a reply cut by max_tokens inside it never closed it.
    half = min(thought, len(words)) if think else 0
    reasoning = " ".join(words[:half])
    if finish == "length":
        if not think:
            return " ".join(words), finish
        if len(words) <= thought:
            return THINK_START + reasoning, finish
        return THINK_START + reasoning + THINK_END + " ".join(words[half:]), finish
    head = (THINK_START + reasoning + THINK_END) if think else ""
    if tools and isinstance(last, dict) and last.get("role") == "user":
        tool = tools[0]
        chosen = body.get("tool_choice")
        if isinstance(chosen, dict) and (chosen.get("function") or {}).get("name"):
            tool = next((t for t in tools if t.get("name") == chosen["function"]["name"]), tool)
        args = json.dumps(_arguments(tool.get("parameters") or {}), ensure_ascii=False)
        # The model numbers the calls of the whole conversation itself.
        name = tool.get("name", "tool")
        if model == DEEPSEEK:
            call = f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"
            return DS_CALLS_BEGIN + call + DS_CALLS_END, finish
        call = f"{CALL_BEGIN}functions.{name}:{_earlier_calls(body)}{ARGUMENT_BEGIN}{args}{CALL_END}"
        return head + SECTION_BEGIN + call + SECTION_END, finish
    answer = str(int(asked.group(1)) + int(asked.group(2))) if asked else " ".join(words[half:])
    return head + answer, finish


def message(text: str, body: dict, finish: str, reasoning_parser: str | None,
            tool_call_parser: str | None, release: str | None = None) -> tuple[dict, str]:
    """serving_chat's non-streaming message for the raw ``text``, and the finish reason, as SGLang ``release``
    (default: the release the simulator is) builds them."""
    old = (release or R.current()) == "0.5.10"
    reasoning = None
    if reasoning_parser == "kimi_k2" and body.get("separate_reasoning", True):
        forced = not body.get("chat_template_kwargs") or thinking_on(body)
        reasoning, text = _split_reasoning(text, forced, strip=old)
    calls = None
    if tool_call_parser == DEEPSEEK and body.get("tools") and body.get("tool_choice") != "none" \
            and DS_CALLS_BEGIN in text:
        text, calls, finish = _deepseek_calls(text, body, finish, old)
    elif tool_call_parser == "kimi_k2" and body.get("tools") and body.get("tool_choice") != "none" \
            and SECTION_BEGIN in text:
        found = []
        for call_id, args in _CALL.findall(text):
            m = _CALL_ID.match(call_id)
            if m:
                found.append((m.group(1), int(m.group(2)), args))
        earlier = _earlier_calls(body)
        # 0.5.10 numbers a call by the model's own count, 0.5.23 by its position in this answer
        numbered = [(idx if old else position, name, args) for position, (name, idx, args) in enumerate(found)]
        calls = [{"id": f"functions.{name}:{earlier + n}", "index": n, "type": "function",
                  "function": {"name": name, "arguments": args}} for n, name, args in numbered]
        if calls:
            text = text[:text.find(SECTION_BEGIN)]
            finish = "tool_calls" if finish == "stop" else finish
        elif old:  # 0.5.10: the section still makes it a tool call, and the raw text stays the content
            finish = "tool_calls" if finish == "stop" else finish
        else:  # 0.5.23: no tool call; the text before the section is the content
            calls, text = None, text[:text.find(SECTION_BEGIN)]
    return {"role": "assistant", "content": text or (None if old else ""), "reasoning_content": reasoning or None,
            "tool_calls": calls}, finish


def _split_reasoning(text: str, forced: bool, strip: bool) -> tuple[str | None, str]:
    """The kimi_k2 ReasoningParser's detect_and_parse: 0.5.10 drops every ``<think>`` and strips the parts
    (``strip``), 0.5.23 drops only the leading ones and keeps the whitespace."""
    if not forced and THINK_START not in text:
        return None, text
    if strip:
        body = text.replace(THINK_START, "").strip()
    else:
        body = text
        while body.startswith(THINK_START):
            body = body[len(THINK_START):]
    tidy = str.strip if strip else str
    if THINK_END not in body:
        if SECTION_BEGIN in body:  # a tool section ends the thinking without </think>
            at = body.find(SECTION_BEGIN)
            return tidy(body[:at]), body[at:]
        return body, ""  # cut before </think>: all of it is reasoning
    reasoning, _, rest = body.partition(THINK_END)
    return reasoning, tidy(rest)


def _deepseek_calls(text: str, body: dict, finish: str, old: bool) -> tuple[str, list | None, str]:
    """serving_chat with --tool-call-parser deepseekv3: (content, calls, finish reason). The text before the section
    is the content, each call's JSON re-written (json.dumps), calls to tools the request does not offer dropped, ids
    call_<24 hex> (random); a call's index is its tool's place in the request (0.5.10) or the call's in the answer
    (0.5.23). Without a call read (unknown tools, text the detector cannot read), 0.5.10 answers the whole text and
    an empty list, 0.5.23 the detector's text and no calls."""
    import uuid

    offered = [(t.get("function") or {}).get("name") for t in body.get("tools") or []]
    content = text[:text.find(DS_CALLS_BEGIN)].strip()
    calls = []
    try:
        for match in _DS_CALL.findall(text):
            detail = _DS_DETAIL.search(match)
            name, arguments = detail.group(2), json.loads(detail.group(3))
            if name in offered:
                calls.append({"id": f"call_{uuid.uuid4().hex[:24]}",
                              "index": offered.index(name) if old else len(calls), "type": "function",
                              "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    except (AttributeError, ValueError):  # the detector gives the whole text back as content
        content, calls = text, []
    if calls:
        return content, calls, "tool_calls" if finish == "stop" else finish
    if old:  # 0.5.10: the section still makes it a tool call, and the raw text stays the content
        return text, [], "tool_calls" if finish == "stop" else finish
    return content, None, finish  # 0.5.23: no tool call
