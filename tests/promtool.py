"""Prometheus's promtool (and Prometheus itself) on the controller, for the tests: the binaries of Debian's
`prometheus` package (the one the monitoring_server role installs), fetched once with `apt-get download` (apt
checks the archive's signature) and unpacked into ``${XDG_CACHE_HOME:-~/.cache}/moefleet/promtool-<version>/``,
outside the clone."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE = "prometheus"


def _candidate() -> str:
    out = subprocess.run(["apt-cache", "policy", PACKAGE], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            if version and version != "(none)":
                return version
    raise RuntimeError(f"apt knows no {PACKAGE} package here (apt-cache policy {PACKAGE}); run apt-get update "
                       "as root, with Debian's archive in the sources.")


BINARIES = ("promtool", "prometheus")


def path(binary: str = "promtool") -> Path:
    """The path of promtool (or prometheus), downloading Debian's package the first time."""
    version = _candidate()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "moefleet" / f"promtool-{version.replace(':', '_')}"
    if not all((directory / b).exists() for b in BINARIES):
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["apt-get", "download", f"{PACKAGE}={version}"], cwd=tmp, check=True, capture_output=True)
            deb = next(Path(tmp).glob(f"{PACKAGE}_*.deb"))
            subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/x"], check=True)
            for name in BINARIES:
                partial = directory / f"{name}.partial"
                shutil.copy2(f"{tmp}/x/usr/bin/{name}", partial)
                partial.replace(directory / name)
    return directory / binary


def run(*args: str | Path, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(path()), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)
