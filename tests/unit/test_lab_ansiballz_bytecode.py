"""sim/lab/ansiballz_bytecode.py, the lab hosts' cache of compiled module payloads: a payload imported from a second
directory runs from the cache under its own file name; a changed source is compiled again, never served from the
cache; a zip that is not a module payload, and a cache that cannot be written, are zipimport's business as before;
the suite's controller takes the importer from tests/suite.py's environment, and only there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter, as the .pth line lab.py installs does: the hook first, then the payload on sys.path.
PROBE = """
import json, sys, traceback
sys.path.insert(0, {lab!r})
import ansiballz_bytecode
sys.path.insert(0, {zip!r})
import pkg.mod
try:
    pkg.mod.boom()
except RuntimeError:
    where = traceback.extract_tb(sys.exc_info()[2])[-1].filename
print(json.dumps({{"loader": type(pkg.mod.__loader__).__name__, "file": pkg.mod.__file__, "raised_in": where,
                  "says": pkg.mod.SAYS}}))
"""


def payload(path: Path, says: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr("pkg/mod.py", f"SAYS = {says!r}\n\n\ndef boom():\n    raise RuntimeError(SAYS)\n")
    return path


def run(zip_path: Path, cache: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE.format(lab=str(ROOT / "sim" / "lab"), zip=str(zip_path))],
                          env=dict(os.environ, MOEFLEET_LAB_ANSIBALLZ_CACHE=str(cache)), capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def test_a_second_run_uses_the_cache_under_its_own_file_name(tmp_path):
    cache = tmp_path / "cache"
    first = run(payload(tmp_path / "a" / "ansible_x_payload.zip", "one"), cache)
    kept = sorted(cache.iterdir())
    assert len(kept) == 2 and first["loader"] == "PayloadImporter"  # pkg/__init__.py and pkg/mod.py
    os.utime(kept[1], (1, 1))  # read back, not written again
    second = run(payload(tmp_path / "b" / "ansible_x_payload.zip", "one"), cache)
    assert sorted(cache.iterdir()) == kept and kept[1].stat().st_mtime == 1
    where = str(tmp_path / "b" / "ansible_x_payload.zip" / "pkg" / "mod.py")
    assert (second["file"], second["raised_in"], second["says"]) == (where, where, "one")


def test_a_changed_source_is_compiled_again(tmp_path):
    cache = tmp_path / "cache"
    run(payload(tmp_path / "a" / "ansible_x_payload.zip", "one"), cache)
    assert run(payload(tmp_path / "b" / "ansible_x_payload.zip", "two"), cache)["says"] == "two"
    assert len(list(cache.iterdir())) == 3


def test_other_zips_and_an_unwritable_cache_are_left_to_zipimport(tmp_path):
    cache = tmp_path / "cache"
    other = run(payload(tmp_path / "a" / "library.zip", "one"), cache)
    assert other["loader"] == "zipimporter" and not cache.exists()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory would be")
    done = run(payload(tmp_path / "b" / "ansible_x_payload.zip", "one"), blocked / "cache")
    assert (done["loader"], done["says"]) == ("PayloadImporter", "one")


def test_the_suites_controller_python_takes_the_importer_from_its_environment_only(tmp_path):
    """tests/suite.py's environment (sim/lab/controller on PYTHONPATH, the cache's path) puts the importer in every
    Python the suite starts; without the cache's path, or outside the suite, a payload is zipimport's."""
    from suite import CONTROLLER_BYTECODE  # noqa: PLC0415  (tests/suite.py: tests/ is on sys.path, tests/conftest.py)

    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import pkg.mod; "
             "print(type(pkg.mod.__loader__).__name__)")
    zip_path = str(payload(tmp_path / "a" / "ansible_x_payload.zip", "one"))
    cache = tmp_path / "cache"
    suite_env = dict(os.environ, **{**CONTROLLER_BYTECODE, "MOEFLEET_LAB_ANSIBALLZ_CACHE": str(cache)})
    loaders = {}
    for name, env in {"suite": suite_env,
                      "no cache path": {k: v for k, v in suite_env.items() if k != "MOEFLEET_LAB_ANSIBALLZ_CACHE"},
                      # neither variable, even when this test itself runs inside the suite
                      "outside": {k: v for k, v in os.environ.items() if k not in CONTROLLER_BYTECODE}}.items():
        done = subprocess.run([sys.executable, "-c", probe, zip_path], env=env, capture_output=True, text=True,
                              check=True)
        loaders[name] = done.stdout.strip()
    assert loaders == {"suite": "PayloadImporter", "no cache path": "zipimporter", "outside": "zipimporter"}
    assert len(list(cache.iterdir())) == 2
