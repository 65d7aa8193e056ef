"""plugins/modules/host_files.py, run as the tests run the collection's modules (python -m, an args file): a role's
directories and small files in one module run; writes only what differs, reports each path it changed, writes
nothing in check mode, and refuses with a sentence what it cannot do."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

ME = pwd.getpwuid(os.geteuid()).pw_name
MY_GROUP = grp.getgrgid(os.getegid()).gr_name


def run(tmp_path: Path, *, check: bool = False, diff: bool = False, **args) -> dict:
    for spec in args.get("files", []) + args.get("directories", []):
        spec.setdefault("owner", ME)
        spec.setdefault("group", MY_GROUP)
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check,
                                                             "_ansible_diff": diff}}))
    out = subprocess.run([sys.executable, "-m", "ansible_collections.moefleet.serving.plugins.modules.host_files",
                          str(args_file)], capture_output=True, text=True, cwd=tmp_path)
    return json.loads(out.stdout)


def mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def test_creates_then_changes_nothing_then_only_what_differs(tmp_path):
    lib, tool = tmp_path / "lib" / "moefleet", tmp_path / "lib" / "moefleet" / "tool"
    args = {"directories": [{"path": str(lib), "mode": "0750"}],
            "files": [{"dest": str(tool), "content": "#!/bin/sh\necho hi\n", "mode": "0755"},
                      {"dest": str(lib / "table.py"), "content": "TABLE = {}\n"}]}
    first = run(tmp_path, **args)
    assert first["changed"] and first["changed_paths"] == [str(lib), str(tool), str(lib / "table.py")], first
    assert tool.read_text() == "#!/bin/sh\necho hi\n" and mode(tool) == "0o755" and mode(lib) == "0o750"
    assert mode(lib / "table.py") == "0o644"
    again = run(tmp_path, **args)
    assert (again["changed"], again["changed_paths"]) == (False, []), again
    # a mode changed by hand, and a file's text: each is put back, and only they are reported
    os.chmod(tool, 0o700)
    (lib / "table.py").write_text("TABLE = {'edited': 1}\n")
    third = run(tmp_path, diff=True, **args)
    assert third["changed_paths"] == [str(tool), str(lib / "table.py")], third
    assert mode(tool) == "0o755" and (lib / "table.py").read_text() == "TABLE = {}\n"
    assert [(d["before"], d["after"]) for d in third["diff"]] == [("TABLE = {'edited': 1}\n", "TABLE = {}\n")]
    assert sorted(p.name for p in lib.iterdir()) == ["table.py", "tool"]  # no temporary file left behind


def test_check_mode_reports_and_writes_nothing(tmp_path):
    target = tmp_path / "new" / "config.json"
    found = run(tmp_path, check=True, directories=[{"path": str(target.parent)}],
                files=[{"dest": str(target), "content": "{}\n", "mode": "0600"}])
    assert (found["changed"], found["changed_paths"]) == (True, [str(target.parent), str(target)]), found
    assert not target.parent.exists()


def test_a_file_whose_directory_is_missing_is_refused_naming_it(tmp_path):
    target = tmp_path / "missing" / "tool"
    found = run(tmp_path, files=[{"dest": str(target), "content": "x\n"}])
    assert found.get("failed") and "list it under directories" in found["msg"], found


def test_a_path_of_the_wrong_kind_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    found = run(tmp_path, directories=[{"path": str(tmp_path / "file")}])
    assert found.get("failed") and "is not a directory" in found["msg"], found
    found = run(tmp_path, files=[{"dest": str(tmp_path / "dir"), "content": "x"}])
    assert found.get("failed") and "is not a regular file" in found["msg"], found


def test_a_bad_mode_or_owner_is_refused_with_a_sentence(tmp_path):
    found = run(tmp_path, files=[{"dest": str(tmp_path / "f"), "content": "x", "mode": "rwx"}])
    assert found.get("failed") and 'an octal mode such as "0644"' in found["msg"], found
    found = run(tmp_path, files=[{"dest": str(tmp_path / "f"), "content": "x", "owner": "no-such-user-here"}])
    assert found.get("failed") and "no such user on this host: no-such-user-here" in found["msg"], found
    assert not (tmp_path / "f").exists()
