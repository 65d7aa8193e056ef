"""``sglang_service_extra_flags`` judged on the controller by the target SGLang release's own parser data
(sglang_releases.ARGUMENTS, generated from each release's wheel): names, types, choices, plus the ranges and
ownership rules argparse does not know. One sentence per problem, naming the flag and the fix. Every function takes
the release the host will run (sglang_releases.release_of its sglang_package_spec): a flag one release has and
another has not is refused for the other.

Refused, besides what SGLang's parser refuses (an unknown name, a value its type cannot convert, a value outside
its choices): a fraction outside (0, 1); a whole number outside the bounds moefleet knows; a flag that changes the
GPU layout (a profile decides it, and the fit check, the rollback ladder and the GPU count all read the profile);
a flag a role variable owns (port, host, model path, served model name, API key: the key would be on the command
line for every user to read); a prefix SGLang's parser would take for a longer flag (it takes unique prefixes,
which a later release can make ambiguous, as 0.5.23 did for cuda_graph_max_bs).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Any

from ansible_collections.moefleet.serving.plugins.module_utils.sglang_releases import ARGUMENTS, RENAMED

_SPELLINGS: dict[str, dict[str, str]] = {}


def spellings(release: str) -> dict[str, str]:
    """Every spelling the release's parser takes (tp_size, tensor_parallel_size, ep, ...), as moefleet writes flags
    (``--`` dropped, ``-`` as ``_``), to the argument's name; and moefleet's own name of an argument the release
    renamed (sglang_releases.RENAMED: ``cuda_graph_max_bs`` on 0.5.23), which the roles write under its new name."""
    if release not in _SPELLINGS:
        known = {
            option[2:].replace("-", "_"): name
            for name, (_kind, _type, _choices, options) in ARGUMENTS[release].items()
            for option in options
            if option.startswith("--")
        }
        known.update({old: known[new] for old, new in RENAMED[release].items() if new in known})
        _SPELLINGS[release] = known
    return _SPELLINGS[release]


# The GPU layout: how many GPUs a start uses and how they split the model. A profile sets these. By spelling, so
# that it holds for every release (0.5.23 names tensor_parallel_size tp_size and adds attention DP and decode
# context parallel sizes).
LAYOUT = frozenset({
    "tp_size", "tensor_parallel_size", "pp_size", "pipeline_parallel_size", "ep_size", "expert_parallel_size",
    "dp_size", "data_parallel_size", "attn_cp_size", "attention_context_parallel_size", "moe_dp_size",
    "moe_data_parallel_size", "moe_dense_tp_size", "enable_dp_attention", "attn_dp_size",
    "attention_data_parallel_size", "dcp_size", "decode_context_parallel_size", "dwdp_size",
    "shared_experts_tp_size", "nnodes", "node_rank", "dist_init_addr", "base_gpu_id", "gpu_id_step",
})


def _changes_layout(name: str, release: str) -> bool:
    return name in LAYOUT or any(o[2:].replace("-", "_") in LAYOUT for o in ARGUMENTS[release][name][3])


# Arguments a role variable owns; set there, not here.
OWNED = {
    "port": "sglang_service_port",
    "host": "sglang_service_host",
    "model_path": "sglang_model_path",
    "served_model_name": "sglang_service_served_model_name",
    "api_key": "sglang_service_api_key (in Ansible Vault: it reaches SGLang as a credential file, not argv)",
    "admin_api_key": "sglang_service_api_key (in Ansible Vault; never on the command line)",
    "config": "the role's own variables (the role passes --config for the API key)",
    "tool_call_parser": "sglang_service_tool_call_parser (auto: the model's, from sglang_service_models)",
    "reasoning_parser": "sglang_service_reasoning_parser (auto: the model's, from sglang_service_models)",
    "sampling_defaults": "sglang_service_sampling_defaults",
    "context_length": "sglang_service_context_length",
    "enable_metrics": "sglang_service_metrics",
    "enable_metrics_for_all_schedulers": "sglang_service_metrics (it adds this flag with DP attention)",
}

# Fractions of something (GPU memory, a token pool): SGLang takes any float, and fails, or runs out of memory,
# hours later when it is not within (0, 1).
FRACTIONS = frozenset({"mem_fraction_static", "swa_full_tokens_ratio", "prefill_delayer_token_usage_low_watermark"})

# Inclusive bounds of SGLang's whole-number flags moefleet knows (the catalog's and the extra flags' checks, and
# moefleet plan's): far above any single host, far below what breaks a unit file or SGLang's argument parser.
FLAG_BOUNDS: dict[str, tuple[int, int]] = {
    "tp_size": (1, 64),
    "ep_size": (1, 64),
    "pp_size": (1, 64),
    "dp_size": (1, 64),
    "cuda_graph_max_bs": (1, 4096),
    "cuda_graph_max_bs_decode": (1, 4096),
    "chunked_prefill_size": (-1, 1 << 20),
    "context_length": (1, 10 << 20),
    "max_running_requests": (1, 1 << 16),
    "watchdog_timeout": (1, 1 << 20),
    "port": (1, 65535),
}
# Any other whole-number flag: SGLang's own -1 up to a C int.
OTHER_INT_BOUNDS = (-1, (1 << 31) - 1)
_INT_TEXT = re.compile(r"-?[0-9]+")
# SGLang's human_readable_int (utils/common.py): SI suffixes with decimals, IEC suffixes without.
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_HUMAN = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def whole(value: Any, kind_type: str = "int") -> int | None:
    """``value`` as SGLang's int or human_readable_int converter reads it, or None when it would refuse it."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _INT_TEXT.fullmatch(text):
        return int(text)
    match = _HUMAN.fullmatch(text) if kind_type == "human_readable_int" else None
    if not match:
        return None
    number, suffix = match.groups()
    if suffix in _IEC:
        return None if "." in number else int(number) * _IEC[suffix]
    return int(float(number) * _SI[suffix])


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def typed(flags: Mapping[str, Any], release: str) -> dict[str, Any]:
    """``flags`` with the numbers written as text (``"0.85"``, ``"128k"``) as the numbers SGLang ``release`` reads,
    for the planner; anything else as it is."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        name = spellings(release).get(str(key))
        kind_type = ARGUMENTS[release][name][1] if name else ""
        if isinstance(value, str) and kind_type in ("int", "human_readable_int"):
            number = whole(value, kind_type)
            value = value if number is None else number
        elif isinstance(value, str) and kind_type == "float" and _number(value) is not None:
            value = _number(value)
        out[str(key)] = value
    return out


def extra_flag_problems(path: str, flags: Mapping[str, Any], release: str) -> list[str]:
    """Every problem of ``flags`` (sglang_service_extra_flags) for SGLang ``release``, one sentence each starting
    with ``path/flag``."""
    problems: list[str] = []
    for key, value in flags.items():
        where = f"{path}/{key}"
        name = spellings(release).get(str(key))
        if name is None:
            problems.append(_unknown(where, str(key), release))
            continue
        if _changes_layout(name, release):
            problems.append(
                f"{where}: {key} changes the GPU layout, which the profile decides (its GPU count, the fit check "
                "and the fallback ladder all read the profile); pick another profile, or define one with these "
                "flags in moefleet_extra_profiles, instead of setting it in sglang_service_extra_flags.")
            continue
        if name in OWNED:
            problems.append(f"{where}: {key} is set by the role; set {OWNED[name]} instead.")
            continue
        if value is None or value is False:
            continue  # left out of the command line (profiles.sglang_args)
        problem = value_problem(name, value, release)
        if problem:
            problems.append(f"{where}: {problem}")
    return problems


def value_problem(name: str, value: Any, release: str) -> str | None:
    """The problem of one value for SGLang ``release``'s argument ``name`` (its type, choices and moefleet's
    bounds), or None."""
    kind, kind_type, choices, _options = ARGUMENTS[release][name]
    return _value_problem(name, kind, kind_type, choices, value, release)


def _unknown(where: str, key: str, release: str) -> str:
    known = spellings(release)
    others = [r for r in ARGUMENTS if r != release and key in spellings(r)]
    elsewhere = f" It is one of SGLang {' and '.join(others)}'s." if others else ""
    prefixed = sorted({known[s] for s in known if s.startswith(key)})
    if len(prefixed) > 1:
        return (f"{where}: {key} is not a server argument of SGLang {release} but the start of {len(prefixed)} "
                f"({', '.join(prefixed[:3])}), which its parser refuses as ambiguous at start; write the whole name "
                f"of the one you mean.{elsewhere}")
    if prefixed:
        return (f"{where}: write the whole name ({prefixed[0]}); SGLang's parser takes a prefix today, but a later "
                f"release can make it ambiguous.{elsewhere}")
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.75)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return (f"{where}: {key} is not a server argument of SGLang {release} (it would fail at start with "
            f"'unrecognized arguments').{hint}{elsewhere} Names are written without dashes, '-' as '_' "
            "(mem_fraction_static).")


def _value_problem(name: str, kind: str, kind_type: str, choices: tuple[str, ...] | None,
                   value: Any, release: str) -> str | None:
    if kind == "switch":
        if value is True:
            return None
        return f"{value!r} is not true or false; {name} is a switch (true adds it, false or null leaves it out)."
    if kind == "list":
        items = value if isinstance(value, list) else [value]
        if not items:
            return f"give at least one value, or null to leave {name} out."
        for item in items:
            problem = _scalar_problem(name, kind_type, choices, item, release)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        return f"{name} takes one value, not a list."
    return _scalar_problem(name, kind_type, choices, value, release)


def _scalar_problem(name: str, kind_type: str, choices: tuple[str, ...] | None, value: Any,
                    release: str) -> str | None:
    if isinstance(value, Mapping):
        if kind_type in ("json", "str"):
            return None  # written as JSON (profiles.sglang_args)
        return f"{name} takes a {_WORDS.get(kind_type, kind_type)}, not a mapping."
    if isinstance(value, bool):
        return f"{name} takes a {_WORDS.get(kind_type, kind_type)}, not {str(value).lower()}."
    if kind_type in ("int", "human_readable_int"):
        number = whole(value, kind_type)
        low, high = FLAG_BOUNDS.get(name, OTHER_INT_BOUNDS)
        if number is None:
            return f"{value!r} is not a whole number; give {name} a whole number from {low} to {high}."
        if not low <= number <= high:
            return f"{number} is out of range; give {name} a whole number from {low} to {high}."
    elif kind_type == "float":
        try:
            number = float(value)
        except (TypeError, ValueError):
            return f"{value!r} is not a number; give {name} a number" + (
                " between 0 and 1 (exclusive)." if name in FRACTIONS else ".")
        if not math.isfinite(number):
            return f"{value!r} is not a number SGLang can take; give {name} a finite value."
        if name in FRACTIONS and not 0 < number < 1:
            return (f"{value!r} is not a fraction; give {name} a number between 0 and 1 (exclusive), e.g. 0.85 "
                    "(the share of each GPU's memory, or of the token pool, it names).")
    if choices is not None and str(value) not in choices:
        return (f"{value!r} is not one SGLang {release} takes for {name} (it would fail at start with "
                f"'invalid choice'); pick one of: {', '.join(choices)}.")
    return None


_WORDS = {"int": "whole number", "human_readable_int": "whole number", "float": "number", "str": "text value",
          "json": "JSON value"}
