"""An upgrade's benchmark (plugins/module_utils/release_compare.py, the sglang_speed module's measurement) against
the simulator as each release: the same unit environment (a fault list whose "slow" entry names 0.5.23) serves
0.5.10 at full speed and 0.5.23 slower; the judgement finds 0.5.23 slower than 0.5.10, and finds nothing between two
measurements of the same server (the healthy host that looks most like the fault: the same speed measured again,
with its noise).

The figures are wall-clock times of a server on this machine, which the suite's other jobs load: the slow release
here is 1.5 times slower (the fault's default is 1.2, a 20 % regression), so that a disturbed run cannot
hide it, and each side keeps its best of three runs (release_compare's rule), so that a disturbed run cannot make
the same release look slower either. Both judgements use a tolerance of 0.2, as the routed upgrade lab does
(tests/integration/test_router_lab.py's UPGRADE): at the product's 0.1 the same server measured twice, beside
three lab jobs (load average 8 on 2 cores), once came out 20 % slower in time to first token (58.4 -> 69.9 ms, noise
4.6 %; a fresh-clone make test, 2026-12-06), where a millisecond of the machine's scheduling is a tenth of the figure.
No time is asserted, only the judgement.
"""

from __future__ import annotations

from ansible_collections.moefleet.serving.plugins.module_utils import release_compare
from ansible_collections.moefleet.serving.plugins.modules.sglang_speed import server_release

TP8 = ("--tp-size", "8", "--mem-fraction-static", "0.8")
FAULTS = [{"fault": "slow", "factor": 1.5, "release": "0.5.23"}]
# Requests decode at 1/6 of real time: a run of 8 requests of 128 tokens lasts about a second, long beside the HTTP
# overhead, short for the suite.
ENV = {"SGLANG_SIM_SERVE_TIME_SCALE": "10"}
SIZE = {"output_tokens": 128, "concurrency": 4, "timeout": 60}
TOLERANCE = 0.2


def measure(srv, runs: int = 3) -> dict:
    prompts = release_compare.prompt_ids(8, 256)
    return {"release": server_release(srv.url(""), None, 10), "measured": True,
            "runs": [release_compare.run_once(srv.url(""), None, prompts, **SIZE) for _ in range(runs)]}


def test_a_slower_release_is_found_slower_and_the_same_release_is_not(lab):
    old = lab.start(*TP8, faults=FAULTS, env=ENV, release="0.5.10")
    new = lab.start(*TP8, faults=FAULTS, env=ENV, release="0.5.23")
    old.wait_ready()
    new.wait_ready()
    before, after, again = measure(old), measure(new), measure(old)
    assert (before["release"], after["release"]) == ("0.5.10", "0.5.23")
    for run in before["runs"] + after["runs"]:
        assert run["failed"] == 0 and run["requests"] == 12 and run["output_tok_s"] > 0 and run["ttft_ms"] > 0, run
    slower = release_compare.compare(before, after, TOLERANCE, "sim")
    assert slower["verdict"] == "slower", slower
    assert slower["reason"].startswith("SGLang 0.5.23 is slower than 0.5.10 on sim: output throughput ")
    assert slower["metrics"]["output_tok_s"]["change"] < -0.2, slower
    same = release_compare.compare(before, again, TOLERANCE, "sim")
    assert same["verdict"] == "not_slower", same


def test_a_server_that_does_not_answer_leaves_the_comparison_unmeasured(lab):
    srv = lab.start(*TP8, env=ENV, release="0.5.10")
    srv.wait_ready()
    before = measure(srv, runs=1)
    srv.stop()
    after = {"release": None, "measured": True,
             "runs": [release_compare.run_once(srv.url(""), None, release_compare.prompt_ids(2, 16), **SIZE)]}
    assert after["runs"][0]["failed"] == 4 and "refused" in after["runs"][0]["error"].lower(), after
    assert release_compare.compare(before, after, TOLERANCE, "sim")["verdict"] == "unmeasured"
