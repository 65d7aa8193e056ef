"""An upgrade's judgement (plugins/module_utils/release_compare.py): the new release is slower only when a figure is
worse by more than the tolerance plus the run-to-run noise measured on each side; a side with failed requests is
not judged; the rollback restores the old release's unit on a slower one."""

from __future__ import annotations

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import release_compare, rollback


def side(release: str, *runs: tuple[float, float]) -> dict:
    """A measurement: each run's (output tok/s, median TTFT ms)."""
    return {"release": release, "measured": True,
            "runs": [{"requests": 16, "failed": 0, "wall_s": 10.0, "output_tok_s": tput, "ttft_ms": ttft}
                     for tput, ttft in runs]}


def test_a_release_20_percent_slower_is_slower_naming_both_releases_and_figures():
    found = release_compare.compare(side("0.5.10", (800, 100), (808, 101)), side("0.5.23", (667, 120), (665, 121)),
                                    0.1, "gpu-1")
    assert found["verdict"] == "slower", found
    # each side's best run: the highest throughput, the lowest time to first token
    assert found["reason"].startswith("SGLang 0.5.23 is slower than 0.5.10 on gpu-1: output throughput 808.0 -> "
                                      "667.0 tok/s (-17%), time to first token 100.0 -> 120.0 ms (+20%)")
    assert found["reason"].endswith("switching back to 0.5.10.")
    assert found["metrics"]["output_tok_s"]["noise"] == pytest.approx(0.00995, abs=1e-4)


def test_the_same_speed_with_noise_is_not_slower():
    found = release_compare.compare(side("0.5.10", (800, 100), (760, 104)), side("0.5.23", (770, 102), (790, 99)),
                                    0.1, "gpu-1")
    assert found["verdict"] == "not_slower", found
    assert "is not slower than 0.5.10 on gpu-1" in found["reason"]


def test_noise_raises_the_bar():
    """15 % worse: slower on a quiet host, within the noise on a host whose runs spread 10 %."""
    quiet = release_compare.compare(side("a", (1000, 100), (1000, 100)), side("b", (850, 100), (850, 100)), 0.1)
    noisy = release_compare.compare(side("a", (1000, 100), (900, 100)), side("b", (808, 100), (807, 100)), 0.1)
    assert (quiet["verdict"], noisy["verdict"]) == ("slower", "not_slower"), (quiet, noisy)
    assert noisy["metrics"]["output_tok_s"]["threshold"] == pytest.approx(0.2, abs=0.01)


def test_a_faster_release_is_not_slower():
    found = release_compare.compare(side("0.5.10", (800, 100), (800, 100)), side("0.5.23", (960, 80), (962, 81)), 0.1)
    assert found["verdict"] == "not_slower" and found["metrics"]["output_tok_s"]["change"] > 0.19


@pytest.mark.parametrize("broken", ["before", "after"])
def test_a_side_with_failed_requests_is_not_judged(broken):
    good = side("0.5.10", (800, 100), (800, 100))
    bad = side("0.5.23", (400, 100), (400, 100))
    bad["runs"][1].update(failed=3, error="HTTP 503")
    before, after = (bad, good) if broken == "before" else (good, bad)
    found = release_compare.compare(before, after, 0.1, "gpu-1")
    assert found["verdict"] == "unmeasured"
    assert f"The {broken} side" in found["reason"] and "3 of 16 requests failed (HTTP 503)" in found["reason"]


def test_the_rollback_restores_the_old_release_on_a_slower_one():
    reason = "SGLang 0.5.23 is slower than 0.5.10 on gpu-1: output throughput 800 -> 650 tok/s (-19%); switching back."
    attempts = [{"profile": "tp8", "tuning": {}, "nccl_set": "pcie_p2p",
                 "outcome": {"state": "slower_release", "phase": "serving", "cause": "release_slower",
                             "advice": reason}}]
    step = rollback.next_step(["tp8", "tp4pp2"], attempts, {"profiles": {}}, {"tp_size": 8}, release="0.5.23")
    assert step["action"] == "restore", step
    assert step["reason"].startswith(reason) and "needs no pip" in step["reason"]


def test_the_same_prompts_every_run():
    assert release_compare.prompt_ids(3, 5) == release_compare.prompt_ids(3, 5)
    assert release_compare.prompt_ids(3, 5, seed=1) != release_compare.prompt_ids(3, 5)
    assert [len(p) for p in release_compare.prompt_ids(3, 5)] == [5, 5, 5]


def test_a_run_that_something_else_slowed_does_not_make_a_release_slower():
    """The healthy host most like a slower release: one run on each side disturbed by other work (a backup, another
    benchmark). The best runs agree: not slower, and the disturbed runs do not count as noise either."""
    before = side("0.5.10", (800, 100), (500, 300), (795, 101))
    after = side("0.5.23", (790, 102), (798, 100), (600, 200))
    found = release_compare.compare(before, after, 0.1, "gpu-1")
    assert found["verdict"] == "not_slower", found
    assert found["metrics"]["output_tok_s"]["noise"] < 0.02 and found["metrics"]["ttft_ms"]["noise"] < 0.03, found
