"""Prometheus's promtool on the controller, for the tests: the binary of Debian's `prometheus` package (the one the
monitoring_server role installs), fetched once with `apt-get download` (apt checks the archive's signature) and
unpacked into ``${XDG_CACHE_HOME:-~/.cache}/moefleet/promtool-<version>/``, outside the clone."""

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


def path() -> Path:
    """promtool's path, downloading Debian's package the first time."""
    version = _candidate()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = base / "moefleet" / f"promtool-{version.replace(':', '_')}" / "promtool"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", f"{PACKAGE}={version}"], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob(f"{PACKAGE}_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/x"], check=True)
        partial = target.with_suffix(".partial")
        shutil.copy2(f"{tmp}/x/usr/bin/promtool", partial)
        partial.replace(target)
    return target


def run(*args: str | Path, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(path()), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)
