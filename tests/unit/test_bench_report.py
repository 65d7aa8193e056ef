"""The benchmark sweep's report (plugins/module_utils/bench_report.py): the recommendation per objective from
hand-built results, an SLO nothing meets, the CSV and Markdown content, the PNG plots, the JSONL reader and the
module that writes it all on the controller."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import bench_report
from ansible_collections.moefleet.serving.plugins.module_utils.bench_results import FIELDS


def result(concurrency, tok_s, p99_itl, p99_ttft=500.0, **more):
    return {name: None for name in FIELDS} | {
        "backend": "sglang", "max_concurrency": concurrency, "output_throughput": tok_s,
        "total_throughput": tok_s * 3, "median_ttft_ms": p99_ttft / 2, "p99_ttft_ms": p99_ttft,
        "median_itl_ms": p99_itl / 2, "p99_itl_ms": p99_itl, **more,
    }


# Shaped like the field report (docs/bench.md): ep8 fastest alone, tp2ep4 the best aggregate, pp8 failed.
PROFILES = [
    {"profile": "tp8", "status": "ok", "outcome": {"outcome": "ready"},
     "results": [result(1, 26.0, 40.0), result(64, 700.0, 120.0), result(256, 808.0, 400.0, 9000.0)]},
    {"profile": "pp8", "status": "failed", "outcome": {"outcome": "failed", "state": "oom", "phase": "weight_load"},
     "results": []},
    {"profile": "ep8", "status": "ok", "outcome": {"outcome": "ready"},
     "results": [result(1, 65.0, 16.0), result(64, 850.0, 80.0), result(256, 960.0, 300.0, 8000.0)]},
    {"profile": "tp2ep4", "status": "ok", "outcome": {"outcome": "ready"},
     "results": [result(1, 48.0, 21.0), result(64, 1300.0, 95.0), result(256, 1531.0, 180.0, 12000.0)]},
]


def test_recommendation_per_objective():
    names, details = bench_report.recommend(PROFILES, slo_p99_itl_ms=100, slo_p99_ttft_ms=10000)
    assert names == {"single_stream": "ep8", "throughput": "tp2ep4", "slo": "tp2ep4"}
    assert details["throughput"]["max_concurrency"] == 256 and details["throughput"]["output_throughput"] == 1531.0
    # Within the SLO only the 64-request levels count: tp2ep4's 1300 tok/s beats ep8's 850.
    assert (details["slo"]["max_concurrency"], details["slo"]["output_throughput"]) == (64, 1300.0)


def test_slo_decides_between_profiles():
    # A tighter ITL bound leaves ep8's 64-request level (80 ms) and nothing of tp2ep4's above one request.
    names, details = bench_report.recommend(PROFILES, slo_p99_itl_ms=90)
    assert names["slo"] == "ep8" and details["slo"]["output_throughput"] == 850.0
    # A TTFT bound alone: every level but the 256 ones (8000 ms or more) qualifies.
    names, _ = bench_report.recommend(PROFILES, slo_p99_ttft_ms=7000)
    assert names["slo"] == "tp2ep4"


def test_slo_nothing_meets_is_null_with_the_reason():
    names, details = bench_report.recommend(PROFILES, slo_p99_itl_ms=5)
    assert names["slo"] is None
    assert details["slo"]["reason"] == "no measurement stayed within p99 ITL <= 5 ms"
    names, details = bench_report.recommend(PROFILES)
    assert names["slo"] is None and details["slo"]["reason"].startswith("no SLO given")


def test_failed_profiles_never_win_even_with_results():
    hacked = [dict(p) for p in PROFILES]
    hacked[1] = {**hacked[1], "results": [result(1, 999.0, 1.0), result(64, 9999.0, 1.0)]}
    names, _ = bench_report.recommend(hacked, slo_p99_itl_ms=100)
    assert "pp8" not in names.values()


def test_single_stream_needs_concurrency_one():
    without_one = [{**p, "results": [r for r in p["results"] if r["max_concurrency"] != 1]} for p in PROFILES]
    names, details = bench_report.recommend(without_one)
    assert names["single_stream"] is None and "concurrency 1" in details["single_stream"]["reason"]
    assert names["throughput"] == "tp2ep4"


def test_nothing_served_recommends_nothing():
    names, _ = bench_report.recommend([PROFILES[1]], slo_p99_itl_ms=100)
    assert names == {"single_stream": None, "throughput": None, "slo": None}


def test_report_shape_and_bad_input():
    report = bench_report.build_report("gpu-01", "kimi-k2.6", PROFILES, 100, "10000", workload={"ladder": [1]})
    assert (report["host"], report["model"], report["workload"]) == ("gpu-01", "kimi-k2.6", {"ladder": [1]})
    assert [p["profile"] for p in report["profiles"]] == ["tp8", "pp8", "ep8", "tp2ep4"]
    assert report["slo"] == {"p99_itl_ms": 100.0, "p99_ttft_ms": 10000.0}
    assert report["recommendation"] == {"single_stream": "ep8", "throughput": "tp2ep4", "slo": "tp2ep4"}
    assert set(report["profiles"][0]["results"][0]) >= {"max_concurrency", "output_throughput", "total_throughput",
                                                         "median_ttft_ms", "p99_ttft_ms", "p99_itl_ms"}
    with pytest.raises(bench_report.BenchReportError, match="status is 'maybe'"):
        bench_report.build_report("h", "m", [{"profile": "tp8", "status": "maybe"}])
    with pytest.raises(bench_report.BenchReportError, match="slo_p99_itl_ms is 'fast'"):
        bench_report.build_report("h", "m", PROFILES, "fast")


def test_csv_has_one_row_per_profile_and_level():
    report = bench_report.build_report("gpu-01", "kimi-k2.6", PROFILES, 100)
    rows = list(csv.DictReader(io.StringIO(bench_report.csv_text(report))))
    assert len(rows) == 3 + 1 + 3 + 3
    assert list(rows[0])[:6] == ["host", "model", "profile", "status", "max_concurrency", "backend"]
    pp8 = [r for r in rows if r["profile"] == "pp8"]
    assert len(pp8) == 1 and pp8[0]["status"] == "failed" and pp8[0]["output_throughput"] == ""
    top = next(r for r in rows if r["profile"] == "tp2ep4" and r["max_concurrency"] == "256")
    assert (float(top["output_throughput"]), float(top["p99_itl_ms"]), top["host"]) == (1531.0, 180.0, "gpu-01")


def test_markdown_summary_table():
    report = bench_report.build_report("gpu-01", "kimi-k2.6", PROFILES, 100, 10000,
                                       workload={"dataset_name": "random", "input_len": 1024, "output_len": 512,
                                                 "ladder": [1, 64, 256]})
    text = bench_report.markdown(report)
    assert "| ep8 | ok | 65.0 | 960.0 | 256 | 300.0 | 8000 |" in text
    assert "| tp2ep4 | ok | 48.0 | 1531.0 | 256 | 180.0 | 12000 |" in text
    assert "| pp8 | failed: oom in weight_load | – | – | – | – | – |" in text
    assert "- Fastest single stream: **ep8** (65.0 tok/s at one request)" in text
    assert "- Highest aggregate: **tp2ep4** (1531.0 tok/s at concurrency 256)" in text
    assert "within p99 ITL <= 100 ms and p99 TTFT <= 10000 ms: **tp2ep4** (1300.0 tok/s at concurrency 64" in text
    assert "Workload: `--dataset-name random`, 1024 input and 512 output tokens per request, concurrency 1, 64, 256." \
        in text
    # What the sweep records: the dataset's flags and the address the client measured.
    report["workload"] |= {"dataset_name": "random-ids", "tokenize_prompt": True, "dataset_path": None,
                           "server_url": "http://[fd00::7]:30000"}
    assert ("Workload: `--dataset-name random-ids --tokenize-prompt`, 1024 input and 512 output tokens per request, "
            "concurrency 1, 64, 256 against http://[fd00::7]:30000.") in bench_report.markdown(report)
    none_met = bench_report.markdown(bench_report.build_report("h", "m", PROFILES, 1))
    assert "Highest aggregate within p99 ITL <= 1 ms: none (no measurement stayed within p99 ITL <= 1 ms)" in none_met


def test_write_report_writes_every_file_and_the_pngs(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is in the dev extra (make setup)")
    report = bench_report.build_report("gpu-01", "kimi-k2.6", PROFILES, 100, 10000)
    files = bench_report.write_report(report, str(tmp_path / "reports"), "bench-20261201T000000Z")
    assert json.loads((tmp_path / "reports" / "bench-20261201T000000Z.json").read_text()) == report
    assert files["csv"].endswith(".csv") and files["markdown"].endswith(".md") and files["plots_skipped"] is None
    assert [p.rsplit("/", 1)[1] for p in files["plots"]] == ["bench-20261201T000000Z-throughput.png",
                                                             "bench-20261201T000000Z-latency.png"]
    for path in files["plots"]:
        data = Path(path).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_plots_skipped_with_a_reason_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    report = bench_report.build_report("h", "m", PROFILES)
    files = bench_report.write_report(report, str(tmp_path), "x")
    assert files["plots"] == [] and "matplotlib is not installed" in files["plots_skipped"]
    assert (tmp_path / "x.json").is_file() and not list(tmp_path.glob("*.png"))


def test_jsonl_reader_reads_the_output_file_by_concurrency():
    lines = [json.dumps({"backend": "sglang", "max_concurrency": c, "output_throughput": t, "p99_itl_ms": 9.5,
                         "completed": 8, "duration": 3.2, "p99_ttft_ms": 70.0})
             for c, t in ((64, 900.5), (1, 61.2))]
    text = "\n".join(["noise", *lines, ""])
    results = bench_report.results_from_jsonl(text)
    assert [(r["max_concurrency"], r["output_throughput"]) for r in results] == [(1, 61.2), (64, 900.5)]
    assert results[0]["successful_requests"] == 8 and results[0]["duration_s"] == 3.2
    assert set(results[0]) == set(FIELDS)


@pytest.mark.parametrize(("concurrency", "expected"), [(1, 8), (4, 8), (16, 32), (64, 128), (256, 512), (1024, 512)])
def test_prompts_per_level(concurrency, expected):
    assert bench_report.prompts_for(concurrency, 8, 2, 512) == expected


def test_module_writes_the_report_from_fetched_jsonl(tmp_path):
    """plugins/modules/bench_report.py run as the tests run the collection's modules (python -m, args file)."""
    jsonl = tmp_path / "ep8.jsonl"
    jsonl.write_text("\n".join(json.dumps({"max_concurrency": c, "output_throughput": t, "p99_itl_ms": 10.0,
                                           "p99_ttft_ms": 100.0}) for c, t in ((1, 62.0), (64, 900.0))) + "\n")
    args = {"ANSIBLE_MODULE_ARGS": {
        "host": "gpu-01", "model": "kimi-k2.6", "dest": str(tmp_path / "out"), "stem": "bench-x", "plots": False,
        "slo_p99_itl_ms": 50,
        "profiles": [{"profile": "ep8", "status": "ok", "outcome": {}, "results_file": str(jsonl),
                      "timing_s": {"start": 11.0, "measure": 5.0, "total": 16.0}},
                     {"profile": "tp8", "status": "ok", "outcome": {}, "results_file": str(tmp_path / "none")},
                     {"profile": "pp8", "status": "failed", "outcome": {"outcome": "failed"}}],
        "facts": {"workload": {"ladder": [1, 64]}},
    }}
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps(args))
    out = subprocess.run([sys.executable, "-m", "ansible_collections.moefleet.serving.plugins.modules.bench_report",
                          str(args_file)], capture_output=True, text=True, cwd=tmp_path)
    answer = json.loads(out.stdout)
    assert answer.get("failed") is not True, answer
    assert answer["recommendation"] == {"single_stream": "ep8", "throughput": "ep8", "slo": "ep8"}
    written = json.loads((tmp_path / "out" / "bench-x.json").read_text())
    assert [(p["profile"], p["status"]) for p in written["profiles"]] == [("ep8", "ok"), ("tp8", "failed"),
                                                                         ("pp8", "failed")]
    assert written["profiles"][1]["error"] == "served, but bench_serving wrote no result"
    assert written["profiles"][0]["timing_s"] == {"start": 11.0, "measure": 5.0, "total": 16.0}
    assert written["workload"] == {"ladder": [1, 64]} and "results_file" not in written["profiles"][0]
    assert answer["files"]["plots"] == [] and (tmp_path / "out" / "bench-x.md").is_file()



