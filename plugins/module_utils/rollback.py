"""What to try after a start fails: the remedy follows the cause (pure functions, no I/O).

An *attempt* is what one start of the service runs: ``{"profile": name, "tuning": {flag: value},
"nccl_set": name}``; its *outcome* is the readiness verdict (``state``, ``phase``, ``cause``). Given the
fallback ladder and the attempts made so far (each with its outcome), ``next_step`` says what to do:

- a weight-load OOM: the layout cannot hold the model here; move down the ladder;
- a runtime OOM (a forward pass while serving, recorded by the unit's exit hook; the deploy acts on repeated
  ones): retune the same layout once with half the ``--max-running-requests`` (a smaller batch needs less
  activation memory), then move down the ladder;
- a KV-pool OOM: retune the same layout once with a higher ``--mem-fraction-static`` (weights are
  already loaded by then, so the pool is what ran short): the largest the planner allows on these GPUs,
  one that keeps SGLang's own reserve for activations and CUDA graphs; then move down the ladder;
- a CUDA-graph OOM: retune once with a smaller ``--cuda-graph-max-bs``, then move down;
- a hang: retry once with the ``pcie_shm`` NCCL set (P2P off), plus ``--disable-custom-all-reduce``
  where SGLang's custom all-reduce would still use P2P (a TP or MoE group of two GPUs), then move down;
- any other crash (NCCL error, port in use, bad weights, driver, a GPU fault, args mismatch): not a layout
  problem; restore the last unit that served, no ladder;
- wrong answers (``wrong_output``: the correctness gate, answer_check.py, failed on a server that serves): treated as
  a crash of that layout, restore the last unit that served;
- a new SGLang release slower than the one it replaces (``slower_release``: an upgrade's benchmark,
  release_compare.py): restore the last unit that served, the old release's;
- GPUs CUDA cannot use (``gpu_unavailable``: device nodes missing or closed to the unit, no driver loaded, driver
  and libraries of different versions, a lost GPU): no layout, smaller or not, starts on such a host, so no
  fallback and no retune either; the last unit that served is restored, and its start fails the same way until the
  host is fixed: the reason says so, so that the restore failing too is not read as a second, separate fault.

When the ladder is exhausted the step is ``restore`` too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.moefleet.serving.plugins.module_utils import planner

SHM_NCCL_SET = "pcie_shm"
# Retuning after a CUDA-graph OOM: halve the batch sizes captured; start here when the profile has none.
CUDA_GRAPH_BS_START = 64
# Retuning after runtime OOMs: halve the running requests; start here when neither profile nor tuning sets them.
MAX_RUNNING_START = 128


# The remedies that retry the same layout, each at most once per layout (next_step).
RETUNES = ("retune_kv", "retune_cuda_graph", "retune_runtime", "nccl_shm")


class RollbackError(ValueError):
    """Inputs the rollback logic cannot use; the message is a sentence."""


def first_attempt(profile: str, nccl_set: str) -> dict[str, Any]:
    return {"profile": profile, "tuning": {}, "nccl_set": nccl_set}


# Outcomes after which a rerun with the same ask and inputs keeps what the host runs instead of starting over.
KEPT_OUTCOMES = ("ready", "degraded", "restored")


def opening_attempt(
    previous: Mapping[str, Any] | None,
    profile: str,
    fingerprint: str,
    nccl_set: str,
    catalog: Mapping[str, Any],
    retry: bool = False,
) -> dict[str, Any]:
    """The attempt a run starts with, ``{"attempt": ..., "kept": bool}``.

    ``previous`` is what the host recorded last (its local facts: ``asked_profile``,
    ``asked_fingerprint``, ``outcome``, ``attempt``). A host that already served, fell back or was
    restored for this same ask with the same inputs (flags, NCCL set, environment, model: the
    fingerprint) keeps its attempt, so a rerun with nothing changed does not restart into the same
    failure. Anything changed, a profile the catalog no longer has, or ``retry`` tries ``profile`` anew.
    """
    previous = previous or {}
    kept_attempt = previous.get("attempt")
    kept = (
        not retry
        and previous.get("asked_profile") == profile
        and previous.get("asked_fingerprint") == fingerprint
        and previous.get("outcome") in KEPT_OUTCOMES
        and isinstance(kept_attempt, Mapping)
        and kept_attempt.get("profile") in (catalog.get("profiles") or {})
    )
    return {"attempt": dict(kept_attempt) if kept else first_attempt(profile, nccl_set), "kept": kept}


def _same_layout(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.get("profile") == b.get("profile")


def _retuned(attempts: Sequence[Mapping[str, Any]], current: Mapping[str, Any], kind: str) -> bool:
    return any(_same_layout(a, current) and a.get("remedy") == kind for a in attempts)


def _down_the_ladder(
    ladder: Sequence[str], attempts: Sequence[Mapping[str, Any]], catalog: Mapping[str, Any], why: str
) -> dict[str, Any]:
    tried = {a.get("profile") for a in attempts}
    for name in ladder:
        if name not in tried:
            nccl = (catalog.get("profiles", {}).get(name) or {}).get("nccl", "pcie_p2p")
            return {"action": "start", "attempt": {**first_attempt(name, nccl), "remedy": "fallback"},
                    "reason": f"{why}; falling back to {name}."}
    return {"action": "restore", "reason": f"{why}, and the fallback ladder ({' -> '.join(ladder)}) is exhausted; "
                                           "restoring the last unit that served."}


def _halved(current: Mapping[str, Any], flags: Mapping[str, Any], flag: str, start: int, remedy: str,
            why: str) -> dict[str, Any]:
    """Retry the same layout once with ``flag`` halved (``start`` when the profile does not set it)."""
    value = flags.get(flag)
    smaller = max(1, int(value) // 2) if value else start
    tuning = {**(current.get("tuning") or {}), flag: smaller}
    return {"action": "start", "attempt": {**current, "tuning": tuning, "remedy": remedy},
            "reason": f"{why}; retrying it once with --{flag.replace('_', '-')} {smaller}."}


def max_remedies(ladder: Sequence[str]) -> int:
    """The most starts next_step can ask for after the first start: each rung of the ladder once, and each of
    RETUNES once on each rung. The passes that run the remedies (roles/sglang_service/tasks/start.yml, one each,
    each including the next while next_step says "start") end within this many: next_step answers "restore" first
    (tests/unit/test_rollback.py)."""
    return len(ladder) * (1 + len(RETUNES)) - 1


def next_step(
    ladder: Sequence[str],
    attempts: Sequence[Mapping[str, Any]],
    catalog: Mapping[str, Any],
    profile_flags: Mapping[str, Any] | None = None,
    gpu_memory_mib: float | None = None,
    *,
    release: str,
) -> dict[str, Any]:
    """``{"action": "done"|"start"|"restore", "attempt": {...}, "reason": sentence}``.

    ``attempts`` are in order, each an attempt with its ``outcome`` (``state``, ``phase``, ``cause``).
    ``profile_flags`` are the current attempt's effective flags (profile flags with tuning), used to
    retune from the value actually run. ``gpu_memory_mib`` is nvidia-smi's memory.total of the host's
    GPUs, which the KV-pool retune is sized from; without it that retune is skipped. ``release`` is the SGLang
    release that runs, whose reserve the retune keeps (planner.reserved_memory_mib).
    """
    if not ladder:
        raise RollbackError("The fallback ladder is empty: the requested profile must be its first rung.")
    if not attempts:
        raise RollbackError("No attempt was made yet; start the requested profile first.")
    last = attempts[-1]
    outcome = last.get("outcome") or {}
    current = attempt_only(last)  # a retry of the same layout starts without the failed start's outcome
    state = outcome.get("state")
    phase = outcome.get("phase")
    flags = {**(profile_flags or {}), **(current.get("tuning") or {})}
    name = current.get("profile")
    if state == "ready":
        return {"action": "done", "reason": f"{name} serves."}
    try:
        layout = planner.Layout.from_flags(flags)
    except (TypeError, ValueError):
        layout = None
    if state == "oom" and phase == "kv_cache" and not _retuned(attempts, current, "retune_kv"):
        step = _kv_retune(current, flags, layout, gpu_memory_mib, release)
        if step is not None:
            return step
    if state == "oom" and phase == "cuda_graph" and not _retuned(attempts, current, "retune_cuda_graph"):
        return _halved(current, flags, "cuda_graph_max_bs", CUDA_GRAPH_BS_START, "retune_cuda_graph",
                       f"{name} ran out of memory capturing CUDA graphs")
    if state == "oom" and phase == "runtime" and not _retuned(attempts, current, "retune_runtime") \
            and "max_running_requests" not in (current.get("tuning") or {}):
        return _halved(current, flags, "max_running_requests", MAX_RUNNING_START, "retune_runtime",
                       f"{name} ran out of memory while serving")
    if state == "hung" and current.get("nccl_set") != SHM_NCCL_SET and not _retuned(attempts, current, "nccl_shm"):
        attempt, also = _p2p_off(current, layout)
        return {"action": "start",
                "attempt": {**attempt, "remedy": "nccl_shm"},
                "reason": f"{name} hung in {phase or 'start-up'}; retrying it once with NCCL P2P off "
                          f"({SHM_NCCL_SET}){also}."}
    if state in ("oom", "hung"):
        what = f"{name} {'ran out of memory' if state == 'oom' else 'hung'}" + (f" ({phase})" if phase else "")
        return _down_the_ladder(ladder, attempts, catalog, what)
    cause = outcome.get("cause") or state or "an unknown failure"
    if state == "wrong_output":
        return {"action": "restore",
                "reason": f"{name} started but answers wrongly (check {cause} failed), which no retune of the "
                          "layout is known to fix; restoring the last unit that served."}
    if state == "slower_release":
        return {"action": "restore",
                "reason": f"{outcome.get('advice') or cause} The last unit that served names its release's "
                          "virtualenv, which stays installed: the switch back needs no pip."}
    if cause == "gpu_unavailable":
        return {"action": "restore",
                "reason": f"{name} could not use the host's GPUs (gpu_unavailable), which no layout or retune fixes; "
                          "restoring the last unit that served, which needs the GPUs too: once the host is fixed "
                          "(the advice says how), restart sglang.service or run the deploy again."}
    return {"action": "restore",
            "reason": f"{name} failed to start ({cause}), which another layout would not fix; "
                      "restoring the last unit that served."}


def _p2p_off(current: Mapping[str, Any], layout: Any) -> tuple[dict[str, Any], str]:
    """The attempt with NCCL P2P off (the pcie_shm set), plus --disable-custom-all-reduce where SGLang's custom
    all-reduce would still use P2P (a TP or MoE group of two GPUs); and the words saying the latter, or ""."""
    pairs = planner.custom_all_reduce_pairs(layout) if layout is not None else []
    tuning = dict(current.get("tuning") or {})
    also = ""
    if pairs:
        tuning["disable_custom_all_reduce"] = True
        also = (f" and --disable-custom-all-reduce (SGLang's custom all-reduce uses P2P in {' and '.join(pairs)} "
                "of two GPUs whatever NCCL is told)")
    return {**current, "nccl_set": SHM_NCCL_SET, "tuning": tuning}, also


def uses_p2p(nccl_env: Mapping[str, Any] | None) -> bool:
    """Whether an NCCL set's environment lets NCCL use PCIe peer-to-peer (anything but NCCL_P2P_DISABLE set)."""
    return str((nccl_env or {}).get("NCCL_P2P_DISABLE", "")).strip() in ("", "0")


