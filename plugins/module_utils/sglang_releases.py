"""The SGLang releases moefleet supports, each judged by its own parser's data.

Each release's server arguments (names, kinds, types, choices, spellings) are generated from that release's wheel
by tests/oracle/server_args_data.py into sglang_args_<release>.py and checked against the wheel by `make oracle`.
The controller judges ``sglang_service_extra_flags`` and the served model's parsers by the data of the release
``sglang_package_spec`` pins for the host (its target release), and the roles spell the catalog's flags as that
release takes them (``sglang_args(..., release=)`` in profiles.py).

SUPPORTED is read by tests/oracle/env.py without importing this package: keep it one literal tuple.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ansible_collections.moefleet.serving.plugins.module_utils import sglang_args_0_5_10, sglang_args_0_5_23

SUPPORTED = ("0.5.10", "0.5.23")

ARGUMENTS: dict[str, dict[str, tuple]] = {
    sglang_args_0_5_10.SGLANG_VERSION: sglang_args_0_5_10.ARGUMENTS,
    sglang_args_0_5_23.SGLANG_VERSION: sglang_args_0_5_23.ARGUMENTS,
}

# moefleet's flag vocabulary (profiles/catalog.yml, moefleet_extra_profiles, the rollback's retunes) is SGLang
# 0.5.10's argument names. Where a later release renamed an argument moefleet writes, its name there: 0.5.23 split
# the CUDA graph settings by phase (arg_groups/fields/exec_.py), and the decode graph is what 0.5.10's flags sized.
# 0.5.23 refuses the old spelling as an ambiguous prefix of the two new ones.
RENAMED: dict[str, dict[str, str]] = {
    "0.5.10": {},
    "0.5.23": {"cuda_graph_max_bs": "cuda_graph_max_bs_decode", "cuda_graph_bs": "cuda_graph_bs_decode"},
}

# What each release's wheel is built for (its METADATA's Requires-Dist): the CUDA major its kernels and PyTorch
# need, which the host's toolkit (cuda_toolkit_version: nvcc for SGLang's JIT kernels) must match, and the oldest
# NVIDIA driver branch that runs that CUDA (NVIDIA's CUDA release notes: CUDA 13.0 needs 580 or newer; Blackwell
# needs 570 or newer for CUDA 12.8 and later).
# "toolkit": the CUDA toolkit release moefleet installs for it by default (cuda_toolkit_version follows the pinned
# release; each toolkit in /usr/local/cuda-X.Y with an environment file of its own, so that a unit of the old release
# keeps the toolkit it was built for after an upgrade installed the next).
STACK: dict[str, dict[str, Any]] = {
    "0.5.10": {"cuda_major": 12, "driver_branch": 570, "toolkit": "12.9",
               "built": "cuda-python==12.9 and torch 2.9.1"},
    "0.5.23": {"cuda_major": 13, "driver_branch": 580, "toolkit": "13.0",
               "built": "cuda-python>=13.0, torch 2.14.1 and cu13 kernels"},
}

# The one command that adds a release: its parser's data from its wheel (and its oracle venv).
ADD_RELEASE = ("add it to SUPPORTED in plugins/module_utils/sglang_releases.py and run `make oracle-env` and "
               "`.venv/bin/python tests/oracle/server_args_data.py`, which write its parser's data from its own wheel")

_PIN = re.compile(r"\s*sglang(?:\[[^\]]*\])?\s*==\s*([0-9][0-9A-Za-z.+!-]*)\s*")


def release_of(spec: Any) -> str | None:
    """The release a pip requirement pins exactly (``sglang[all]==0.5.10`` -> ``0.5.10``; a local version label such
    as the lab's ``+moefleetsim`` is left out), or None when it pins none."""
    match = _PIN.fullmatch(spec) if isinstance(spec, str) else None
    return match.group(1).split("+", 1)[0] if match else None


def release_problem(spec: Any, host: str | None = None) -> str | None:
    """The sentence that refuses a ``sglang_package_spec`` whose release moefleet cannot judge, or None."""
    where = f" for {host}" if host else ""
    release = release_of(spec)
    supported = " or ".join(f"sglang[all]=={r}" for r in SUPPORTED)
    if release is None:
        return (f"sglang_package_spec is {spec!r}{where}, which pins no one SGLang release; moefleet judges the "
                f"flags, the parsers and the plan by the target release's own data: pin one, {supported}.")
    if release not in ARGUMENTS:
        return (f"sglang_package_spec pins SGLang {release}{where}, which moefleet has no data for (it supports "
                f"{', '.join(SUPPORTED)}); pin {supported}, or {ADD_RELEASE}.")
    return None


# Releases that size attention data parallelism with --attn-dp-size: 0.5.23 takes 0.5.10's --dp-size N
# --enable-dp-attention with a deprecation warning and rewrites it to attn_dp_size=N, dp_size=1 (server_args.py,
# arg_groups/parallel_hook.py), which /server_info then reports; moefleet writes the new form there.
ATTN_DP_SIZE = frozenset({"0.5.23"})


def spelled_for(flags: Mapping[str, Any], release: str) -> dict[str, Any]:
    """``flags`` in moefleet's vocabulary as SGLang ``release`` takes them, in their order: each argument the
    release renamed under its name there, and on a release of ATTN_DP_SIZE, ``dp_size: N`` with
    ``enable_dp_attention: true`` as ``attn_dp_size: N``."""
    renamed = RENAMED[release]
    attn_dp = release in ATTN_DP_SIZE and flags.get("enable_dp_attention") is True
    out: dict[str, Any] = {}
    for key, value in flags.items():
        key = str(key)
        if attn_dp and key == "enable_dp_attention":
            continue
        out["attn_dp_size" if attn_dp and key == "dp_size" else renamed.get(key, key)] = value
    return out


def stack_problems(release: str, cuda_version: Any, driver_branch: Any, host: str) -> list[str]:
    """The host's CUDA toolkit and driver branch against what ``release`` is built for, as sentences naming the
    variables to set (or the release to pin instead)."""
    need = STACK[release]
    other = [r for r in SUPPORTED if r != release and _fits(STACK[r], cuda_version, driver_branch)]
    instead = f", or pin sglang[all]=={other[-1]}, which this host's stack runs" if other else ""
    problems = []
    major = _major(cuda_version)
    if major is not None and major != need["cuda_major"]:
        problems.append(
            f"SGLang {release} is built for CUDA {need['cuda_major']} ({need['built']}) but {host} sets "
            f"cuda_toolkit_version {cuda_version!r}: leave cuda_toolkit_version unset (it follows the pinned release: "
            f"{need['toolkit']}) or set it to a CUDA {need['cuda_major']} release{instead}.")
    branch = _whole(driver_branch)
    if branch is not None and branch < need["driver_branch"]:
        problems.append(
            f"SGLang {release} needs CUDA {need['cuda_major']}, which needs NVIDIA driver branch "
            f"{need['driver_branch']} or newer, but {host} sets nvidia_driver_branch {branch}: set it to "
            f"{need['driver_branch']} or newer{instead}.")
    return problems


def toolkit_for(release: str) -> str:
    """The CUDA toolkit release (X.Y) moefleet installs for ``release`` unless cuda_toolkit_version says otherwise."""
    return STACK[release]["toolkit"]


def _fits(need: Mapping[str, Any], cuda_version: Any, driver_branch: Any) -> bool:
    branch = _whole(driver_branch)
    return _major(cuda_version) == need["cuda_major"] and (branch is None or branch >= need["driver_branch"])


def _major(version: Any) -> int | None:
    match = re.match(r"\s*([0-9]+)\.", str(version)) if isinstance(version, str | int | float) else None
    return int(match.group(1)) if match else None


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def canonical(flags: Mapping[str, Any], release: str) -> dict[str, Any]:
    """``flags`` written for ``release`` (an operator's extra flags over a profile's) in moefleet's vocabulary, which
    the planner and the rollback read: spelled_for undone."""
    back = {new: old for old, new in RENAMED[release].items()}
    out: dict[str, Any] = {}
    for key, value in flags.items():
        key = str(key)
        if release in ATTN_DP_SIZE and key == "attn_dp_size":
            out["dp_size"] = value
            out["enable_dp_attention"] = True
            continue
        out[back.get(key, key)] = value
    return out
