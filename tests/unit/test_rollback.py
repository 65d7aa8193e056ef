"""The rollback logic: each cause of a failed start gets its remedy, and the end state is summarized.

Ladders come from the shipped catalog (profiles/catalog.yml) through the same fallback_ladder the role
uses, so a change of the shipped ladders shows up here too.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import rollback
from ansible_collections.moefleet.serving.plugins.module_utils.profiles import fallback_ladder
from ansible_collections.moefleet.serving.plugins.module_utils.rollback import (
    CUDA_GRAPH_BS_START,
    MAX_RUNNING_START,
    SHM_NCCL_SET,
    RollbackError,
    attempt_only,
    first_attempt,
    history_entries,
    max_remedies,
    opening_attempt,
    summarize,
)

ROOT = Path(__file__).resolve().parents[2]
# The rules as SGLang 0.5.10 (the release the roles pin) sizes the KV-pool retune; a test about another release says so.
RELEASE = "0.5.10"


def next_step(*args, release: str = RELEASE):
    return rollback.next_step(*args, release=release)

CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())

OOM_WEIGHTS = {"state": "oom", "phase": "weight_load", "cause": None}
OOM_KV = {"state": "oom", "phase": "kv_cache", "cause": None}
OOM_GRAPH = {"state": "oom", "phase": "cuda_graph", "cause": None}
OOM_RUNTIME = {"state": "oom", "phase": "runtime", "cause": None}
HUNG = {"state": "hung", "phase": "nccl_init", "cause": None}
# nvidia-smi's memory.total of an RTX PRO 6000 Blackwell.
SMI_MIB = 97887
# SGLang's reserve at TP8 on it (server_args._handle_gpu_memory_settings): 512 + 8192 x 1.5 + 512 x 2
# + 1024, plus 1.5 GiB for piecewise CUDA graphs, which the rollback assumes (it does not read the model).
TP8_CEILING = round((SMI_MIB - (512 + 8192 * 1.5 + 512 * 2 + 1024 + 1536)) / SMI_MIB, 3)
READY = {"state": "ready", "phase": None, "cause": None}


def ladder(name: str) -> list[str]:
    return fallback_ladder(CATALOG, name)


def failed(attempt: dict, outcome: dict) -> dict:
    return {**attempt, "outcome": outcome}


def start(profile: str) -> dict:
    return first_attempt(profile, CATALOG["profiles"][profile]["nccl"])


def test_shipped_ladders_used_below():
    assert ladder("tp4ep2") == ["tp4ep2", "tp2ep4", "ep8"]
    assert ladder("ep8dpa") == ["ep8dpa", "ep8"]
    assert ladder("ep8") == ["ep8"]


# ---------------------------------------------------------------------------------------------------
# next_step: the remedy follows the cause
# ---------------------------------------------------------------------------------------------------


def test_ready_is_done():
    step = next_step(ladder("tp2ep4"), [failed(start("tp2ep4"), READY)], CATALOG)
    assert step["action"] == "done"
    assert "attempt" not in step
    assert step["reason"] == "tp2ep4 serves."


def test_weight_load_oom_goes_to_the_next_rung_at_once():
    step = next_step(ladder("tp4ep2"), [failed(start("tp4ep2"), OOM_WEIGHTS)], CATALOG)
    assert step["action"] == "start"
    assert step["attempt"] == {"profile": "tp2ep4", "tuning": {}, "nccl_set": "pcie_p2p", "remedy": "fallback"}
    assert step["reason"] == "tp4ep2 ran out of memory (weight_load); falling back to tp2ep4."


def test_runtime_oom_halves_the_running_requests_once_then_falls_back():
    first = failed(start("tp4ep2"), OOM_RUNTIME)
    step = next_step(ladder("tp4ep2"), [first], CATALOG, {"tp_size": 8, "max_running_requests": 512})
    assert step["action"] == "start"
    assert step["attempt"] == {"profile": "tp4ep2", "tuning": {"max_running_requests": 256}, "nccl_set": "pcie_p2p",
                               "remedy": "retune_runtime"}
    assert step["reason"] == "tp4ep2 ran out of memory while serving; retrying it once with --max-running-requests 256."
    again = next_step(ladder("tp4ep2"), [first, failed(step["attempt"], OOM_RUNTIME)], CATALOG)
    assert again["attempt"]["profile"] == "tp2ep4" and again["attempt"]["remedy"] == "fallback"


def test_runtime_oom_of_an_attempt_kept_from_an_earlier_run_falls_back_once_retuned():
    # a later deploy sees only the kept attempt (without its remedy), its tuning says it was retuned already
    kept = {"profile": "tp4ep2", "tuning": {"max_running_requests": 64}, "nccl_set": "pcie_p2p"}
    step = next_step(ladder("tp4ep2"), [failed(kept, OOM_RUNTIME)], CATALOG)
    assert step["attempt"]["profile"] == "tp2ep4"
    assert step["reason"] == "tp4ep2 ran out of memory (runtime); falling back to tp2ep4."


def test_runtime_oom_without_a_running_limit_starts_from_the_default_start():
    step = next_step(ladder("tp8"), [failed(start("tp8"), OOM_RUNTIME)], CATALOG, {"tp_size": 8})
    assert step["attempt"]["tuning"] == {"max_running_requests": MAX_RUNNING_START} == {"max_running_requests": 128}


def test_weight_load_oom_is_not_retuned_with_a_higher_mem_fraction():
    step = next_step(ladder("tp4ep2"), [failed(start("tp4ep2"), OOM_WEIGHTS)], CATALOG, {"tp_size": 8})
    assert "mem_fraction_static" not in step["attempt"]["tuning"]
    assert step["attempt"]["profile"] != "tp4ep2"


def test_kv_oom_retunes_once_to_the_planners_ceiling():
    flags = CATALOG["profiles"]["tp2ep4"]["flags"]  # mem_fraction_static 0.79
    step = next_step(ladder("tp2ep4"), [failed(start("tp2ep4"), OOM_KV)], CATALOG, flags, SMI_MIB)
    assert TP8_CEILING == 0.833
    assert step["action"] == "start"
    assert step["attempt"]["profile"] == "tp2ep4"
    assert step["attempt"]["tuning"] == {"mem_fraction_static": TP8_CEILING}
    assert step["attempt"]["remedy"] == "retune_kv"
    assert step["attempt"]["nccl_set"] == "pcie_p2p"
    assert f"--mem-fraction-static {TP8_CEILING}" in step["reason"]


def test_kv_oom_retune_follows_the_gpu_size_not_a_fixed_step():
    flags = {"tp_size": 8, "ep_size": 4, "mem_fraction_static": 0.79}
    small = next_step(ladder("tp2ep4"), [failed(start("tp2ep4"), OOM_KV)], CATALOG, flags, 81559)  # H100 80 GB
    big = next_step(ladder("tp2ep4"), [failed(start("tp2ep4"), OOM_KV)], CATALOG, flags, 143771)  # H200
    # The same 16 GiB reserve is a larger share of a smaller GPU.
    assert small["attempt"]["tuning"]["mem_fraction_static"] == round((81559 - 16384) / 81559, 3) == 0.799
    assert big["attempt"]["tuning"]["mem_fraction_static"] == round((143771 - 16384) / 143771, 3) == 0.886


def test_kv_oom_at_or_above_the_ceiling_goes_down_the_ladder():
    flags = CATALOG["profiles"]["ep8dpa"]["flags"]  # mem_fraction_static 0.92, above what keeps the reserve
    step = next_step(ladder("ep8dpa"), [failed(start("ep8dpa"), OOM_KV)], CATALOG, flags, SMI_MIB)
    assert step["action"] == "start"
    assert step["attempt"]["profile"] == "ep8" and step["attempt"]["remedy"] == "fallback"


def test_kv_oom_without_the_gpu_memory_goes_down_the_ladder():
    flags = CATALOG["profiles"]["tp2ep4"]["flags"]
    step = next_step(ladder("tp2ep4"), [failed(start("tp2ep4"), OOM_KV)], CATALOG, flags)
    assert step["attempt"]["profile"] == "ep8" and step["attempt"]["remedy"] == "fallback"


def test_kv_oom_after_the_retune_goes_to_the_next_rung():
    first = failed(start("tp2ep4"), OOM_KV)
    flags = CATALOG["profiles"]["tp2ep4"]["flags"]
    retuned = next_step(ladder("tp2ep4"), [first], CATALOG, flags, SMI_MIB)["attempt"]
    step = next_step(ladder("tp2ep4"), [first, failed(retuned, OOM_KV)], CATALOG, flags, SMI_MIB)
    assert step["action"] == "start"
    assert step["attempt"] == {"profile": "ep8", "tuning": {}, "nccl_set": "pcie_p2p", "remedy": "fallback"}
    assert step["reason"] == "tp2ep4 ran out of memory (kv_cache); falling back to ep8."


def test_kv_retune_uses_the_tuning_the_attempt_ran_with():
    # The attempt already ran at the ceiling (its tuning wins over the profile's 0.7): nothing left to raise.
    current = {**start("tp2ep4"), "tuning": {"mem_fraction_static": TP8_CEILING}, "outcome": OOM_KV}
    step = next_step(ladder("tp2ep4"), [current], CATALOG, {"tp_size": 8, "mem_fraction_static": 0.7}, SMI_MIB)
    assert step["attempt"]["remedy"] == "fallback"


def test_cuda_graph_oom_halves_the_profiles_batch_once():
    flags = CATALOG["profiles"]["ep8dpa"]["flags"]  # cuda_graph_max_bs 64
    step = next_step(ladder("ep8dpa"), [failed(start("ep8dpa"), OOM_GRAPH)], CATALOG, flags)
    assert step["action"] == "start"
    assert step["attempt"]["profile"] == "ep8dpa"
    assert step["attempt"]["tuning"] == {"cuda_graph_max_bs": 32}
    assert step["attempt"]["remedy"] == "retune_cuda_graph"
    assert "--cuda-graph-max-bs 32" in step["reason"]


def test_cuda_graph_oom_without_a_profile_batch_starts_from_the_default_start():
    step = next_step(ladder("tp8"), [failed(start("tp8"), OOM_GRAPH)], CATALOG, {"tp_size": 8})
    assert step["attempt"]["tuning"] == {"cuda_graph_max_bs": CUDA_GRAPH_BS_START} == {"cuda_graph_max_bs": 64}


def test_cuda_graph_oom_after_the_retune_goes_to_the_next_rung():
    first = failed(start("ep8dpa"), OOM_GRAPH)
    retuned = next_step(ladder("ep8dpa"), [first], CATALOG, CATALOG["profiles"]["ep8dpa"]["flags"])["attempt"]
    step = next_step(ladder("ep8dpa"), [first, failed(retuned, OOM_GRAPH)], CATALOG)
    assert step["action"] == "start"
    assert step["attempt"]["profile"] == "ep8" and step["attempt"]["remedy"] == "fallback"
    assert step["attempt"]["tuning"] == {}


def test_a_kv_retune_does_not_use_up_the_cuda_graph_retune():
    first = failed(start("tp2ep4"), OOM_KV)
    retuned = next_step(ladder("tp2ep4"), [first], CATALOG, CATALOG["profiles"]["tp2ep4"]["flags"], SMI_MIB)["attempt"]
    step = next_step(ladder("tp2ep4"), [first, failed(retuned, OOM_GRAPH)], CATALOG)
    assert step["attempt"]["profile"] == "tp2ep4"
    assert step["attempt"]["remedy"] == "retune_cuda_graph"
    # the earlier tuning is kept alongside the new one
    assert step["attempt"]["tuning"] == {"mem_fraction_static": TP8_CEILING, "cuda_graph_max_bs": 64}


def test_hang_retries_once_with_the_shm_nccl_set():
    step = next_step(ladder("tp8"), [failed(start("tp8"), HUNG)], CATALOG, CATALOG["profiles"]["tp8"]["flags"])
    assert step["action"] == "start"
    assert attempt_only(step["attempt"]) == {"profile": "tp8", "tuning": {}, "nccl_set": SHM_NCCL_SET}
    assert step["attempt"]["remedy"] == "nccl_shm"
    assert SHM_NCCL_SET == "pcie_shm"
    assert step["reason"] == "tp8 hung in nccl_init; retrying it once with NCCL P2P off (pcie_shm)."


@pytest.mark.parametrize(
    ("profile", "groups"),
    [("tp2ep4", "the MoE TP group"), ("tp4ep2", "the MoE EP group"), ("tp2pp4", "the TP group")],
)
def test_hang_remedy_also_disables_custom_all_reduce_where_a_group_has_two_gpus(profile, groups):
    # SGLang's custom all-reduce stays on P2P for groups of two PCIe GPUs (custom_all_reduce_utils.py).
    flags = CATALOG["profiles"][profile]["flags"]
    step = next_step(ladder(profile), [failed(start(profile), HUNG)], CATALOG, flags)
    assert step["attempt"]["nccl_set"] == SHM_NCCL_SET
    assert step["attempt"]["tuning"] == {"disable_custom_all_reduce": True}
    assert "--disable-custom-all-reduce" in step["reason"] and groups in step["reason"]


@pytest.mark.parametrize("profile", ["tp8", "ep8", "pp8", "tp4pp2", "ep8dpa"])
def test_hang_remedy_leaves_custom_all_reduce_where_sglang_already_disables_it(profile):
    flags = CATALOG["profiles"][profile]["flags"]
    step = next_step(ladder(profile), [failed(start(profile), HUNG)], CATALOG, flags)
    assert "disable_custom_all_reduce" not in step["attempt"]["tuning"]


def test_hang_again_with_shm_goes_to_the_next_rung_with_its_own_nccl_set():
    first = failed(start("tp2ep4"), HUNG)
    shm = next_step(ladder("tp2ep4"), [first], CATALOG)["attempt"]
    step = next_step(ladder("tp2ep4"), [first, failed(shm, HUNG)], CATALOG)
    assert step["action"] == "start"
    assert step["attempt"] == {"profile": "ep8", "tuning": {}, "nccl_set": "pcie_p2p", "remedy": "fallback"}
    assert step["reason"] == "tp2ep4 hung (nccl_init); falling back to ep8."


def test_hang_on_a_profile_already_on_shm_goes_down_at_once():
    current = failed(first_attempt("tp2ep4", SHM_NCCL_SET), HUNG)
    step = next_step(ladder("tp2ep4"), [current], CATALOG)
    assert step["attempt"]["profile"] == "ep8"


@pytest.mark.parametrize(
    "cause", ["nccl", "port_in_use", "bad_weights", "unsupported_arch", "driver", "gpu_fault", "other"]
)
def test_any_other_crash_restores_without_the_ladder(cause):
    outcome = {"state": "crashed", "phase": "nccl_init", "cause": cause}
    step = next_step(ladder("tp4ep2"), [failed(start("tp4ep2"), outcome)], CATALOG)
    assert step["action"] == "restore"
    assert "attempt" not in step
    assert step["reason"] == (
        f"tp4ep2 failed to start ({cause}), which another layout would not fix; restoring the last unit that served."
    )


@pytest.mark.parametrize("check", ["thinking", "tool_call", "known_answer"])
def test_wrong_answers_restore_the_last_unit_without_the_ladder_naming_the_check(check):
    outcome = {"state": "wrong_output", "phase": "serving", "cause": check}
    step = next_step(ladder("tp4ep2"), [failed(start("tp4ep2"), outcome)], CATALOG)
    assert step["action"] == "restore" and "attempt" not in step
    assert step["reason"] == (f"tp4ep2 started but answers wrongly (check {check} failed), which no retune of the "
                              "layout is known to fix; restoring the last unit that served.")
    assert summarize("tp4ep2", [failed(start("tp4ep2"), outcome)], restored="tp8")["outcome"] == "restored"


@pytest.mark.parametrize("phase", ["launch", "nccl_init", "weight_load"])
def test_gpus_unavailable_restore_without_fallback_or_retune_and_say_the_restore_needs_the_gpus(phase):
    """A host whose GPUs CUDA cannot open: no smaller layout starts there, and the restore fails the same way
    until the host is fixed; the reason says so instead of reading like a layout problem."""
    outcome = {"state": "crashed", "phase": phase, "cause": "gpu_unavailable"}
    for first in ("tp4ep2", "ep8"):
        step = next_step(ladder(first), [failed(start(first), outcome)], CATALOG, CATALOG["profiles"][first]["flags"],
                         SMI_MIB)
        assert step["action"] == "restore"
        assert "attempt" not in step
        assert step["reason"] == (
            f"{first} could not use the host's GPUs (gpu_unavailable), which no layout or retune fixes; restoring the "
            "last unit that served, which needs the GPUs too: once the host is fixed (the advice says how), restart "
            "sglang.service or run the deploy again."
        )


def test_gpus_unavailable_after_a_fallback_restores_rather_than_going_further():
    attempts = [
        failed(start("tp4ep2"), OOM_WEIGHTS),
        failed({**start("tp2ep4"), "remedy": "fallback"}, {"state": "crashed", "cause": "gpu_unavailable"}),
    ]
    assert next_step(ladder("tp4ep2"), attempts, CATALOG)["action"] == "restore"


@pytest.mark.parametrize("state", ["mismatch", "starting"])
def test_other_failed_states_restore_too(state):
    step = next_step(ladder("tp2ep4"), [failed(start("tp2ep4"), {"state": state})], CATALOG)
    assert step["action"] == "restore"
    assert f"({state})" in step["reason"]


def test_a_crash_after_a_fallback_restores_rather_than_going_further():
    attempts = [
        failed(start("tp4ep2"), OOM_WEIGHTS),
        failed({**start("tp2ep4"), "remedy": "fallback"}, {"state": "crashed", "cause": "nccl"}),
    ]
    assert next_step(ladder("tp4ep2"), attempts, CATALOG)["action"] == "restore"


def test_the_whole_ladder_walked_by_weight_load_ooms_ends_in_restore():
    rungs = ladder("tp4ep2")
    attempts = [failed(start("tp4ep2"), OOM_WEIGHTS)]
    walked = ["tp4ep2"]
    while True:
        step = next_step(rungs, attempts, CATALOG)
        if step["action"] != "start":
            break
        walked.append(step["attempt"]["profile"])
        attempts.append(failed(step["attempt"], OOM_WEIGHTS))
    assert walked == ["tp4ep2", "tp2ep4", "ep8"]
    assert step["action"] == "restore"
    assert step["reason"] == (
        "ep8 ran out of memory (weight_load), and the fallback ladder (tp4ep2 -> tp2ep4 -> ep8) is exhausted; "
        "restoring the last unit that served."
    )


def test_last_rung_kv_oom_retunes_then_restores():
    attempts = [failed(start("ep8"), OOM_KV)]
    step = next_step(["ep8"], attempts, CATALOG, CATALOG["profiles"]["ep8"]["flags"], SMI_MIB)
    assert step["action"] == "start" and step["attempt"]["remedy"] == "retune_kv"
    attempts.append(failed(step["attempt"], OOM_KV))
    assert next_step(["ep8"], attempts, CATALOG)["action"] == "restore"


def test_empty_ladder_or_no_attempt_is_an_error():
    with pytest.raises(RollbackError, match="ladder is empty"):
        next_step([], [failed(start("tp8"), READY)], CATALOG)
    with pytest.raises(RollbackError, match="No attempt was made"):
        next_step(["tp8"], [], CATALOG)


def test_fallback_to_a_profile_the_catalog_lacks_uses_the_p2p_set():
    step = next_step(["tp8", "custom"], [failed(start("tp8"), OOM_WEIGHTS)], CATALOG)
    assert step["attempt"]["profile"] == "custom" and step["attempt"]["nccl_set"] == "pcie_p2p"


# ---------------------------------------------------------------------------------------------------
# summarize, history_entries, attempt_only
# ---------------------------------------------------------------------------------------------------


def test_summary_ready_when_the_asked_profile_serves_even_retuned():
    attempts = [
        failed(start("tp2ep4"), OOM_KV),
        failed({**start("tp2ep4"), "tuning": {"mem_fraction_static": 0.84}, "remedy": "retune_kv"}, READY),
    ]
    assert summarize("tp2ep4", attempts) == {
        "asked_profile": "tp2ep4",
        "serving_profile": "tp2ep4",
        "outcome": "ready",
        "ooms": 1,
        "attempts": 2,
    }


def test_summary_degraded_when_a_fallback_serves():
    attempts = [
        failed(start("tp4ep2"), OOM_WEIGHTS),
        failed({**start("tp2ep4"), "remedy": "fallback"}, OOM_WEIGHTS),
        failed({**start("ep8"), "remedy": "fallback"}, READY),
    ]
    assert summarize("tp4ep2", attempts) == {
        "asked_profile": "tp4ep2",
        "serving_profile": "ep8",
        "outcome": "degraded",
        "ooms": 2,
        "attempts": 3,
    }


def test_summary_restored_names_the_restored_profile():
    attempts = [failed(start("tp8"), {"state": "crashed", "cause": "nccl"})]
    assert summarize("tp8", attempts, restored="tp2ep4") == {
        "asked_profile": "tp8",
        "serving_profile": "tp2ep4",
        "outcome": "restored",
        "ooms": 0,
        "attempts": 1,
    }


def test_summary_failed_when_nothing_serves_and_nothing_was_restored():
    attempts = [failed(start("ep8"), OOM_WEIGHTS)]
    summary = summarize("ep8", attempts)
    assert (summary["outcome"], summary["serving_profile"], summary["ooms"]) == ("failed", None, 1)


def test_summary_prefers_a_served_attempt_over_a_restore():
    attempts = [failed(start("tp4ep2"), OOM_WEIGHTS), failed({**start("tp2ep4"), "remedy": "fallback"}, READY)]
    assert summarize("tp4ep2", attempts, restored="tp8")["outcome"] == "degraded"


def test_summary_counts_only_ooms_not_hangs_or_crashes():
    attempts = [
        failed(start("tp2ep4"), HUNG),
        failed(first_attempt("tp2ep4", SHM_NCCL_SET), OOM_GRAPH),
        failed(start("ep8"), {"state": "crashed", "cause": "nccl"}),
        failed(start("ep8"), {}),
    ]
    assert summarize("tp2ep4", attempts, restored="tp8")["ooms"] == 1


def test_attempt_only_keeps_what_the_unit_runs():
    attempt = {
        "profile": "ep8dpa",
        "tuning": {"cuda_graph_max_bs": 32},
        "nccl_set": "pcie_p2p",
        "remedy": "retune_cuda_graph",
        "outcome": OOM_GRAPH,
        "time": "2026-01-01T00:00:00Z",
    }
    assert attempt_only(attempt) == {"profile": "ep8dpa", "tuning": {"cuda_graph_max_bs": 32}, "nccl_set": "pcie_p2p"}
    assert attempt_only({"profile": "tp8"}) == {"profile": "tp8", "tuning": None, "nccl_set": None}


def test_history_has_one_entry_per_attempt_with_its_own_time_or_now():
    attempts = [
        {**failed(start("tp4ep2"), {"state": "oom", "phase": "weight_load", "cause": None}), "time": "T1"},
        failed({**start("tp2ep4"), "remedy": "fallback"}, READY),
        {"profile": "ep8"},  # no outcome recorded
    ]
    assert history_entries(attempts, now="NOW") == [
        {
            "time": "T1",
            "profile": "tp4ep2",
            "tuning": {},
            "nccl_set": "pcie_p2p",
            "outcome": "oom",
            "phase": "weight_load",
            "cause": None,
        },
        {
            "time": "NOW",
            "profile": "tp2ep4",
            "tuning": {},
            "nccl_set": "pcie_p2p",
            "outcome": "ready",
            "phase": None,
            "cause": None,
        },
        {
            "time": "NOW",
            "profile": "ep8",
            "tuning": None,
            "nccl_set": None,
            "outcome": None,
            "phase": None,
            "cause": None,
        },
    ]
    assert history_entries([], now="NOW") == []


FELL_BACK = {
    "asked_profile": "tp2ep4",
    "asked_fingerprint": "f1",
    "outcome": "degraded",
    "attempt": {"profile": "ep8", "tuning": {}, "nccl_set": "pcie_p2p"},
}


def test_opening_attempt_keeps_the_fallback_for_the_same_ask_and_inputs():
    got = opening_attempt(FELL_BACK, "tp2ep4", "f1", "pcie_p2p", CATALOG)
    assert got == {"attempt": FELL_BACK["attempt"], "kept": True}


@pytest.mark.parametrize(
    ("change", "retry"),
    [
        ({}, True),
        ({"asked_fingerprint": "f0"}, False),
        ({"asked_profile": "tp8"}, False),
        ({"outcome": "failed"}, False),
        ({"attempt": {"profile": "gone", "tuning": {}, "nccl_set": "pcie_p2p"}}, False),
        ({"attempt": None}, False),
    ],
)
def test_opening_attempt_starts_over_when_anything_differs(change, retry):
    previous = {**FELL_BACK, **change}
    got = opening_attempt(previous, "tp2ep4", "f1", "pcie_p2p", CATALOG, retry=retry)
    assert got == {"attempt": start("tp2ep4"), "kept": False}


def test_opening_attempt_on_a_new_host():
    assert opening_attempt({}, "ep8", "f1", "pcie_p2p", CATALOG) == {"attempt": start("ep8"), "kept": False}
    assert opening_attempt(None, "ep8", "f1", "pcie_p2p", CATALOG)["kept"] is False


def _remedies_until_done(ladder: list[str], choose) -> int:
    """Starts next_step asks for after a first start of ladder[0], each start failing as choose(step) says."""
    attempts = [{**first_attempt(ladder[0], CATALOG["profiles"][ladder[0]]["nccl"]), "outcome": choose(0)}]
    starts = 0
    while True:
        current = attempts[-1]
        flags = {**CATALOG["profiles"][current["profile"]]["flags"], **(current.get("tuning") or {})}
        step = next_step(ladder, attempts, CATALOG, flags, SMI_MIB)
        if step["action"] != "start":
            return starts
        starts += 1
        assert starts <= 100, "next_step never ends"
        attempts.append({**step["attempt"], "outcome": choose(starts)})


FAILURES = [OOM_KV, OOM_GRAPH, OOM_RUNTIME, HUNG, OOM_WEIGHTS]


@pytest.mark.parametrize("profile", sorted(CATALOG["profiles"]))
def test_no_failure_sequence_needs_more_remedies_than_the_loop_bound(profile):
    ladder = fallback_ladder(CATALOG, profile)
    rng = random.Random(profile)
    assert _remedies_until_done(ladder, lambda n: FAILURES[n % len(FAILURES)]) <= max_remedies(ladder)
    for _ in range(200):
        assert _remedies_until_done(ladder, lambda _n: rng.choice(FAILURES)) <= max_remedies(ladder)


def test_each_retune_on_each_rung_reaches_the_loop_bound_exactly():
    # tp2ep4's ladder, each layout failing in turn the way that uses each retune once, then OOM while loading:
    # the remedy passes of tasks/start.yml must cover every one of these.
    ladder = fallback_ladder(CATALOG, "tp2ep4")
    assert _remedies_until_done(ladder, lambda n: FAILURES[n % len(FAILURES)]) == max_remedies(ladder)
