"""The benchmark keeps measuring: tests/bench/run.py --smoke runs a part at a small size and exits 1 when it measured
nothing (no latency, no OOM detected), never judging how fast.

Part (a) runs here, in `make unit` and in `make test` (the suite's sim job): the readiness module and the simulator as
local processes, no lab, 20 injected OOMs (about 20 s: the OOMs one after another, then the uri loops giving up after
2 s). Its p50/p95 are printed at the end of the pytest run (conftest.py) and, in `make test`, by the suite when the
job ends; no test compares them with anything (`make bench` compares its own run with tests/bench/baseline.json).
Without CAP_MKNOD the simulator opens links to /dev/null instead of the driver's stand-in nodes, so part (a) runs as
any user: the second test shows the simulator's CUDA init takes them. Parts (b) to (e) need the lab (`--parts bc
--smoke`, `d`, `e`) and are not run by this file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import bench_module  # noqa: E402  (tests/playbook.py)

RUN = ROOT / "tests" / "bench" / "run.py"
RUNS = 20  # as make bench's default, so that the printed p95 is the statistic the baseline holds (not the max)


def test_part_a_detects_ooms_and_prints_p50_p95(tmp_path, record_property):
    figures = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(RUN), "--parts", "a", "--smoke", "--runs", str(RUNS),
                           "--figures-json", str(figures)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    measured = json.loads(figures.read_text(encoding="utf-8"))
    assert {"a.p50_ms", "a.p95_ms", "a.max_ms"} <= measured.keys(), done.stdout[-2000:]
    # every run's verdict is the injected weight-load OOM, not merely some failure
    assert done.stdout.count("module oom/weight_load") == RUNS, done.stdout[-2000:]
    nodes = re.search(r"^Device nodes the simulator opens: (.*)\.$", done.stdout, re.MULTILINE)
    record_property("figure", f"bench (a) OOM detection latency of sglang_readiness: p50 {measured['a.p50_ms']:g} ms, "
                              f"p95 {measured['a.p95_ms']:g} ms, max {measured['a.max_ms']:g} ms over {RUNS} injected "
                              f"OOMs, load average {os.getloadavg()[0]:.1f} "
                              f"(device nodes: {nodes.group(1) if nodes else 'not said'})")


def test_without_cap_mknod_the_simulator_still_opens_its_nodes(tmp_path, monkeypatch):
    bench = bench_module()

    def no_mknod(root, gpus, proc_devices=None):
        raise PermissionError(1, "Operation not permitted", root)

    monkeypatch.setattr(bench.devnodes, "create", no_mknod)
    dev = tmp_path / "dev"
    assert "/dev/null" in bench.stand_in_nodes(dev, 8)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "sim" / "sglang"), "SIM_GPU_DEV_DIR": str(dev),
           "SIM_GPU_RUN_DIR": str(tmp_path / "run")}
    cuda_init = "from sglang._sim import hostfs\nfor i in range(8): hostfs.cuda_init(i, list(range(8)))"
    opened = subprocess.run([sys.executable, "-c", cuda_init], env=env, capture_output=True, text=True, timeout=60)
    assert opened.returncode == 0, opened.stderr[-2000:]
    # the same check fails when a node is missing: it is the simulator's CUDA init that accepted the links
    (dev / "nvidiactl").unlink()
    refused = subprocess.run([sys.executable, "-c", cuda_init], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "No CUDA GPUs are available" in refused.stderr, refused.stderr[-2000:]


def test_the_comparison_names_the_figure_that_got_worse():
    bench = bench_module()
    baseline = {"measurements": [{"date": "d", "source": "s", "figures": {"a.p95_ms": 15.0, "a.p50_ms": 12.0}},
                                 {"date": "d", "source": "s", "figures": {"e.failed.through_router": 0}}]}
    now = {"a.p95_ms": 41.0, "a.p50_ms": 26.0, "e.failed.through_router": 1, "b.rerun_s.1_hosts": 9}
    rows = {row["figure"]: row for row in bench.compare(baseline, now)}
    assert rows["a.p95_ms"]["worse"] and rows["a.p95_ms"]["allowed"] == 25.0
    assert not rows["a.p50_ms"]["worse"]  # +14 ms, within its 15
    assert rows["e.failed.through_router"]["worse"]  # one failed request behind the gateway is one too many
    assert "b.rerun_s.1_hosts" not in rows  # measured, but the baseline has no such figure


def test_the_baseline_says_where_each_figure_came_from_and_each_has_a_tolerance():
    bench = bench_module()
    baseline = json.loads(bench.BASELINE.read_text(encoding="utf-8"))
    names = [name for entry in baseline["measurements"] for name in entry["figures"]]
    assert {"a.p50_ms", "a.p95_ms", "a.max_ms"} <= set(names)
    assert len(names) == len(set(names)), "a figure is in two measurements: the comparison would read both"
    for entry in baseline["measurements"]:
        missing = {"date", "machine", "commit", "source"} - entry.keys()
        assert not missing, f"a measurement of {sorted(entry['figures'])} does not say its {sorted(missing)}"
        for name in entry["figures"]:
            assert bench.tolerance(name).why  # raises KeyError naming the figure when it has none
