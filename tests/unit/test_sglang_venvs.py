"""plugins/modules/sglang_venvs.py: each SGLang release in a virtualenv of its own under /opt/sglang, side by side.
A deploy keeps the one it installed, the ones the installed unit and the last good unit run (the rollback switches
back to them without pip), then the newest others up to `keep`; it removes the rest, and nothing in check mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ansible_collections.moefleet.serving.plugins.modules import sglang_venvs

UNIT = ("[Service]\nExecStart=/usr/local/libexec/moefleet/sglang-redact %d/sglang-secrets.yaml -- "
        "{venv}/bin/python -m sglang.launch_server --model-path /srv/models/Kimi-K2.6 --tp-size 8 "
        "--config %d/sglang-secrets.yaml\n")


def venv(root: Path, name: str, release: str | None, age: int) -> Path:
    """A virtualenv as pip leaves it: bin/python (a link to the system's), SGLang's dist-info; `age` seconds old."""
    path = root / name
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    if release:
        (path / "lib" / "python3.11" / "site-packages" / f"sglang-{release}.dist-info").mkdir(parents=True)
    when = 1_800_000_000 - age
    os.utime(path / "bin" / "python", (when, when), follow_symlinks=False)
    return path


def run(tmp_path: Path, *, check: bool = False, **args) -> dict:
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "unit_file": str(tmp_path / "sglang.service"), "record_file": str(tmp_path / "last-good.json"),
        **args, "_ansible_check_mode": check}}))
    out = subprocess.run([sys.executable, "-m", "ansible_collections.moefleet.serving.plugins.modules.sglang_venvs",
                          str(args_file)], capture_output=True, text=True, cwd=tmp_path)
    return json.loads(out.stdout)


def test_an_upgrade_keeps_the_release_it_leaves_and_removes_the_older(tmp_path):
    root = tmp_path / "opt-sglang"
    oldest = venv(root, "0.5.9", "0.5.9", age=300)
    legacy = venv(root, "venv", "0.5.10", age=200)  # moefleet's one venv before releases sat side by side
    old = venv(root, "0.5.10", "0.5.10", age=100)
    new = venv(root, "0.5.23", "0.5.23", age=0)
    (root / "notes").mkdir()  # not a virtualenv: never touched
    # the unit still runs 0.5.10 (this deploy has not restarted it yet); the last good record names it too
    (tmp_path / "sglang.service").write_text(UNIT.format(venv=old))
    (tmp_path / "last-good.json").write_text(json.dumps({"attempt": {}, "unit": UNIT.format(venv=old)}))
    found = run(tmp_path, root=str(root), current=str(new), keep=2)
    assert [(v["path"], v["release"], v["kept"]) for v in found["venvs"]] == [
        (str(new), "0.5.23", "current"), (str(old), "0.5.10", "installed unit"), (str(legacy), "0.5.10", "newest"),
        (str(oldest), "0.5.9", None)], found
    assert found["changed"] and found["removed"] == [str(oldest)]
    assert not oldest.exists() and legacy.exists() and old.exists() and (root / "notes").is_dir()


def test_the_last_good_units_release_is_kept_beyond_keep(tmp_path):
    root = tmp_path / "opt-sglang"
    rolled_back_to = venv(root, "0.5.10", "0.5.10", age=300)
    other = venv(root, "0.5.22", "0.5.22", age=100)
    current = venv(root, "0.5.23", "0.5.23", age=0)
    (tmp_path / "last-good.json").write_text(json.dumps({"unit": UNIT.format(venv=rolled_back_to)}))
    found = run(tmp_path, root=str(root), current=str(current), keep=1)
    assert {v["path"]: v["kept"] for v in found["venvs"]} == {
        str(current): "current", str(other): None, str(rolled_back_to): "last good unit"}, found
    assert not other.exists() and rolled_back_to.exists()


def test_check_mode_names_what_would_go_and_removes_nothing(tmp_path):
    root = tmp_path / "opt-sglang"
    old = venv(root, "0.5.9", "0.5.9", age=100)
    current = venv(root, "0.5.10", "0.5.10", age=0)
    found = run(tmp_path, check=True, root=str(root), current=str(current), keep=1)
    assert (found["changed"], found["removed"]) == (True, [str(old)]) and old.exists()


def test_nothing_to_prune_changes_nothing(tmp_path):
    root = tmp_path / "opt-sglang"
    current = venv(root, "0.5.10", "0.5.10", age=0)
    found = run(tmp_path, root=str(root), current=str(current))
    assert (found["changed"], found["removed"]) == (False, []) and current.exists()
    assert run(tmp_path, root=str(tmp_path / "none"), current=str(current))["venvs"] == []  # a bare host


def test_keep_below_one_is_refused_with_a_sentence(tmp_path):
    found = run(tmp_path, root=str(tmp_path), current=str(tmp_path / "0.5.10"), keep=0)
    assert found.get("failed") and "keep at least 1 virtualenv" in found["msg"], found


def test_the_venv_a_unit_runs_is_read_from_its_exec_start():
    assert sglang_venvs.venv_of_unit(UNIT.format(venv="/opt/sglang/0.5.23")) == "/opt/sglang/0.5.23"
    plain = ("[Service]\nExecStartPre=/x/bin/python -c 1\n"
             "ExecStart=/opt/sglang/venv/bin/python3 -m sglang.launch_server\n")
    assert sglang_venvs.venv_of_unit(plain) == "/opt/sglang/venv"
    assert sglang_venvs.venv_of_unit("[Service]\nExecStart=/usr/bin/sleep 1\n") is None
