"""ansible-test sanity on the collection as it ships (`make sanity`, part of `make lint`).

ansible-test must run inside ``.../ansible_collections/moefleet/serving`` and resolves the working directory
through symlinks, so the clone's own link (.ansible/collections) will not do; nor will any directory inside
the clone, where ansible-test lists files with git and skips ignored ones. The collection is built and
installed into a temporary directory, with this directory's ignore file beside it, and tested there.

Each test that needs Python packages runs in a virtualenv ansible-test makes (cached under ~/.ansible/test/venv)
and bootstraps with a get-pip.py it downloads from a host this machine cannot reach, then installs the packages
from PyPI with pip's configuration switched off (PIP_CONFIG_FILE=/dev/null). Its cache gets a stand-in bootstrap
instead: pip from the Python's own ensurepip, then the pinned pip from PyPI verified against the system's CA
file (the pinned pip uses the system's certificates by itself).

ignore-2.19.txt (ansible-test allows no comments in it) holds: missing-gplv3-license for every plugin (the
collection is Apache-2.0, galaxy.yml); shebang for the scripts the sglang_service and sglang_router roles
install on hosts (systemd runs them; they are not modules).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

# Not run here: pslint and shellcheck need pwsh and shellcheck, which nothing installs (no PowerShell, no shell
# scripts in plugins/); changelog reads antsibull-changelog fragments (this collection keeps CHANGELOG.md);
# pylint repeats `make lint`'s ruff over the same files at several times its cost, with a config of its own
# that refuses `_` as a name.
SKIPPED = ["pslint", "shellcheck", "changelog", "pylint"]

GET_PIP_STAND_IN = '''\
"""Stand-in for ansible-test's get-pip.py (written by moefleet's tests/sanity/run.py)."""
import ensurepip
import ssl
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
ensurepip.bootstrap()
cafile = ssl.get_default_verify_paths().openssl_cafile
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--cert", cafile, *args]))
'''


def bootstrap_stand_in() -> None:
    from ansible_test._internal.python_requirements import get_venv_packages

    version = get_venv_packages(SimpleNamespace(version=PYTHON))["pip"]
    path = Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{version.replace('.', '_')}.py"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(GET_PIP_STAND_IN)


def install_collection(work: Path) -> Path:
    env = {**_env(), "ANSIBLE_COLLECTIONS_PATH": str(work)}
    galaxy = str(BIN / "ansible-galaxy")
    subprocess.run([galaxy, "collection", "build", str(ROOT), "--output-path", str(work / "dist")], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    [tarball] = (work / "dist").glob("moefleet-serving-*.tar.gz")
    subprocess.run([galaxy, "collection", "install", "--offline", "--force", "-p", str(work), str(tarball)],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    collection = work / "ansible_collections" / "moefleet" / "serving"
    shutil.copytree(ROOT / "tests" / "sanity", collection / "tests" / "sanity",
                    ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return collection


def _env() -> dict[str, str]:
    """This environment without the clone's ansible.cfg (make exports ANSIBLE_CONFIG)."""
    return {k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"}


def main() -> int:
    started = time.monotonic()
    bootstrap_stand_in()
    skips = [arg for name in SKIPPED for arg in ("--skip-test", name)]
    with tempfile.TemporaryDirectory(prefix="moefleet-sanity-") as work:
        collection = install_collection(Path(work))
        done = subprocess.run([str(BIN / "ansible-test"), "sanity", "--python", PYTHON, "--color", "no", *skips],
                              cwd=collection, env=_env())
    print(f"sanity: {time.monotonic() - started:.0f} s")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
