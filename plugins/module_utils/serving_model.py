"""What clients get from the served model, beside the GPU layout: its parsers and sampling defaults (pure, no I/O).

The sglang_service role keeps one entry per model (``sglang_service_models``; docs/models.md gives each value's
source) and names the one it serves (``sglang_service_model``). ``model_flags`` turns that entry and the role's
variables into SGLang flags, as data: the unit renders them, the readiness check expects /server_info to report
them, and the oracle test has real SGLang parse them. A variable set to ``auto`` takes the entry's value; an empty
one leaves the flag out (SGLang's own default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

AUTO = "auto"
# The entry's keys a variable can take from it, by the SGLang flag they set.
FROM_ENTRY = ("tool_call_parser", "reasoning_parser")


class ServingModelError(ValueError):
    """A model name or entry the role cannot use; the message is a sentence that names the fix."""


def model_flags(models: Mapping[str, Any], model: str, tool_call_parser: str = AUTO, reasoning_parser: str = AUTO,
                sampling_defaults: str = "", context_length: int | None = 0) -> dict[str, Any]:
    """``{flag: value}`` for the served model: the parsers (``auto``: the entry's), ``--sampling-defaults`` and
    ``--context-length`` (0 or empty: the model's own, so left out)."""
    if not isinstance(models, Mapping) or model not in models:
        known = ", ".join(sorted(models)) if isinstance(models, Mapping) else "none"
        raise ServingModelError(f"sglang_service_model {model!r} has no entry in sglang_service_models "
                                f"(known: {known}); name one of them, or add an entry with tool_call_parser and "
                                "reasoning_parser.")
    entry = models[model] or {}
    chosen = {"tool_call_parser": tool_call_parser, "reasoning_parser": reasoning_parser}
    flags: dict[str, Any] = {}
    for key in FROM_ENTRY:
        value = entry.get(key) if chosen[key] == AUTO else chosen[key]
        if value:
            flags[key] = str(value)
    if sampling_defaults:
        flags["sampling_defaults"] = str(sampling_defaults)
    if context_length:
        flags["context_length"] = int(context_length)
    return flags


def metrics_flags(enabled: bool, flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{flag: value}`` for SGLang's Prometheus metrics (``sglang_service_metrics``): ``--enable-metrics`` serves
    ``/metrics`` on the serving port; with DP attention (``enable_dp_attention`` in ``flags``, the attempt's) also
    ``--enable-metrics-for-all-schedulers``, as SGLang 0.5.10 reports a scheduler's figures only from attention-TP
    rank 0 without it (scheduler_metrics_mixin.py), and each DP group's queue and KV pool are their own. Off: none."""
    if not enabled:
        return {}
    out: dict[str, Any] = {"enable_metrics": True}
    if (flags or {}).get("enable_dp_attention"):
        out["enable_metrics_for_all_schedulers"] = True
    return out
