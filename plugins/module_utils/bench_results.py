"""Read SGLang benchmark results as people paste them: the printed block and the JSONL lines.

Pure standard library, no I/O: ``moefleet bench parse`` feeds it a file's text. One implementation for
every reader of `python -m sglang.bench_serving` results.

The printed block (python/sglang/bench_serving.py, ``benchmark()``, every release since 0.2) is a
``' Serving Benchmark Result '`` title padded with '=' to 50 characters, rows printed as
``"{:<40} {:<10}".format(label, value)``, section titles padded with '-' (``End-to-End Latency``,
``Time to First Token``, ``Time per Output Token (excl. 1st token)``, ``Inter-Token Latency``, spelled
``Inter-token Latency`` before 0.4.1) and a closing line of 50 '='. Rows came and went between releases
(``Max request concurrency`` from 0.4.0, spelled ``Max reqeuest concurrency`` until 0.4.1; ``Total token
throughput`` and ``Concurrency`` later; ``Total input text tokens``, ``Peak output token throughput`` and
``P90 E2E Latency`` in the 0.5 series), so every row is optional: what is printed is read, what is missing
is None. Pasted blocks lose trailing padding, gain CRLF, a tqdm bar or the command above, Markdown
quoting, or rows the author cut (``...``); a block cut mid-way keeps the rows before the cut.

The JSONL line (``--output-file``) is the ``result`` dict of the same function; releases up to 0.3 wrote
other key names (``total_input``, ``median_ttft``, ``output_token_throughput``, ``benchmark_duration``),
read here as the same fields.

Public API:

    parse_text(text) -> list[dict]       one dict per block or JSONL line, keys FIELDS + "extra", "line", "kind"
    FIELDS                               the field names, in the order tables show them
"""

from __future__ import annotations

import json
import math
import re

# Field names of a parsed result, in order. Latencies are in ms, throughputs in tok/s (request_throughput
# in req/s); request_rate is a number, or "inf" / "trace" as printed; max_concurrency None when "not set".
FIELDS = (
    "backend", "request_rate", "max_concurrency", "successful_requests", "duration_s",
    "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens",
    "total_generated_tokens", "total_generated_tokens_retokenized",
    "request_throughput", "input_throughput", "output_throughput", "peak_output_throughput",
    "peak_concurrent_requests", "total_throughput", "concurrency", "accept_length",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p90_e2e_latency_ms", "p99_e2e_latency_ms",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms",
)
_INTEGER_FIELDS = {"max_concurrency", "successful_requests", "total_input_tokens", "total_input_text_tokens",
                   "total_input_vision_tokens", "total_generated_tokens", "total_generated_tokens_retokenized",
                   "peak_concurrent_requests"}
_TEXT_FIELDS = {"backend"}

# Row labels of the printed block (data copied from SGLang's python/sglang/bench_serving.py, benchmark():
# 0.5.10's wheel, and 0.2.7, 0.3.0, 0.3.6, 0.4.0, 0.4.6 from PyPI), lower-cased, without the colon.
BLOCK_LABELS = {
    "backend": "backend",
    "traffic request rate": "request_rate",
    "max request concurrency": "max_concurrency",
    "max reqeuest concurrency": "max_concurrency",  # the spelling of 0.4.0
    "successful requests": "successful_requests",
    "benchmark duration (s)": "duration_s",
    "total input tokens": "total_input_tokens",
    "total input text tokens": "total_input_text_tokens",
    "total input vision tokens": "total_input_vision_tokens",
    "total generated tokens": "total_generated_tokens",
    "total generated tokens (retokenized)": "total_generated_tokens_retokenized",
    "request throughput (req/s)": "request_throughput",
    "input token throughput (tok/s)": "input_throughput",
    "output token throughput (tok/s)": "output_throughput",
    "peak output token throughput (tok/s)": "peak_output_throughput",
    "peak concurrent requests": "peak_concurrent_requests",
    "total token throughput (tok/s)": "total_throughput",
    "concurrency": "concurrency",
    "accept length": "accept_length",
    "mean e2e latency (ms)": "mean_e2e_latency_ms",
    "median e2e latency (ms)": "median_e2e_latency_ms",
    "p90 e2e latency (ms)": "p90_e2e_latency_ms",
    "p99 e2e latency (ms)": "p99_e2e_latency_ms",
    "mean ttft (ms)": "mean_ttft_ms",
    "median ttft (ms)": "median_ttft_ms",
    "p99 ttft (ms)": "p99_ttft_ms",
    "mean tpot (ms)": "mean_tpot_ms",
    "median tpot (ms)": "median_tpot_ms",
    "p99 tpot (ms)": "p99_tpot_ms",
    "mean itl (ms)": "mean_itl_ms",
    "median itl (ms)": "median_itl_ms",
    "p95 itl (ms)": "p95_itl_ms",
    "p99 itl (ms)": "p99_itl_ms",
    "max itl (ms)": "max_itl_ms",
}

