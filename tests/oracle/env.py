"""The oracle's virtualenvs: real SGLang, one venv per supported release, built once per machine.

``python3 tests/oracle/env.py build`` (``make oracle-env``) creates the venv of every release
plugins/module_utils/sglang_releases.py supports (``build VERSION``: that release's only); ``path [VERSION]``
prints a venv's python (default: the release ``sglang_package_spec`` pins in
roles/moefleet_defaults/defaults/main.yml).
Each lives outside the clone, in ``${XDG_CACHE_HOME:-~/.cache}/moefleet/sglang-oracle-<version>``: adding a
release to SUPPORTED builds a new one and the same tests judge it too. A venv holds ``sglang==<version>``
without its dependencies, plus only what importing ``sglang.srt.server_args`` and its model-config classes
needs (``import_chain``), at the versions that release's own metadata pins where it pins one (transformers,
openai, tokenizers, ...); PyTorch is the CPU build ``TORCH`` (a CUDA build would pull several GB of CUDA wheels
and nothing here runs on a GPU). A venv that already holds its SGLang and ``TORCH`` but an older import chain is
completed in place (the new distributions installed) rather than built again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN_FILE = ROOT / "roles" / "moefleet_defaults" / "defaults" / "main.yml"
RELEASES_FILE = ROOT / "plugins" / "module_utils" / "sglang_releases.py"
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
# What a release's import chain needs beyond IMPORT_CHAIN, found the same way. 0.5.23 builds ServerArgs with
# msgspec (arg_groups/), its resolution imports apache-tvm-ffi, its transformers pin (5.19.0) needs the
# tokenizers it pins (0.23.2) rather than the one transformers would pick, and its tool-call parsers
# (function_call_parser.py, which imports every detector; the chat op) import xgrammar.
IMPORT_CHAIN_ADDED = {
    "0.5.23": ["msgspec", "apache-tvm-ffi", "tokenizers", "xgrammar"],
}
STAMP = ".oracle-ready"


def supported() -> tuple[str, ...]:
    """The SGLang releases moefleet supports: ``SUPPORTED`` in plugins/module_utils/sglang_releases.py, read as
    text (this runs with the system python, which cannot import the collection)."""
    if not RELEASES_FILE.exists():
        raise SystemExit(f"{RELEASES_FILE.relative_to(ROOT)} is missing: it names the SGLang releases moefleet "
                         "supports (SUPPORTED = (...)), one oracle venv each.")
    for node in ast.parse(RELEASES_FILE.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "SUPPORTED" for t in targets) and node.value is not None:
            return tuple(ast.literal_eval(node.value))
    raise SystemExit(f"{RELEASES_FILE.relative_to(ROOT)}: no SUPPORTED = (...) tuple of release strings; the oracle "
                     "builds one venv per release it names.")


def pinned_version() -> str:
    text = PIN_FILE.read_text()
    match = re.search(r'^sglang_package_spec:\s*"?sglang(?:\[[^\]]*\])?==([^"\s]+)"?\s*(?:#.*)?$', text, re.M)
    if not match:
        raise SystemExit(f"{PIN_FILE.relative_to(ROOT)}: sglang_package_spec does not pin one version "
                         "(sglang[...]==X.Y.Z); the oracle needs an exact version to judge against.")
    return match.group(1)


def import_chain(version: str) -> list[str]:
    return IMPORT_CHAIN + IMPORT_CHAIN_ADDED.get(version, [])


def cache_dir(version: str | None = None) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "moefleet" / f"sglang-oracle-{version or pinned_version()}"


def fingerprint(version: str | None = None) -> str:
    """What the venv was built from; a change rebuilds it."""
    version = version or pinned_version()
    return hashlib.sha256(repr((version, TORCH, import_chain(version))).encode()).hexdigest()[:16]


def python(version: str | None = None) -> Path:
    return cache_dir(version) / "bin" / "python"


def ready(version: str | None = None) -> bool:
    stamp = cache_dir(version) / STAMP
    return python(version).exists() and stamp.exists() and stamp.read_text().strip() == fingerprint(version)


def _pip(venv_python: Path, *args: str) -> None:
    subprocess.run([str(venv_python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   check=True)


def _sglang_pins(wheel: Path) -> dict[str, str]:
    """Requirement strings SGLang's wheel gives for the import chain's distributions (unconditional ones)."""
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


def _pinned_chain(version: str, pins: dict[str, str]) -> list[str]:
    return [pins.get(name.lower().replace("_", "-"), name) for name in import_chain(version)]


def _installed(venv_python: Path) -> dict[str, str]:
    """The venv's installed distributions, name -> version (empty if it has no working python)."""
    if not venv_python.exists():
        return {}
    proc = subprocess.run([str(venv_python), "-c", "import importlib.metadata as m, json; print(json.dumps("
                           "{d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))"],
                          text=True, capture_output=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def _complete(version: str) -> bool:
    """Install a grown import chain into a venv that holds this SGLang and TORCH already; False when the venv is
    not one (it is then built from nothing)."""
    venv_python = python(version)
    have = _installed(venv_python)
    torch_pin = TORCH.split("==", 1)[1] if "==" in TORCH else None
    if have.get("sglang") != version or torch_pin is None or have.get("torch", "").split("+")[0] != torch_pin:
        return False
    meta = next(cache_dir(version).glob(f"lib/python*/site-packages/sglang-{version}.dist-info/METADATA"), None)
    if meta is None:
        return False
    print(f"oracle: completing the SGLang {version} venv at {cache_dir(version)} (its import chain changed)")
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(TORCH + "\n")
        _pip(venv_python, "-c", str(constraints), *_pinned_chain(version, _pins(meta.read_text().splitlines())))
    return True


def build(version: str) -> None:
    target = cache_dir(version)
    if ready(version):
        print(f"oracle: SGLang {version} venv ready at {target}")
        return
    start = time.monotonic()
    if _complete(version):
        _check_and_stamp(version, start)
        return
    print(f"oracle: building the SGLang {version} venv at {target}")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    venv_python = python(version)
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(TORCH + "\n")  # nothing below may swap in a CUDA build
        _pip(venv_python, "-c", str(constraints), TORCH)
        subprocess.run([str(venv_python), "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-deps", "-d", tmp, f"sglang=={version}"], check=True)
        wheel = next(Path(tmp).glob("sglang-*.whl"))
        _pip(venv_python, "--no-deps", str(wheel))
        _pip(venv_python, "-c", str(constraints), *_pinned_chain(version, _sglang_pins(wheel)))
    _check_and_stamp(version, start)


def _check_and_stamp(version: str, start: float) -> None:
    target = cache_dir(version)
    check = subprocess.run([str(python(version)), str(ROOT / "tests" / "oracle" / "driver.py")], input="[]",
                           text=True, capture_output=True)
    if check.returncode != 0:
        raise SystemExit(f"oracle: SGLang {version}'s modules do not import in the new venv; a distribution is "
                         "missing from its import chain (IMPORT_CHAIN, IMPORT_CHAIN_ADDED) in tests/oracle/env.py:\n"
                         + check.stderr[-2000:])
    (target / STAMP).write_text(fingerprint(version) + "\n")
    print(f"oracle: SGLang {version} venv ready at {target} (built in {time.monotonic() - start:.0f} s)")


def main(argv: list[str]) -> None:
    if argv[:1] == ["build"] and len(argv) <= 2:
        releases = supported()
        if pinned_version() not in releases:
            raise SystemExit(f"oracle: {PIN_FILE.relative_to(ROOT)} pins SGLang {pinned_version()}, which "
                             f"{RELEASES_FILE.relative_to(ROOT)} does not support; add it to SUPPORTED there.")
        for version in argv[1:] or releases:
            if version not in releases:
                raise SystemExit(f"oracle: SGLang {version} is not a supported release; "
                                 f"{RELEASES_FILE.relative_to(ROOT)} names {', '.join(releases)}.")
            build(version)
    elif argv[:1] == ["path"] and len(argv) <= 2:
        print(python(argv[1] if len(argv) == 2 else None))
    else:
        raise SystemExit("usage: env.py build [VERSION] | path [VERSION]")


if __name__ == "__main__":
    main(sys.argv[1:])
