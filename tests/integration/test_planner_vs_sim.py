"""The planner's verdict against what the simulator actually does with the same flags.

For every profile of profiles/catalog.yml, the same TP8 and PP8 layouts at SGLang's default
``--mem-fraction-static`` (about 0.771 for K2.6, whose KV pool then has no room), and the field's ad-hoc
``--tp-size 4 --ep-size 2`` (docs/facts.md §1),
on the K2.6 config the lab serves and 8 simulated GPUs of 94.97 GiB: a layout the simulator loads and
serves must be planned ``fits`` or ``tight``; one it runs out of memory on must be planned ``oom``. For
the layouts that load, the planner's weights per GPU (heaviest pipeline stage) must be within
WEIGHTS_TOLERANCE of the largest ``Load weight end. ... mem usage=X GB`` the simulator logs over its ranks,
and its KV tokens near the simulator's ``KV Cache is allocated. #tokens`` (KV_OVER).

The simulator is the independent physics (sim/sglang, never importing the planner); it runs here as a
local subprocess, no containers. Run this file as a script to print the comparison table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils.planner import plan

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # as a script too (pytest puts tests/ there already)
from simproc import free_port, kill_group  # noqa: E402

sys.path.insert(0, str(ROOT / "sim" / "gpu"))
import devnodes  # noqa: E402  (the lab's stand-in /dev/nvidia* nodes, which every simulated start opens)

SIM_SGLANG = ROOT / "sim" / "sglang"
K26_CONFIG = ROOT / "sim" / "model" / "kimi_k26_config.json"
MAKE_MODEL_DIR = ROOT / "sim" / "model" / "make_model_dir.py"
CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())
CONFIG = json.loads(K26_CONFIG.read_text())

GPUS, GPU_GIB = 8, 94.97
SMI_MIB = 97887  # nvidia-smi's memory.total, the simulator's default spec and what SGLang sizes its default from
RELEASE = "0.5.10"  # the simulator is SGLang 0.5.10: the planner is judged by that release's arithmetic
TIME_SCALE = "0.05"  # a full K2.6 start in about a second of wall time
START_TIMEOUT = 30.0  # seconds for one simulated start to serve or die
# Both count the tensors SGLang creates per rank (w_kc/w_vc copies and g_idx/sort_indices included); the
# simulator also rounds every allocation like PyTorch's caching allocator, so it reads a little higher.
WEIGHTS_TOLERANCE = 0.02
# KV tokens hang on the few GiB left after the weights, so they move more. The planner may promise at most
# KV_OVER more than the simulator gets; without pipeline stages it must also be within KV_OVER below. With
# stages (7-8 layers a token) its fixed 1 GiB init overhead costs tens of thousands of tokens: it reads low.
KV_OVER = 0.10

OOM_MARKERS = ("torch.OutOfMemoryError", "CUDA out of memory", "Not enough memory")
LOAD_END = re.compile(r"Load weight end\..*?mem usage=([0-9.]+) GB")
KV_TOKENS = re.compile(r"KV Cache is allocated\. #tokens: (\d+)")

LAYOUTS: dict[str, dict] = {name: dict(p["flags"]) for name, p in CATALOG["profiles"].items()}
LAYOUTS["tp8 at SGLang's default fraction"] = {"tp_size": 8}
LAYOUTS["pp8 at SGLang's default fraction"] = {"tp_size": 1, "pp_size": 8}
LAYOUTS["adhoc --tp-size 4 --ep-size 2"] = {"tp_size": 4, "ep_size": 2}


def cli_flags(flags: dict) -> list[str]:
    """SGLang command-line flags from a profile's flag mapping (names without dashes)."""
    out: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value not in (False, None):
            out += [flag, str(value)]
    return out


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def run_sim(model_dir: Path, work: Path, flags: dict) -> dict:
    """Start the simulator with ``flags``; ``{"result": "serves"|"oom"|"other", "weights_gb", ...}``."""
    spec = work / "gpus.json"
    spec.write_text(json.dumps({"count": GPUS, "torch_total_gib": GPU_GIB, "memory_total_mib": SMI_MIB}))
    state = work / "procs"
    state.mkdir(exist_ok=True)
    log = work / "server.log"
    dev, home = work / "dev", work / "home"  # a host's driver nodes and the service user's home (its caches)
    if not dev.exists():
        try:
            devnodes.create(str(dev), GPUS)
        except PermissionError:
            pytest.skip("creating the stand-in /dev/nvidia* nodes needs root (CAP_MKNOD)")
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(SIM_SGLANG),
        "SIM_GPU_SPEC": str(spec),
        "SIM_GPU_STATE_DIR": str(state),
        "SIM_GPU_DEV_DIR": str(dev),
        "HOME": str(home),
        "SGLANG_SIM_TIME_SCALE": TIME_SCALE,
    }
    for name in ("SGLANG_SIM_FAULTS", "CUDA_VISIBLE_DEVICES", "SGLANG_PP_LAYER_PARTITION", "TRITON_CACHE_DIR",
                 "HF_HOME", "HF_MODULES_CACHE", "FLASHINFER_WORKSPACE_BASE"):
        env.pop(name, None)
    port = free_port()
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang.launch_server",
                "--model-path",
                str(model_dir),
                "--port",
                str(port),
                *cli_flags(flags),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
            start_new_session=True,
        )
    try:
        result = "timeout"
        while time.monotonic() - started < START_TIMEOUT:
            if health(port) == 200:
                result = "serves"
                break
            if proc.poll() is not None:
                result = "exited"
                break
            time.sleep(0.05)
    finally:
        kill_group(proc)
    text = log.read_text(errors="replace")
    if result == "exited":
        result = "oom" if any(m in text for m in OOM_MARKERS) else "other"
    weights = [float(x) for x in LOAD_END.findall(text)]
    tokens = [int(x) for x in KV_TOKENS.findall(text)]
    return {
        "result": result,
        "returncode": proc.returncode,
        "weights_gb": max(weights) if weights else None,
        "kv_tokens": min(tokens) if tokens else None,
        "seconds": round(time.monotonic() - started, 2),
        "log_tail": text[-3000:],
    }


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("k26") / "Kimi-K2.6"
    subprocess.run([sys.executable, str(MAKE_MODEL_DIR), str(dest)], check=True, capture_output=True)
    return dest


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_planner_verdict_matches_the_simulator(name, model_dir, tmp_path):
    flags = LAYOUTS[name]
    planned = plan(CONFIG, GPUS, GPU_GIB, flags, catalog=CATALOG["profiles"], smi_memory_mib=SMI_MIB,
                   release=RELEASE)
    sim = run_sim(model_dir, tmp_path, flags)

    assert sim["result"] in ("serves", "oom"), f"{name}: simulator neither served nor OOMed\n{sim['log_tail']}"
    if "default fraction" in name:  # both must fail where real SGLang 0.5.10 fails: sizing the KV pool
        assert sim["result"] == "oom" and "Not enough memory" in sim["log_tail"], sim["log_tail"]
        assert planned.verdict == "oom" and "Not enough memory" in planned.reason
    if sim["result"] == "serves":
        assert planned.verdict in ("fits", "tight"), f"{name}: simulator serves, planner says {planned.reason}"
    else:
        assert planned.verdict == "oom", f"{name}: simulator OOMs, planner says {planned.verdict}"
        assert sim["returncode"] != 0 or "Received sigquit" in sim["log_tail"]

    if sim["weights_gb"] is not None:  # the layout got past loading
        diff = abs(sim["weights_gb"] - planned.weights_gib_per_gpu) / sim["weights_gb"]
        assert diff <= WEIGHTS_TOLERANCE, (
            f"{name}: planner {planned.weights_gib_per_gpu} GiB vs simulator {sim['weights_gb']} GB per GPU "
            f"({diff:.1%} apart, tolerance {WEIGHTS_TOLERANCE:.0%})"
        )
    if sim["kv_tokens"] is not None:
        ratio = planned.kv_tokens / sim["kv_tokens"]
        low = 1 - KV_OVER if int(flags.get("pp_size", 1)) == 1 else 0.0
        assert low <= ratio <= 1 + KV_OVER, (
            f"{name}: planner {planned.kv_tokens} KV tokens vs simulator {sim['kv_tokens']} ({ratio:.2f}×)"
        )


