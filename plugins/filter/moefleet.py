"""Jinja2 filters over the shared moefleet logic (plugins/module_utils), so playbooks plan, render
profiles and decide rollbacks with the very code the CLI runs: moefleet_plan, moefleet_profile_args,
moefleet_fallback_ladder, moefleet_opening_attempt, moefleet_next_step, moefleet_rollback_summary,
moefleet_history, moefleet_attempt."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# Filter plugins cannot import ansible.module_utils from a playbook-relative path; load the same files
# by bare name from the sibling module_utils directory instead (no copies).
_MODULE_UTILS = str(Path(__file__).resolve().parents[1] / "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)

import planner  # noqa: E402
import rollback  # noqa: E402

import profiles  # noqa: E402


def moefleet_plan(model_config, gpus, gpu_memory_gib, flags, catalog=None):
    """Plan one layout: ``{{ config | moefleet_plan(8, 94.97, profile.flags, catalog) }}`` -> dict."""
    known = (catalog or {}).get("profiles") if isinstance(catalog, dict) else None
    try:
        return planner.plan(model_config, int(gpus), float(gpu_memory_gib), flags, known).to_dict()
    except (planner.PlanError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"moefleet_plan: {exc}") from None


def moefleet_profile_args(profile):
    """A profile's flags as SGLang arguments: ``["--tp-size", "8", "--ep-size", "4"]``."""
    try:
        return profiles.sglang_args(profile)
    except profiles.ProfileError as exc:
        raise AnsibleFilterError(f"moefleet_profile_args: {exc}") from None


def moefleet_fallback_ladder(catalog, name):
    """The profile names from ``name`` down its fallbacks to the end of the ladder."""
    try:
        return profiles.fallback_ladder(catalog, name)
    except profiles.ProfileError as exc:
        raise AnsibleFilterError(f"moefleet_fallback_ladder: {exc}") from None


def moefleet_opening_attempt(previous, profile, fingerprint, nccl_set, catalog, retry=False):
    """The attempt a run starts with: ``{attempt, kept}`` (kept: the host stays on what it recorded last)."""
    return rollback.opening_attempt(previous, profile, fingerprint, nccl_set, catalog, bool(retry))


def moefleet_next_step(attempts, ladder, catalog, flags=None, gpu_memory_mib=None):
    """What to try after the attempts so far: ``{action: done|start|restore, attempt, reason}``;
    ``gpu_memory_mib`` (nvidia-smi's memory.total) sizes the KV-pool retune."""
    try:
        return rollback.next_step(ladder, attempts, catalog, flags, gpu_memory_mib)
    except rollback.RollbackError as exc:
        raise AnsibleFilterError(f"moefleet_next_step: {exc}") from None


def moefleet_rollback_summary(attempts, requested, restored=None):
    """The host's end state: asked and serving profile, outcome (ready/degraded/restored/failed), OOMs."""
    return rollback.summarize(requested, attempts, restored)


def moefleet_history(attempts, now):
    """History records of the attempts (time, profile, tuning, NCCL set, outcome, phase, cause)."""
    return rollback.history_entries(attempts, now)


def moefleet_attempt(attempt):
    """What a unit runs (profile, tuning, NCCL set), without outcome and bookkeeping."""
    return rollback.attempt_only(attempt)


class FilterModule:
    """moefleet filters."""

    def filters(self):
        return {
            "moefleet_plan": moefleet_plan,
            "moefleet_profile_args": moefleet_profile_args,
            "moefleet_fallback_ladder": moefleet_fallback_ladder,
            "moefleet_opening_attempt": moefleet_opening_attempt,
            "moefleet_next_step": moefleet_next_step,
            "moefleet_rollback_summary": moefleet_rollback_summary,
            "moefleet_history": moefleet_history,
            "moefleet_attempt": moefleet_attempt,
        }