def p2p_preflight_step(
    result: Mapping[str, Any],
    attempt: Mapping[str, Any],
    pinned: bool,
    profile_flags: Mapping[str, Any] | None,
    host: str,
) -> dict[str, Any]:
    """What the deploy does with the P2P preflight's verdict (plugins/modules/p2p_preflight.py) before the model load:
    ``{"action": "keep"|"switch"|"stop", "attempt": the attempt to start, "message": sentences, "warn": bool,
    "record": what the host's facts keep}``.

    - ``pcie_p2p``: keep the attempt (its set uses P2P).
    - ``pcie_shm``: start the attempt with the pcie_shm set (and --disable-custom-all-reduce where the custom
      all-reduce would use P2P), unless the operator pinned the set (``pinned``: sglang_service_nccl_set is set):
      then keep it, and the record and the message name the contradiction.
    - ``stuck``: start nothing (the GPUs a hang left stuck need a reboot: remediation).
    - ``unknown`` (or anything else): keep the attempt, with a warning.
    ``profile_flags`` are the attempt's profile flags (the custom all-reduce's groups are read from them)."""
    verdict = str(result.get("verdict") or "unknown")
    asked = str(attempt.get("nccl_set"))
    reason = str(result.get("reason") or "the preflight gave no reason").strip()
    said = reason.rstrip(".")  # inside the sentences below
    fix = str(result.get("fix") or "").strip()
    bandwidths = dict(result.get("bandwidths") or {})
    p2p_bw, shm_bw = bandwidths.get("p2p_busbw_gbps"), bandwidths.get("shm_busbw_gbps")
    when = result.get("decided_at")
    cached = bool(result.get("cached"))
    figures = [f"{bw:g} GB/s {label}" for bw, label in ((p2p_bw, "with P2P"), (shm_bw, "without P2P"))
               if isinstance(bw, (int, float))]
    measured = f"all-reduce bus bandwidth {'; '.join(figures)}" if figures else ""
    source = f" (the verdict of {when}, cached for this boot, hardware and state)" if cached else ""
    fix_words = f" Fix: {fix.rstrip('.')}." if fix else ""
    action, served, contradiction, warn = "keep", attempt, None, False
    if verdict == "pcie_p2p":
        message = (f"{host}: P2P preflight: pcie_p2p{source}: {said}" + (f" ({measured})" if measured else "")
                   + f". Serving with {asked}.")
    elif verdict == "pcie_shm" and pinned:
        warn = True
        contradiction = (f"sglang_service_nccl_set pins {asked}, which uses P2P, but the P2P preflight says pcie_shm: "
                         f"{said}")
        message = (f"WARNING {host}: {contradiction}{source}.{fix_words} Kept {asked} because it is pinned: unset "
                   "sglang_service_nccl_set to serve with pcie_shm, or fix the host; a P2P hang during the load is "
                   "rolled back to pcie_shm then.")
    elif verdict == "pcie_shm":
        layout = None
        with contextlib.suppress(TypeError, ValueError):
            layout = planner.Layout.from_flags({**(profile_flags or {}), **(attempt.get("tuning") or {})})
        served, also = _p2p_off(attempt, layout)
        action, warn = "switch", True
        found = f" ({measured})" if measured else ""
        message = (f"WARNING {host}: P2P preflight: pcie_shm{source}: {said}{found}"
                   + f". Serving with {SHM_NCCL_SET} (NCCL P2P off){also} instead of {asked}, before any weights "
                     f"load.{fix_words} Once fixed, deploy with -e sglang_service_retry=true to prove P2P again.")
    elif verdict == "stuck":
        action, warn = "stop", True
        message = (f"{host}: P2P preflight: the GPUs are stuck{source}: {said}.{fix_words} Nothing was loaded: the "
                   "host keeps its last good unit, and only a reboot frees the GPUs: run moefleet remediate (it "
                   "reboots the host, checks its GPUs and starts the last unit that served). After the reboot the "
                   f"preflight remembers the hang and serves {SHM_NCCL_SET} until the state changes.")
    else:
        warn = True
        missing = "; ".join(str(m) for m in result.get("missing") or [])
        message = (f"WARNING {host}: P2P preflight could not decide ({verdict}): {said}."
                   + (f" Missing: {missing}." if missing else "") + f" Keeping {asked}.{fix_words}")
    record = {
        "verdict": verdict,
        "reason": reason,
        "fix": fix,
        "bandwidths": {"p2p_busbw_gbps": p2p_bw, "shm_busbw_gbps": shm_bw},
        "cached": cached,
        "when": when,
        "rules": list(result.get("rules") or []),
        "asked_nccl_set": asked,
        "nccl_set": None if action == "stop" else served.get("nccl_set"),
        "pinned": bool(pinned),
        "contradiction": contradiction,
    }
    return {"action": action, "attempt": dict(served), "message": message, "warn": warn, "record": record}


