"""SGLang's Prometheus metrics as the wheel defines them, and comparisons against them (tests/oracle/test_metrics.py).

``wheel_families(release)`` is the reference for any check of a metric name: every family the collectors of SGLang
``release`` define (driver.py's ``metric_families`` op, default: the release the roles pin), by the name the text
format's ``# TYPE`` line gives it (a counter with its ``_total``); ``family_of(sample)`` finds the family of a series
name as PromQL writes it (``..._bucket``, ``..._sum``, ``..._count`` of a histogram). ``compare_families`` holds an
exposition's families against those definitions, ``compare_expositions`` two expositions of the same server (the
simulator's and the one SGLang's own collectors build); both return the problems they find, so that a test can also show
they find them. ``simulator(args, release)`` runs sim/sglang as the lab does, as that release, for a test to talk to.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import env
import oracle
from argvs import with_value

# Labels a family gets on top of those its collector is built with: a scheduler's dp_rank (init_metrics, when the
# scheduler has one) and, with --enable-priority-scheduling, priority (scheduler and tokenizer)
EXTRA_LABELS = {"scheduler": {"dp_rank", "priority"}, "tokenizer": {"priority"}}
# multiprocess modes whose series carry the writing process's pid (prometheus_client multiprocess.py)
PID_MODES = {"all", "liveall"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def wheel_families(release: str | None = None) -> dict[str, dict]:
    """{family: {"type", "help", "labels", "buckets", "multiprocess_mode", "source", "default"}} of SGLang
    ``release``'s wheel (default: the release the roles pin).

    ``labels``: the label names the collector is built with (EXTRA_LABELS may come on top); ``buckets``: a
    histogram's ``le`` values as the exposition writes them, ``+Inf`` last; ``source``: scheduler, tokenizer,
    http_server (the main process's middleware, function timer and CPU monitor) or optional (storage, radix cache,
    expert dispatch); ``default``: registered by a server started with plain --enable-metrics."""
    return _wheel_families(release or env.pinned_version())


@functools.cache
def _wheel_families(release: str) -> dict[str, dict]:
    (answer,) = oracle.ask([{"op": "metric_families", "model_config": oracle.model_config(oracle.SIM_K26_CONFIG)}],
                           release)
    assert answer.get("ok"), answer
    return answer["families"]


def family_of(sample: str, families: dict | None = None) -> str | None:
    """The family a series name (as a query writes it) belongs to, or None if the wheel has none."""
    families = wheel_families() if families is None else families
    if sample in families:
        return sample
    for suffix in HISTOGRAM_SUFFIXES:
        base = sample[:-len(suffix)]
        if sample.endswith(suffix) and families.get(base, {}).get("type") in ("histogram", "summary"):
            return base
    return None


def compare_families(families: dict[str, dict], wheel: dict[str, dict] | None = None) -> list[str]:
    """Problems of an exposition's families (parse()) against the wheel's definitions: a family the wheel does not
    have, another type or HELP text, series whose label names are not the family's (le on a histogram's buckets,
    pid where its multiprocess mode adds one), other buckets, a sample name the type does not have."""
    wheel = wheel_families() if wheel is None else wheel
    problems = []
    for name, family in families.items():
        real = wheel.get(name)
        if real is None:
            problems.append(f"{name}: no such family in SGLang")
            continue
        if family["type"] != real["type"]:
            problems.append(f"{name}: type {family['type']}, SGLang's is {real['type']}")
        if family["help"] != real["help"]:
            problems.append(f"{name}: HELP {family['help']!r}, SGLang's is {real['help']!r}")
        allowed = set(real["labels"]) | EXTRA_LABELS.get(real["source"], set())
        pid = real["type"] == "gauge" and real.get("multiprocess_mode") in PID_MODES
        buckets: dict[tuple, list[str]] = {}
        for sample, labels, _ in family["samples"]:
            keys = set(labels)
            suffix = sample[len(name):]
            if real["type"] == "histogram":
                if suffix not in HISTOGRAM_SUFFIXES:
                    problems.append(f"{name}: sample {sample} is not a histogram's")
                if suffix == "_bucket":
                    keys.discard("le")
                    buckets.setdefault(tuple(sorted((k, v) for k, v in labels.items() if k != "le")), []).append(
                        labels.get("le"))
            elif sample != name:
                problems.append(f"{name}: sample {sample} is not a {real['type']}'s")
            if pid != ("pid" in keys):
                problems.append(f"{name}: series {labels} {'lacks' if pid else 'has'} the pid label")
            keys.discard("pid")
            if not set(real["labels"]) <= keys <= allowed:
                problems.append(f"{name}: series labels {sorted(keys)}, SGLang's {sorted(real['labels'])}"
                                + (f" (and maybe {sorted(allowed - set(real['labels']))})" if allowed != set(
                                    real["labels"]) else ""))
        for series, les in buckets.items():
            if les != real["buckets"]:
                problems.append(f"{name}{dict(series)}: buckets {les}, SGLang's {real['buckets']}")
    return problems


def _identity(sample: str, labels: dict) -> tuple:
    """A series as the comparison sees it: its name and labels, a pid's value left out (processes differ)."""
    return sample, tuple(sorted((k, "<pid>" if k == "pid" else v) for k, v in labels.items()))


