"""What the oracle tests share: running real SGLang (driver.py in the oracle venv), the argv the product
renders, and the simulator run the way the lab runs it."""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import typing
import urllib.request
from pathlib import Path

import env
import yaml
from argvs import with_value

ROOT = env.ROOT
DRIVER = Path(__file__).resolve().parent / "driver.py"
CATALOG = ROOT / "profiles" / "catalog.yml"
MODEL_CONFIGS = ROOT / "tests" / "data" / "model-configs"
K26_CONFIG = MODEL_CONFIGS / "kimi-k2.6-config.json"
DSV3_CONFIG = MODEL_CONFIGS / "deepseek-v3-config.json"
SIM_SGLANG = ROOT / "sim" / "sglang"
SIM_K26_CONFIG = ROOT / "sim" / "model" / "kimi_k26_config.json"
SIM_DEVNODES = ROOT / "sim" / "gpu" / "devnodes.py"
GPUS, GPU_MEMORY_GIB, SMI_MEMORY_MIB = 8, 94.97, 97887


class OracleMissing(RuntimeError):
    pass


def ask(requests: list[dict], version: str | None = None) -> list[dict]:
    """Answers of real SGLang ``version`` (driver.py in that release's venv; default: the release the roles pin) to
    ``requests``, in order."""
    version = version or env.pinned_version()
    if not env.ready(version):
        raise OracleMissing(
            f"The SGLang {version} oracle venv is not built ({env.cache_dir(version)}): run `make oracle-env` "
            "(it needs PyPI once, then works offline)."
        )
    proc, log = _driver(version)
    proc.stdin.write(json.dumps(requests) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        del _DRIVERS[version]
        proc.wait()
        log.seek(0)
        raise RuntimeError(f"the SGLang {version} oracle driver failed (exit {proc.returncode}):\n"
                           f"{log.read()[-3000:]}")
    return json.loads(line)


# One driver per release for the whole run (driver.py --serve): SGLang is imported once, not once per question.
_DRIVERS: dict[str, tuple[subprocess.Popen, typing.IO[str]]] = {}


def _driver(version: str) -> tuple[subprocess.Popen, typing.IO[str]]:
    if version not in _DRIVERS:
        log = tempfile.TemporaryFile("w+")  # noqa: SIM115  (open for the driver's life; its warnings, read back when it fails)
        proc = subprocess.Popen([str(env.python(version)), str(DRIVER), "--serve"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True)
        _DRIVERS[version] = (proc, log)
    return _DRIVERS[version]


@atexit.register
def _stop_drivers() -> None:
    for proc, _ in _DRIVERS.values():
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def catalog() -> dict:
    return yaml.safe_load(CATALOG.read_text())


def model_config(path: Path = K26_CONFIG) -> dict:
    return json.loads(path.read_text())


def k26_plain_vision_config() -> dict:
    """K2.6 whose vision_config also has plain num_hidden_layers / hidden_size (which SGLang's
    KimiK25VisionConfig does take), at sizes unlike both its defaults (27/1152) and ViT-L (24/1024)."""
    config = model_config()
    config["vision_config"] = {**config["vision_config"], "num_hidden_layers": 32, "hidden_size": 1280}
    return config


def without_mem_fraction(flags: dict) -> dict:
    return {k: v for k, v in flags.items() if k != "mem_fraction_static"}


def rendered_args(flags: dict, service: dict, release: str | None = None) -> list[str]:
    """The argv the sglang_service role renders (roles/sglang_service/vars/main.yml, _sglang_service_args):
    model path, served name, host and port, the served model's flags, the metrics flags, then the flags, through the
    product's own filters, spelled for SGLang ``release`` (default: the release the roles pin)."""
    head = {"model_path": service["sglang_model_path"],
            "served_model_name": service["sglang_service_served_model_name"],
            "host": service["sglang_service_host"], "port": service["sglang_service_port"]}
    return product_filters()["profile_args"]({"flags": {**head, **model_flags(service), **metrics_flags(service, flags),
                                                        **flags}}, release or env.pinned_version())


def model_flags(service: dict) -> dict:
    """The served model's flags as the role computes them (_sglang_service_model_flags), from its variables."""
    return product_filters()["model_flags"](
        service["sglang_service_models"], service["sglang_service_model"], service["sglang_service_tool_call_parser"],
        service["sglang_service_reasoning_parser"], service["sglang_service_sampling_defaults"],
        service["sglang_service_context_length"])


def metrics_flags(service: dict, flags: dict) -> dict:
    """SGLang's metrics flags as the role computes them (_sglang_service_metrics_flags) for the attempt's flags."""
    return product_filters()["metrics_flags"](service["sglang_service_metrics"], flags)


def product_filters() -> dict:
    """The collection's filters (plugins/filter/moefleet.py), by the names Ansible registers them under."""
    from ansible_collections.moefleet.serving.plugins.filter.moefleet import FilterModule

    return FilterModule().filters()


def role_defaults(role: str) -> dict:
    """The role's defaults over those of its dependencies (meta/main.yml), as Ansible sees them in its play."""
    meta = yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text()) or {}
    out: dict = {}
    for dep in meta.get("dependencies") or []:
        out.update(role_defaults(dep if isinstance(dep, str) else dep["role"]))
    defaults = ROOT / "roles" / role / "defaults" / "main.yml"
    return {**out, **((yaml.safe_load(defaults.read_text()) or {}) if defaults.exists() else {})}


def example_inventory_vars() -> dict:
    out: dict = {}
    for path in sorted((ROOT / "inventory" / "example").rglob("*.yml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "all" not in data:
            out.update(data)
    return out


def sglang_fields(server_args: dict) -> dict:
    """The ServerArgs fields the product and the simulator decide or depend on."""
    keys = ["tp_size", "pp_size", "ep_size", "dp_size", "enable_dp_attention", "moe_dense_tp_size",
            "mem_fraction_static", "chunked_prefill_size", "cuda_graph_max_bs", "max_running_requests",
            "disable_piecewise_cuda_graph", "attention_backend", "kv_cache_dtype", "moe_a2a_backend"]
    return {k: server_args.get(k) for k in keys}


# --- the simulator, run as the lab runs it (tests/sim/conftest.py) ---------------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_simulator(args: list[str], timeout: float = 60.0) -> dict:
    """Start sim/sglang with ``args`` on a simulated 8-GPU host; return what it printed in ``server_args=``
    (as text) and, once it serves, ``/server_info`` and the correctness gate's findings on its answers (``answers``:
    check -> problem or None, plugins/module_utils/answer_check.py, with the parsers it reports running); the server
    is stopped before returning."""
    with tempfile.TemporaryDirectory(prefix="oracle-sim-") as tmp:
        root = Path(tmp)
        (root / "gpus.json").write_text(json.dumps({"count": GPUS}))
        (root / "procs").mkdir()
        model = root / "model"
        model.mkdir()
        (model / "config.json").write_text(SIM_K26_CONFIG.read_text())
        port = _free_port()
        home = root / "home"  # the service user's home, where SGLang writes its caches
        home.mkdir()
        environ = {**os.environ, "PYTHONPATH": str(SIM_SGLANG), "SIM_GPU_SPEC": str(root / "gpus.json"),
                   "SIM_GPU_STATE_DIR": str(root / "procs"), "SGLANG_SIM_TIME_SCALE": "0.05", "HOME": str(home)}
        for var in ("SGLANG_SIM_FAULTS", "CUDA_VISIBLE_DEVICES", "TRITON_CACHE_DIR", "HF_HOME", "HF_MODULES_CACHE",
                    "FLASHINFER_WORKSPACE_BASE"):
            environ.pop(var, None)
        if SIM_DEVNODES.exists():  # the driver's device nodes, as a lab host has them
            sys.path.insert(0, str(SIM_DEVNODES.parent))
            import devnodes

            devnodes.create(str(root / "dev"), GPUS)
            environ["SIM_GPU_DEV_DIR"] = str(root / "dev")
        log = root / "server.log"
        args = with_value(with_value(args, "--model-path", str(model)), "--port", str(port))
        argv = [sys.executable, "-m", "sglang.launch_server", *args]
        with open(log, "wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=environ, cwd=tmp,
                                    start_new_session=True)
        info, answers = None, None
        try:
            end = time.monotonic() + timeout
            while time.monotonic() < end and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
                        info = json.loads(r.read())
                        break
                except OSError:
                    time.sleep(0.1)
            if info is not None:
                answers = _gate(f"http://127.0.0.1:{port}", info)
        finally:
            sys.path.insert(0, str(ROOT / "tests"))
            from simproc import kill_group

            kill_group(proc)
        text = log.read_text(errors="replace")
    match = re.search(r"server_args=(ServerArgs\(.*\))", text)
    return {"server_args_line": match.group(1) if match else None, "server_info": info, "answers": answers,
            "log": text[-3000:]}


def _gate(url: str, info: dict) -> dict:
    from ansible_collections.moefleet.serving.plugins.module_utils import answer_check

    found = {}
    for check, body in answer_check.requests(info.get("served_model_name") or "model",
                                             bool(info.get("reasoning_parser")), bool(info.get("tool_call_parser"))):
        _, answer, why = answer_check.ask(url, body, None, 30)
        found[check] = answer_check.judge(check, answer) if answer is not None else f"no answer ({why})"
    return found


def parse_server_args_line(line: str) -> dict:
    """``ServerArgs(a=1, b='x', ...)`` as printed by ``f"{server_args=}"`` -> {field: value}."""
    import ast

    call = ast.parse(line, mode="eval").body
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
