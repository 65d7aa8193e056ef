"""The oracle's virtualenv: real SGLang at the version the product pins, built once per machine.

``python3 tests/oracle/env.py build`` (``make oracle-env``) creates it from nothing; ``path`` prints its
python. It lives outside the clone, in ``${XDG_CACHE_HOME:-~/.cache}/moefleet/sglang-oracle-<version>``,
keyed by the version ``sglang_package_spec`` pins in roles/sglang/defaults/main.yml: bumping the pin
builds a new one and the same tests judge the new release. It holds ``sglang==<pin>`` without its
dependencies, plus only what importing ``sglang.srt.server_args`` and its model-config classes needs
(IMPORT_CHAIN below), at the versions SGLang's own metadata pins where it pins one (transformers,
openai); PyTorch is the CPU build ``TORCH`` (a CUDA build would pull several GB of CUDA wheels and
nothing here runs on a GPU). A venv that already holds the pinned SGLang and ``TORCH`` but an older
IMPORT_CHAIN is completed in place (the new distributions installed) rather than built again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN_FILE = ROOT / "roles" / "sglang" / "defaults" / "main.yml"
TORCH = os.environ.get("MOEFLEET_ORACLE_TORCH", "torch==2.13.0")
# Distributions importing sglang.srt.server_args and sglang.srt.configs pulls in (found by importing
# them in an empty venv until nothing was missing); versions from SGLang's Requires-Dist where it has one.
IMPORT_CHAIN = [
    "transformers", "openai", "triton", "compressed-tensors", "gguf", "IPython", "aiohttp", "orjson",
    "pybase64", "requests", "pillow", "starlette", "partial_json_parser", "pyzmq", "dill", "sentencepiece",
    "psutil", "pydantic", "pyyaml",
    # the metrics collectors (observability/metrics_collector.py) import it when built: tests/oracle/metrics.py
    "prometheus-client",
]
STAMP = ".oracle-ready"


def pinned_version() -> str:
    text = PIN_FILE.read_text()
    match = re.search(r'^sglang_package_spec:\s*"?sglang(?:\[[^\]]*\])?==([^"\s]+)"?\s*$', text, re.M)
    if not match:
        raise SystemExit(f"{PIN_FILE.relative_to(ROOT)}: sglang_package_spec does not pin one version "
                         "(sglang[...]==X.Y.Z); the oracle needs an exact version to judge against.")
    return match.group(1)


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "moefleet" / f"sglang-oracle-{pinned_version()}"


def fingerprint() -> str:
    """What the venv was built from; a change rebuilds it."""
    return hashlib.sha256(repr((pinned_version(), TORCH, IMPORT_CHAIN)).encode()).hexdigest()[:16]


def python() -> Path:
    return cache_dir() / "bin" / "python"


def ready() -> bool:
    stamp = cache_dir() / STAMP
    return python().exists() and stamp.exists() and stamp.read_text().strip() == fingerprint()


def _pip(venv_python: Path, *args: str) -> None:
    subprocess.run([str(venv_python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   check=True)


def _sglang_pins(wheel: Path) -> dict[str, str]:
    """Requirement strings SGLang's wheel gives for the IMPORT_CHAIN distributions (unconditional ones)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return _pins(zf.read(meta).decode().splitlines())


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        if line.startswith("Requires-Dist:") and ";" not in line:
            req = line.split(":", 1)[1].strip()
            name = re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0]
            pins[name.lower().replace("_", "-")] = req
    return pins


def _installed(venv_python: Path) -> dict[str, str]:
    """The venv's installed distributions, name -> version (empty if it has no working python)."""
    if not venv_python.exists():
        return {}
    proc = subprocess.run([str(venv_python), "-c", "import importlib.metadata as m, json; print(json.dumps("
                           "{d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))"],
                          text=True, capture_output=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def _complete(venv_python: Path, version: str) -> bool:
    """Install a grown IMPORT_CHAIN into a venv that holds the pinned SGLang and TORCH already; False when the
    venv is not one (it is then built from nothing)."""
    have = _installed(venv_python)
    torch_pin = TORCH.split("==", 1)[1] if "==" in TORCH else None
    if have.get("sglang") != version or torch_pin is None or have.get("torch", "").split("+")[0] != torch_pin:
        return False
    meta = next(cache_dir().glob(f"lib/python*/site-packages/sglang-{version}.dist-info/METADATA"), None)
    if meta is None:
        return False
    pins = _pins(meta.read_text().splitlines())
    print(f"oracle: completing the SGLang {version} venv at {cache_dir()} (IMPORT_CHAIN changed)")
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(TORCH + "\n")
        _pip(venv_python, "-c", str(constraints), *[pins.get(n.lower().replace("_", "-"), n) for n in IMPORT_CHAIN])
    return True


def build() -> None:
    version = pinned_version()
    target = cache_dir()
    if ready():
        print(f"oracle: SGLang {version} venv ready at {target}")
        return
    if _complete(python(), version):
        _check_and_stamp(python(), target, version)
        return
    print(f"oracle: building the SGLang {version} venv at {target}")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    venv_python = python()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(TORCH + "\n")  # nothing below may swap in a CUDA build
        _pip(venv_python, "-c", str(constraints), TORCH)
        subprocess.run([str(venv_python), "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-deps", "-d", tmp, f"sglang=={version}"], check=True)
        wheel = next(Path(tmp).glob("sglang-*.whl"))
        _pip(venv_python, "--no-deps", str(wheel))
        pins = _sglang_pins(wheel)
        chain = [pins.get(name.lower().replace("_", "-"), name) for name in IMPORT_CHAIN]
        _pip(venv_python, "-c", str(constraints), *chain)
    _check_and_stamp(venv_python, target, version)


def _check_and_stamp(venv_python: Path, target: Path, version: str) -> None:
    check = subprocess.run([str(venv_python), str(ROOT / "tests" / "oracle" / "driver.py")], input="[]",
                           text=True, capture_output=True)
    if check.returncode != 0:
        raise SystemExit("oracle: SGLang's modules do not import in the new venv; a distribution is missing "
                         "from IMPORT_CHAIN in tests/oracle/env.py:\n" + check.stderr[-2000:])
    (target / STAMP).write_text(fingerprint() + "\n")
    print(f"oracle: SGLang {version} venv ready at {target}")


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        build()
    elif sys.argv[1:] == ["path"]:
        print(python())
    else:
        raise SystemExit("usage: env.py build | path")