def test_the_field_oom_is_a_weight_load_oom_on_four_gpus(model_dir, tmp_path):
    """--tp-size 4 --ep-size 2 never reaches "Load weight end" and the planner names the full-host layout."""
    flags = LAYOUTS["adhoc --tp-size 4 --ep-size 2"]
    planned = plan(CONFIG, GPUS, GPU_GIB, flags, catalog=CATALOG["profiles"], smi_memory_mib=SMI_MIB,
                   release=RELEASE)
    sim = run_sim(model_dir, tmp_path, flags)
    assert sim["result"] == "oom" and sim["weights_gb"] is None
    assert planned.gpus_used == 4 and planned.weights_gib_per_gpu > GPU_GIB
    assert planned.suggested_profile == "tp4ep2"


def main() -> None:
    """Print the comparison table (python tests/integration/test_planner_vs_sim.py)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "Kimi-K2.6"
        subprocess.run([sys.executable, str(MAKE_MODEL_DIR), str(model)], check=True, capture_output=True)
        print(
            "| layout | planner verdict | planner weights GiB | planner KV tokens | simulator | "
            "sim weights GB | sim KV tokens | diff |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name, flags in LAYOUTS.items():
            work = Path(tmp) / re.sub(r"\W+", "_", name)
            work.mkdir()
            planned = plan(CONFIG, GPUS, GPU_GIB, flags, catalog=CATALOG["profiles"], smi_memory_mib=SMI_MIB,
                   release=RELEASE)
            sim = run_sim(model, work, flags)
            sw = sim["weights_gb"]
            diff = f"{(planned.weights_gib_per_gpu - sw) / sw:+.1%}" if sw else "-"
            print(
                f"| {name} | {planned.verdict} | {planned.weights_gib_per_gpu} | {planned.kv_tokens} | "
                f"{sim['result']} ({sim['seconds']} s) | {sw if sw is not None else '-'} | "
                f"{sim['kv_tokens'] if sim['kv_tokens'] is not None else '-'} | {diff} |"
            )


if __name__ == "__main__":
    main()