# Keys of the JSONL line (the same function's ``result`` dict; 0.2/0.3 names on the right of the newer ones).
JSONL_KEYS = {
    "backend": "backend",
    "request_rate": "request_rate",
    "max_concurrency": "max_concurrency",
    "completed": "successful_requests",
    "duration": "duration_s",
    "benchmark_duration": "duration_s",
    "total_input_tokens": "total_input_tokens",
    "total_input": "total_input_tokens",
    "total_input_text_tokens": "total_input_text_tokens",
    "total_input_vision_tokens": "total_input_vision_tokens",
    "total_output_tokens": "total_generated_tokens",
    "total_output": "total_generated_tokens",
    "total_output_tokens_retokenized": "total_generated_tokens_retokenized",
    "total_output_retokenized": "total_generated_tokens_retokenized",
    "request_throughput": "request_throughput",
    "input_throughput": "input_throughput",
    "output_throughput": "output_throughput",
    "output_token_throughput": "output_throughput",
    "max_output_tokens_per_s": "peak_output_throughput",
    "max_concurrent_requests": "peak_concurrent_requests",
    "total_throughput": "total_throughput",
    "concurrency": "concurrency",
    "accept_length": "accept_length",
    "mean_e2e_latency": "mean_e2e_latency_ms",
    "median_e2e_latency": "median_e2e_latency_ms",
    "median_ttft": "median_ttft_ms",
    "median_itl": "median_itl_ms",
}
JSONL_KEYS.update({name: name for name in FIELDS if name.endswith("_ms")})

_TITLE = re.compile(r"=+\s*serving benchmark result\s*=*", re.IGNORECASE)
_CLOSING = re.compile(r"={3,}")
_SECTION = re.compile(r"-{2,}\s*[A-Za-z].*?-*")  # ---End-to-End Latency--- (padding maybe trimmed)
_ROW = re.compile(r"(?P<label>[A-Za-z][^:]*?)\s*:\s*(?P<value>.*?)")
_CUT = re.compile(r"(\.\.\.|…|\[\.\.\.\]|<snip>|\(\.\.\.\))", re.IGNORECASE)
_QUOTE = re.compile(r"^(\s*>)+\s?")
_FENCE = re.compile(r"`{3,}.*|~{3,}.*")
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def _empty(kind: str, line: int) -> dict:
    result: dict = dict.fromkeys(FIELDS)
    result["extra"] = {}
    result["kind"] = kind
    result["line"] = line
    return result


def _number(text: str):
    """A printed value as int or float; 'inf' as the string 'inf'; None when it is no number."""
    text = text.strip().replace(",", "")
    low = text.lower()
    if low in ("inf", "infinity", "+inf"):
        return "inf"
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return int(value) if re.fullmatch(r"[-+]?\d+", text) else value


def _field_value(field: str, raw):
    """A field's value from a printed string or a JSON value, in the field's type (None when unusable)."""
    if field in _TEXT_FIELDS:
        return None if raw is None else str(raw).strip() or None
    if isinstance(raw, str):
        low = raw.strip().lower()
        if field == "max_concurrency" and low in ("not set", "none", "null", ""):
            return None
        if field == "request_rate" and low == "trace":
            return "trace"
        value = _number(raw)
    elif isinstance(raw, bool) or raw is None:
        return None
    elif isinstance(raw, (int, float)):
        value = "inf" if isinstance(raw, float) and math.isinf(raw) and raw > 0 else raw
    else:
        return None
    if value == "inf":
        return "inf" if field == "request_rate" else None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if field in _INTEGER_FIELDS:
        return int(value) if float(value).is_integer() else value
    return float(value)


def _extra_value(raw: str):
    value = _number(raw)
    return raw.strip() if value is None else value


def _clean(line: str) -> str:
    line = _QUOTE.sub("", line)
    return line.strip().strip("|").strip()


def _json_object(text: str):
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if isinstance(obj, dict) and any(key in JSONL_KEYS and key != "backend" for key in obj):
        return obj
    return None


def _from_jsonl(obj: dict, line: int) -> dict:
    result = _empty("jsonl", line)
    for key, raw in obj.items():
        field = JSONL_KEYS.get(key)
        if field is None:
            result["extra"][key] = raw
        elif result[field] is None:
            result[field] = _field_value(field, raw)
    return result


def _has_values(result: dict) -> bool:
    return any(result[name] is not None for name in FIELDS if name != "backend")


def parse_text(text: str) -> list[dict]:
    """Every result block and JSONL line in ``text``, in order (an empty list when there is none)."""
    lines = text.splitlines()  # CRLF, and tqdm's bare CR, end lines too
    results: list[dict] = []
    current: dict | None = None
    i = 0
    while i < len(lines):
        line = _clean(lines[i])
        number = i + 1
        i += 1
        if _TITLE.fullmatch(line):
            if current is not None and _has_values(current):
                results.append(current)
            current = _empty("block", number)
            continue
        if line.startswith("{"):
            obj = _json_object(line)
            joined = line
            j = i
            while obj is None and j < len(lines) and j - i < 40:  # a JSON line the terminal wrapped
                nxt = _clean(lines[j])
                if nxt.startswith("{") or _TITLE.fullmatch(nxt):
                    break
                joined += nxt
                j += 1
                obj = _json_object(joined)
            if obj is not None:
                if current is not None and _has_values(current):
                    results.append(current)
                current = None
                results.append(_from_jsonl(obj, number))
                i = j
                continue
        if current is None:
            continue
        if not line or _FENCE.fullmatch(line) or _CUT.fullmatch(line) or _SECTION.fullmatch(line):
            if _FENCE.fullmatch(line) and _has_values(current):  # the code block ends: so does the result
                results.append(current)
                current = None
            continue
        if _CLOSING.fullmatch(line):
            if _has_values(current):
                results.append(current)
            current = None
            continue
        row = _ROW.fullmatch(line)
        if row is None:  # prose or a log line after a block whose closing line was cut
            if _has_values(current):
                results.append(current)
            current = None
            continue
        label = re.sub(r"\s+", " ", row.group("label")).lower()
        value = row.group("value")
        if not value:
            continue  # a row cut after its label
        field = BLOCK_LABELS.get(label)
        if field is None:
            current["extra"][row.group("label").strip()] = _extra_value(value)
        elif current[field] is None:
            current[field] = _field_value(field, value)
    if current is not None and _has_values(current):
        results.append(current)
    return results
