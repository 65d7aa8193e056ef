"""playbooks/bench.yml on one lab host (itest-1 of the lab_inventory fixture): ep8 and tp2ep4 served through
the sglang_service role one after the other and measured with the simulated `python -m sglang.bench_serving` at
concurrency 1 and 64. The report lands as JSON, CSV, Markdown and two PNGs; the recommendation is the field
report's (ep8 the fastest single stream, tp2ep4 the best aggregate); the host serves afterwards what it served
before (its local facts and its unit's command line).

On a fresh lab the host serves nothing yet: the test deploys tp8 on it first (as the rollout tests of this
directory do next, so they find it installed and serving tp8). About 2.5 minutes on a fresh lab on 2 cores
(the deploy ~1.3 of them), 1.3 on a host that already serves. The sweep runs from the repository root with a
relative bench_report_dir, which must land under the repository root (the working directory), not playbooks/.

The sweep of a worker behind the model gateway runs on the router lab (tests/integration/test_router_lab.py,
test_a_bench_sweep_measures_the_bind_address_out_of_the_router), whose hosts are up already.

Cost (a fresh-clone make test, beside two other jobs): 195 s with three profiles (tp8 as well) served in turn, then
the put-back. tp8 left the sweep on 2026-12-05 (one start of four less, ~25 s): the two left still recommend
differently, and the put-back still restarts the host into what it served before the sweep (tp8).

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 101 s wall, 27 + 31 CPU-s.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from playbook import ROOT, on_host, run_playbook  # noqa: E402  (tests/playbook.py)

pytestmark = pytest.mark.lab

HOST = "itest-1"
PROFILES = ["ep8", "tp2ep4"]
LADDER = [1, 64]


def serving(inventory: Path) -> dict:
    """What the host serves: its local facts, whether the unit is active, and the unit's command line."""
    facts = on_host(inventory, HOST, "cat /etc/ansible/facts.d/moefleet.fact 2>/dev/null")
    return {
        "facts": json.loads(facts) if facts.strip() else {},
        "active": on_host(inventory, HOST, "systemctl is-active sglang.service").strip(),
        "exec": on_host(
            inventory, HOST, "systemctl show -p ExecStart --value sglang.service | sed 's/ ; start_time=.*//'"
        ),
    }


def test_sweep_reports_recommends_and_puts_back_what_served(lab_inventory):
    before = serving(lab_inventory)
    if before["active"] != "active" or not before["facts"].get("serving_profile"):
        deployed = run_playbook(lab_inventory, "deploy.yml", "profile=tp8", options=("--limit", f"{HOST},localhost"))
        assert deployed.returncode == 0, deployed.stdout[-4000:]
        before = serving(lab_inventory)
    assert before["active"] == "active" and before["exec"].strip()

    # Relative, as an operator passes it: under the working directory of ansible-playbook (run_playbook runs it
    # from the repository root), not under playbooks/ where the playbook is.
    relative = f"reports/test-bench-lab-{uuid.uuid4().hex[:8]}"
    reports = ROOT / relative
    try:
        started = time.monotonic()
        result = run_playbook(
            lab_inventory, "playbooks/bench.yml",
            json.dumps({"profiles": PROFILES, "bench_ladder": LADDER, "bench_report_dir": relative}),
            options=("--limit", f"{HOST},localhost"), timeout=900,
        )
        wall = time.monotonic() - started
        print(f"sweep wall time: {wall:.0f} s")
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        assert not (ROOT / "playbooks" / relative).exists()
        check_report(reports, before)
        check_bench_part_d(reports)
    finally:
        shutil.rmtree(reports, ignore_errors=True)
        shutil.rmtree(ROOT / "playbooks" / relative, ignore_errors=True)

    after = serving(lab_inventory)
    assert after["active"] == "active"
    assert after["facts"]["serving_profile"] == before["facts"]["serving_profile"]
    assert after["facts"]["outcome"] == "ready"
    assert after["exec"] == before["exec"]
    # Nothing of the sweep is left on the host.
    assert on_host(lab_inventory, HOST, "ls -d /tmp/moefleet-bench.* 2>/dev/null").strip() == ""


def check_report(reports: Path, before: dict) -> None:
    """The JSON, CSV, Markdown and PNGs of the sweep above."""
    (report_file,) = reports.glob("bench-*.json")
    stem = report_file.name.removesuffix(".json")
    report = json.loads(report_file.read_text())
    assert (report["host"], report["model"]) == (HOST, "kimi-k2.6")
    assert [(p["profile"], p["status"]) for p in report["profiles"]] == [(p, "ok") for p in PROFILES]
    for profile in report["profiles"]:
        assert [r["max_concurrency"] for r in profile["results"]] == LADDER
        assert all(r["output_throughput"] > 0 and r["p99_itl_ms"] > 0 for r in profile["results"])
        assert profile["outcome"]["outcome"] == "ready" and profile["timing_s"]["total"] > 0
    assert report["recommendation"]["single_stream"] == "ep8"
    assert report["recommendation"]["throughput"] == "tp2ep4"
    assert report["served_before"] == before["facts"]["serving_profile"]
    # Random token ids sent as token ids (nothing downloaded), at the address the server binds (the lab's
    # default: loopback).
    assert {k: report["workload"][k] for k in ("dataset_name", "tokenize_prompt", "dataset_path", "server_url")} == {
        "dataset_name": "random-ids", "tokenize_prompt": True, "dataset_path": None,
        "server_url": "http://127.0.0.1:30000"}

    rows = list(csv.DictReader((reports / f"{stem}.csv").open()))
    assert [(r["profile"], r["max_concurrency"]) for r in rows] == [(p, str(c)) for p in PROFILES for c in LADDER]
    summary = (reports / f"{stem}.md").read_text()
    assert all(f"| {p} | ok |" in summary for p in PROFILES) and "Fastest single stream: **ep8**" in summary
    for name in (f"{stem}-throughput.png", f"{stem}-latency.png"):
        assert (reports / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def check_bench_part_d(reports: Path) -> None:
    """`make bench`'s part (d), the sweep's own timing, read from this sweep's report (tests/bench/run.py
    --sweep-report): the smoke run that keeps the part from rotting. Its lab run (a fresh host, the field report's four
    profiles) is this test's sweep at full size: only its table is run here, which costs a second."""
    (report_file,) = reports.glob("bench-*.json")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "bench" / "run.py"), "--sweep-report",
                           str(report_file)], cwd=ROOT, text=True, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()
            if line.split() and line.split()[0] in PROFILES}
    assert set(rows) == set(PROFILES), done.stdout
    assert all(row[0] == "ok" and float(row[3]) > 0 for row in rows.values()), done.stdout