def _kv_retune(current: Mapping[str, Any], flags: Mapping[str, Any], layout: Any,
               gpu_memory_mib: float | None, release: str) -> dict[str, Any] | None:
    """The retune after a KV-pool OOM: the same layout at the largest --mem-fraction-static that keeps
    SGLang's reserve for activations and CUDA graphs (planner.max_mem_fraction_static). The rollback does not
    read the model, so it counts the reserve for piecewise CUDA graphs wherever the layout allows them.
    None when that is no higher than what ran, or when it cannot be sized."""
    if layout is None or not gpu_memory_mib:
        return None
    ceiling = planner.max_mem_fraction_static(float(gpu_memory_mib), layout, multimodal=False, release=release)
    ran = flags.get("mem_fraction_static")
    default = planner.default_mem_fraction_static(float(gpu_memory_mib), layout, None, release)
    if ceiling <= float(ran if ran is not None else default):
        return None
    name = current.get("profile")
    tuning = {**(current.get("tuning") or {}), "mem_fraction_static": ceiling}
    return {"action": "start", "attempt": {**current, "tuning": tuning, "remedy": "retune_kv"},
            "reason": f"{name} ran out of memory sizing the KV pool; retrying it once with "
                      f"--mem-fraction-static {ceiling}, the most that keeps SGLang's reserve for activations "
                      "and CUDA graphs on these GPUs."}


