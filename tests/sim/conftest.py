"""Fixtures for the simulator's tests: isolated GPU spec/state, a model dir, a server launcher."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from simproc import free_port

ROOT = Path(__file__).resolve().parents[2]
SIM_SGLANG = ROOT / "sim" / "sglang"
NVIDIA_SMI = ROOT / "sim" / "gpu" / "nvidia-smi"
NVCC = ROOT / "sim" / "gpu" / "nvcc"
K26_CONFIG = ROOT / "sim" / "model" / "kimi_k26_config.json"
MAKE_MODEL_DIR = ROOT / "sim" / "model" / "make_model_dir.py"
SCALE = "0.05"

if str(SIM_SGLANG) not in sys.path:
    sys.path.insert(0, str(SIM_SGLANG))
if str(ROOT / "sim" / "gpu") not in sys.path:
    sys.path.insert(0, str(ROOT / "sim" / "gpu"))

import devnodes  # noqa: E402


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """An isolated simulated host: GPU spec, process-state dir and a K2.6 model dir (config only)."""
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps({"count": 8}))
    state = tmp_path / "procs"
    state.mkdir()
    model = tmp_path / "Kimi-K2.6"
    model.mkdir()
    shutil.copy(K26_CONFIG, model / "config.json")
    dev = tmp_path / "dev"  # the driver's device nodes, as on a lab host (sim/gpu/devnodes.py)
    try:
        devnodes.create(str(dev), 8)
    except PermissionError:
        pytest.skip("creating the stand-in /dev/nvidia* nodes needs root (CAP_MKNOD)")
    home = tmp_path / "home"  # the service user's home: Triton, FlashInfer and SGLang caches
    home.mkdir()
    monkeypatch.setenv("SIM_GPU_DEV_DIR", str(dev))
    monkeypatch.setenv("HOME", str(home))
    for var in ("TRITON_CACHE_DIR", "HF_HOME", "HF_MODULES_CACHE", "FLASHINFER_WORKSPACE_BASE", "CC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SIM_GPU_SPEC", str(spec))
    monkeypatch.setenv("SIM_GPU_STATE_DIR", str(state))
    monkeypatch.setenv("SIM_GPU_RUN_DIR", str(tmp_path / "run"))  # lost GPUs, NCCL hang (lab.py fault)
    monkeypatch.setenv("SGLANG_SIM_TIME_SCALE", SCALE)
    monkeypatch.delenv("SGLANG_SIM_FAULTS", raising=False)
    monkeypatch.delenv("SGLANG_SIM_RELEASE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lab = Lab(tmp_path, spec, state, model)
    lab.dev, lab.home = dev, home
    yield lab
    lab.cleanup()


class Server:
    def __init__(self, proc: subprocess.Popen, log: Path, port: int):
        self.proc, self.log_path, self.port = proc, log, port

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, headers: dict | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url(path), headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_ready(self, timeout: float = 20.0) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited rc={self.proc.returncode}\n{self.log[-3000:]}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("server not ready\n" + self.log[-3000:])

    def wait_log(self, text: str, timeout: float = 20.0) -> None:
        """Until the log has `text` (the server's pace on a loaded machine is not the test's business)."""
        end = time.time() + timeout
        while text not in self.log:
            if time.time() > end:
                raise AssertionError(f"no {text!r} in the log within {timeout:.0f} s\n{self.log[-3000:]}")
            time.sleep(0.05)

    def wait_exit(self, timeout: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError("server still running\n" + self.log[-3000:]) from exc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Lab:
    def __init__(self, root: Path, spec: Path, state: Path, model: Path):
        self.root, self.spec, self.state, self.model = root, spec, state, model
        self.servers: list[Server] = []

    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(SIM_SGLANG)
        env.update({k: v for k, v in extra.items() if v is not None})
        return env

    def start(self, *flags: str, faults: list | None = None, port: int | None = None,
              env: dict | None = None, wrap: tuple[str, ...] = (), release: str | None = None) -> Server:
        """The simulator from the source tree, as SGLang ``release`` (SGLANG_SIM_RELEASE, sim-only: an installed
        simulator is the release of its wheel) or sim/sglang/pyproject.toml's."""
        port = port or free_port()
        log = self.root / f"server-{len(self.servers)}.log"
        extra = dict(env or {})
        if faults is not None:
            extra["SGLANG_SIM_FAULTS"] = json.dumps(faults)
        if release is not None:
            extra["SGLANG_SIM_RELEASE"] = release
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [*wrap, sys.executable, "-m", "sglang.launch_server", "--model-path", str(self.model),
                 "--port", str(port), *flags],
                stdout=fh, stderr=subprocess.STDOUT, env=self.env(**extra), cwd=self.root)
        srv = Server(proc, log, port)
        self.servers.append(srv)
        return srv

    def smi(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(NVIDIA_SMI), *args], capture_output=True, text=True,
                              env=self.env(), check=check)

    def used_mib(self) -> list[int]:
        out = self.smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout
        return [int(x) for x in out.split()]

    def apps(self) -> list[list[str]]:
        out = self.smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader").stdout
        return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]

    def cleanup(self) -> None:
        # SIGKILL, not stop(): a test that cares how the server ends stops it itself, and SIGTERM's drain waits
        # for the watchdog's next look (about 5 s a server). The ranks die with their parent (PDEATHSIG).
        for s in self.servers:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()
        for f in self.state.glob("*.json"):  # stale holders and anything left
            try:
                rec = json.loads(f.read_text())
                os.kill(int(rec["pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
