"""The benchmark keeps measuring: tests/bench/run.py --smoke runs a part once at its smallest size and exits 1 when
it measured nothing (no latency, no OOM detected), never judging how fast.

Part (a) runs here, in `make unit`: the readiness module and the simulator as local processes, no lab (about 5 s:
one injected OOM, the uri loop giving up after 2 s). Parts (b) to (e) need the lab (`--parts bc --smoke`, `d`, `e`)
and are not run by this file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "bench" / "run.py"
sys.path.insert(0, str(ROOT / "sim" / "gpu"))
import devnodes  # noqa: E402  (the stand-in /dev/nvidia* nodes the bench's simulator opens)


def test_part_a_detects_an_oom_and_times_it(tmp_path):
    try:
        devnodes.create(str(tmp_path / "dev"), 1)
    except PermissionError:
        pytest.skip("the bench's simulator needs the stand-in /dev/nvidia* nodes, which need root (CAP_MKNOD)")
    done = subprocess.run([sys.executable, str(RUN), "--parts", "a", "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # the table row carries a latency, and the one run's verdict is the injected weight-load OOM
    row = next(line for line in done.stdout.splitlines() if line.startswith("| sglang_readiness"))
    assert "no OOM detected" not in row and " ms |" in row, row
    assert "module oom/weight_load" in done.stdout