def compare_expositions(ours: dict[str, dict], theirs: dict[str, dict], values: tuple[str, ...] = ()) -> list[str]:
    """Problems of `ours` against `theirs` (both parse()d, of the same server): families one has and the other
    not, type or HELP text, series (names and label values; a pid's value aside), and the values of the series
    named in `values`."""
    problems = []
    for name in sorted(set(ours) ^ set(theirs)):
        problems.append(f"{name}: only in {'ours' if name in ours else 'theirs'}")
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        for key in ("type", "help"):
            if a[key] != b[key]:
                problems.append(f"{name}: {key} {a[key]!r}, theirs {b[key]!r}")
        mine = {_identity(s, labels): v for s, labels, v in a["samples"]}
        real = {_identity(s, labels): v for s, labels, v in b["samples"]}
        for series in sorted(set(mine) ^ set(real)):
            problems.append(f"{name}: series {series[0]}{dict(series[1])} only in "
                            f"{'ours' if series in mine else 'theirs'}")
        for series in sorted(set(mine) & set(real)):
            if series[0] in values and mine[series] != real[series]:
                problems.append(f"{name}: {series[0]}{dict(series[1])} = {mine[series]}, theirs {real[series]}")
    return problems


# --- the simulator, run as the lab runs it ----------------------------------------------------------------------

class Sim:
    def __init__(self, url: str, args: list[str]):
        self.url, self.args = url, args

    def request(self, method: str, path: str, body: dict | None = None,
                headers: dict | None = None) -> tuple[int, dict, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


@contextlib.contextmanager
def simulator(args: list[str], release: str | None = None, timeout: float = 60.0):
    """sim/sglang started with ``args`` on a simulated 8-GPU host, as oracle.run_simulator starts it, as SGLang
    ``release`` (the sim-only SGLANG_SIM_RELEASE; default: the release sim/sglang/pyproject.toml names); yields a
    Sim once /health answers, and kills it afterwards."""
    with tempfile.TemporaryDirectory(prefix="oracle-sim-") as tmp:
        root = Path(tmp)
        (root / "gpus.json").write_text(json.dumps({"count": oracle.GPUS}))
        (root / "procs").mkdir()
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text(oracle.SIM_K26_CONFIG.read_text())
        (root / "home").mkdir()
        port = oracle._free_port()  # noqa: SLF001
        environ = {**os.environ, "PYTHONPATH": str(oracle.SIM_SGLANG), "SIM_GPU_SPEC": str(root / "gpus.json"),
                   "SIM_GPU_STATE_DIR": str(root / "procs"), "SGLANG_SIM_TIME_SCALE": "0.05",
                   "HOME": str(root / "home")}
        for var in ("SGLANG_SIM_FAULTS", "CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR", "HF_HOME", "HF_MODULES_CACHE",
                    "FLASHINFER_WORKSPACE_BASE", "SGLANG_SIM_SERVE_TIME_SCALE", "SGLANG_SIM_RELEASE"):
            environ.pop(var, None)
        if release is not None:
            environ["SGLANG_SIM_RELEASE"] = release
        if oracle.SIM_DEVNODES.exists():
            sys.path.insert(0, str(oracle.SIM_DEVNODES.parent))
            import devnodes

            devnodes.create(str(root / "dev"), oracle.GPUS)
            environ["SIM_GPU_DEV_DIR"] = str(root / "dev")
        full = with_value(with_value(args, "--model-path", str(root / "model")), "--port", str(port))
        with open(root / "server.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *full], stdout=log,
                                    stderr=subprocess.STDOUT, env=environ, cwd=tmp, start_new_session=True)
        try:
            sim = Sim(f"http://127.0.0.1:{port}", args)
            end = time.monotonic() + timeout
            while True:
                assert proc.poll() is None and time.monotonic() < end, \
                    (root / "server.log").read_text(errors="replace")[-3000:]
                with contextlib.suppress(OSError):
                    if sim.request("GET", "/health")[0] == 200:
                        break
                time.sleep(0.05)
            yield sim
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # no drain: its ranks go with it
            proc.wait(10)