def test_module_refuses_a_relative_dest(tmp_path):
    """Ansible runs the module on the controller in the playbook's directory: a relative dest would land there,
    not under the working directory of ansible-playbook, so the play resolves it and the module takes none."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"host": "h", "model": "m", "profiles": [],
                                                             "dest": "reports", "plots": False}}))
    out = subprocess.run([sys.executable, "-m", "ansible_collections.moefleet.serving.plugins.modules.bench_report",
                          str(args_file)], capture_output=True, text=True, cwd=tmp_path)
    answer = json.loads(out.stdout)
    assert answer["failed"] is True and answer["msg"].startswith("dest is 'reports', a relative path: ")
    assert not (tmp_path / "reports").exists()

BLOCK = """============ Serving Benchmark Result ============
Backend:                                 sglang
Max request concurrency:                 64
Successful requests:                     128
Output token throughput (tok/s):         1290.56
---------------Time to First Token----------------
P99 TTFT (ms):                           2410.20
---------------Inter-Token Latency----------------
P99 ITL (ms):                            61.73
==================================================
"""


def test_cli_progress_follows_the_sweeps_events():
    """moefleet bench run's progress lines from what the sweep's tasks return (facts, modules, loop variables),
    whatever the tasks are named: every task here is named "x"."""
    from moefleet.commands.bench import SweepProgress

    out = io.StringIO()
    progress = SweepProgress(out=out, clock=lambda: (2026, 12, 1, 4, 5, 6, 0, 335, 0))

    def event(kind, host="itest-1", action="ansible.builtin.set_fact", **res):
        progress({"event": kind, "event_data": {"task": "x", "host": host, "resolved_action": action, "res": res}})

    def facts(host="itest-1", **values):
        event("runner_on_ok", host=host, ansible_facts=values)

    def included(path):
        progress({"event": "playbook_on_include", "event_data": {"included_file": path}})

    event("runner_on_start", action="ansible.builtin.assert")
    assert not progress.reached_host  # the input checks run on the host's name only
    event("runner_on_start", action="ansible.builtin.setup")
    facts(bench_profiles=["pp8", "tp2ep4"], bench_done=[])
    included("/c/roles/router_membership/tasks/main.yml")
    facts(sglang_service_outcome={})  # the sweep clears the last profile's outcome
    facts(sglang_service_phase="loading", sglang_service_phase_reason="")
    event("runner_on_failed", action="moefleet.serving.sglang_readiness", msg="pp8 ran out of memory")  # rescued
    facts(sglang_service_phase="rolling back", sglang_service_phase_reason="OOM while loading weights")
    facts(sglang_service_outcome={"outcome": "degraded", "serving_profile": "tp8"})
    facts(__bench_status="failed", __bench_error="outcome degraded, serving tp8")
    facts(bench_done=[{"profile": "pp8", "status": "failed", "error": "outcome degraded, serving tp8"}])
    facts(sglang_service_phase="loading", sglang_service_phase_reason="")
    facts(sglang_service_outcome={"outcome": "ready", "serving_profile": "tp2ep4"})
    event("runner_item_on_ok", action="ansible.builtin.command", rc=0, stdout=BLOCK, bench_concurrency=64,
          ansible_loop_var="bench_concurrency")
    event("runner_item_on_ok", action="ansible.builtin.command", rc=1,
          stderr="Traceback\nConnectionRefusedError: [Errno 111]", bench_concurrency=256,
          ansible_loop_var="bench_concurrency")
    facts(bench_done=[{"profile": "pp8", "status": "failed"}, {"profile": "tp2ep4", "status": "ok"}])
    event("runner_on_ok", host="localhost", action="moefleet.serving.bench_report",
          report={"recommendation": {"throughput": "tp2ep4"}}, files={"plots": []})
    facts(bench_final_profile="tp8")
    facts(sglang_service_phase="loading", sglang_service_phase_reason="")
    facts(sglang_service_outcome={"outcome": "ready", "serving_profile": "tp8"})
    included("/c/roles/router_membership/tasks/main.yml")
    event("runner_on_failed", action="moefleet.serving.gateway_route", msg="the router does not route to itest-1")
    assert out.getvalue().splitlines() == [
        "04:05:06  itest-1: reading what it serves, planning the sweep",
        "04:05:06  itest-1: out of the routers for the sweep (its requests finish first)",
        "04:05:06  profile 1 of 2: pp8: starting",
        "04:05:06  profile 1 of 2: pp8: rolling back: OOM while loading weights",
        "04:05:06  profile 1 of 2: pp8: did not serve: outcome degraded, serving tp8",
        "04:05:06  profile 2 of 2: tp2ep4: starting",
        "04:05:06  profile 2 of 2: tp2ep4: serving; measuring",
        "04:05:06  profile 2 of 2: tp2ep4: concurrency 64: 1290.6 output tok/s, p99 ITL 61.7 ms, p99 TTFT 2410 ms",
        "04:05:06  profile 2 of 2: tp2ep4: concurrency 256: bench_serving exited 1: "
        "ConnectionRefusedError: [Errno 111]",
        "04:05:06  itest-1: serving tp8 again (what it served before the sweep, or the winner)",
        "04:05:06  itest-1: back into the routers",
        "04:05:06  itest-1: failed: the router does not route to itest-1",
    ]
    assert progress.report == {"recommendation": {"throughput": "tp2ep4"}} and progress.reached_host
    assert progress.failed == ["the router does not route to itest-1"]  # the rescued readiness failure is not one


def test_cli_progress_says_when_the_host_stays_out_of_the_routers():
    from moefleet.commands.bench import SweepProgress

    out = io.StringIO()
    progress = SweepProgress(out=out, clock=lambda: (2026, 12, 1, 4, 5, 6, 0, 335, 0))
    for kind, data in (("runner_on_start", {"resolved_action": "ansible.builtin.setup"}),
                       ("runner_on_ok", {"res": {"ansible_facts": {"bench_profiles": ["ep8"]}}}),
                       ("playbook_on_include", {"included_file": "/c/roles/router_membership/tasks/main.yml"}),
                       ("runner_on_ok", {"res": {"ansible_facts": {"bench_done": [{"profile": "ep8",
                                                                                   "status": "ok"}]}}}),
                       ("runner_on_ok", {"res": {"ansible_facts": {"bench_final_profile": "tp8"}}}),
                       ("runner_on_ok", {"res": {"ansible_facts": {
                           "sglang_service_outcome": {"outcome": "restored", "serving_profile": "tp4"}}}})):
        progress({"event": kind, "event_data": {"task": "x", "host": "gpu-01", **data}})
    assert out.getvalue().splitlines()[-1] == (
        "04:05:06  gpu-01: stays out of the routers: it does not serve tp8 as asked (outcome restored, serving tp4); "
        "put it back with playbooks/rollout.yml once it serves")


def _tasks(items):
    """Every task of a task list, blocks opened."""
    for task in items or []:
        yield task
        for section in ("block", "rescue", "always"):
            yield from _tasks(task.get(section))


def test_the_sweep_publishes_what_the_progress_reads():
    """What SweepProgress reads is what playbooks/bench.yml, tasks/bench_profile.yml and the sglang_service role set
    (facts, modules, the level loop variable), not their task names."""
    import yaml

    from moefleet.commands import bench

    root = Path(__file__).resolve().parents[2]
    plays = yaml.safe_load((root / "playbooks" / "bench.yml").read_text())
    tasks = [t for play in plays for t in _tasks(play.get("tasks"))]
    tasks += list(_tasks(yaml.safe_load((root / "playbooks" / "tasks" / "bench_profile.yml").read_text())))
    set_facts = {key for t in tasks for key in (t.get("ansible.builtin.set_fact") or {})}
    assert {"bench_profiles", "bench_done", "bench_final_profile"} <= set_facts
    modules = {key for t in tasks for key in t if "." in key}
    assert any(module.endswith(bench.REPORT_ACTION) for module in modules)
    assert modules & bench.SETUP_ACTIONS
    assert any((t.get("ansible.builtin.include_role") or {}).get("name") == bench.ROUTER_ROLE for t in tasks)
    assert (root / bench.ROUTER_TASKS).is_file()
    assert any((t.get("loop_control") or {}).get("loop_var") == bench.LEVEL_VAR for t in tasks)
    record = next(t for t in tasks if "bench_done" in (t.get("ansible.builtin.set_fact") or {}) and "vars" in t)
    assert {"profile", "status", "error"} <= set(record["vars"]["_entry"])
    role = "\n".join(path.read_text() for path in (root / "roles" / "sglang_service" / "tasks").glob("*.yml"))
    for phase in ("loading", *bench.PHASE_WORDS):  # set as sglang_service_phase: X, quoted or not, or in a template
        assert re.search(rf"sglang_service_phase:\s*['\"]?{phase}['\"]?\s*$|'{phase}'", role, re.M), phase


def test_cli_shows_the_inventory_change_as_a_unified_diff():
    from moefleet.commands.bench import SweepProgress

    progress = SweepProgress(out=io.StringIO())
    diff = [{"before": "---\nsglang_profile: tp8\n", "after": "---\nsglang_profile: tp2ep4\n",
             "before_header": "g/blackwell.yml (content)", "after_header": "g/blackwell.yml (content)"},
            {"before": "", "after": "", "before_header": "g/blackwell.yml (file attributes)"}]
    progress({"event": "runner_on_ok", "event_data": {
        "task": "Set sglang_profile to the winner in the group's vars file", "host": "gpu-01",
        "res": {"changed": True, "diff": diff}}})
    assert progress.diffs == ["--- g/blackwell.yml (content)\n+++ g/blackwell.yml (content)\n@@ -1,2 +1,2 @@\n"
                              " ---\n-sglang_profile: tp8\n+sglang_profile: tp2ep4\n"]