def summarize(requested: str, attempts: Sequence[Mapping[str, Any]], restored: str | None = None) -> dict[str, Any]:
    """The host's end state after the attempts (and a restore, naming the restored unit's profile).

    ``outcome``: ``ready`` (the asked profile serves, possibly retuned), ``degraded`` (a fallback
    serves), ``restored`` (nothing new served; the last unit that served runs again) or ``failed``.
    """
    served = next((a for a in reversed(attempts) if (a.get("outcome") or {}).get("state") == "ready"), None)
    if served is not None:
        serving, result = served.get("profile"), ("ready" if served.get("profile") == requested else "degraded")
    elif restored:
        serving, result = restored, "restored"
    else:
        serving, result = None, "failed"
    return {
        "asked_profile": requested,
        "serving_profile": serving,
        "outcome": result,
        "ooms": sum(1 for a in attempts if (a.get("outcome") or {}).get("state") == "oom"),
        "attempts": len(attempts),
    }


_ATTEMPT_KEYS = ("profile", "tuning", "nccl_set")


def attempt_only(attempt: Mapping[str, Any]) -> dict[str, Any]:
    """What a unit runs (profile, tuning, NCCL set), without this run's outcome and bookkeeping."""
    return {key: attempt.get(key) for key in _ATTEMPT_KEYS}


def history_entries(attempts: Sequence[Mapping[str, Any]], now: str) -> list[dict[str, Any]]:
    """One history record per attempt: time, profile, tuning, NCCL set, outcome, phase, cause."""
    entries = []
    for attempt in attempts:
        outcome = attempt.get("outcome") or {}
        entries.append({"time": attempt.get("time") or now, **attempt_only(attempt),
                        "outcome": outcome.get("state"), "phase": outcome.get("phase"), "cause": outcome.get("cause")})
    return entries
