#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_venvs
short_description: Keep the newest SGLang virtualenvs side by side and remove the older ones
description:
  - Each SGLang release is installed into a virtualenv of its own under O(root) (C(/opt/sglang/0.5.10),
    C(/opt/sglang/0.5.23)), and the unit names the one it runs. A rollback to the unit that served last then
    switches releases without pip; this module bounds the disk they take.
  - A virtualenv is a directory directly under O(root) that holds C(bin/python). Kept are O(current) (the one the
    run installed), every one that the installed unit (O(unit_file)) or the last good record (O(record_file), the
    unit it holds) runs, and then the newest others (by the time their C(bin/python) was made) until O(keep) are
    kept. The others are removed.
  - Reports each virtualenv with its SGLang release (from its C(sglang-*.dist-info)) and why it was kept or removed.
  - Supports check mode (reports what it would remove).
options:
  root:
    description: The directory holding one virtualenv per release.
    type: path
    required: true
  current:
    description: The virtualenv this run installed or checked; always kept.
    type: path
    required: true
  keep:
    description: How many virtualenvs to keep at most, counting O(current) (those a unit runs are kept beyond it).
    type: int
    default: 2
  unit_file:
    description: The installed unit; the virtualenv its C(ExecStart=) runs is kept.
    type: path
    default: /etc/systemd/system/sglang.service
  record_file:
    description: The last good record (JSON with the unit's text under C(unit)); the virtualenv that unit runs is kept.
    type: path
    default: /var/lib/moefleet/last-good.json
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Keep the two newest SGLang releases and those a unit runs
  moefleet.serving.sglang_venvs:
    root: /opt/sglang
    current: /opt/sglang/0.5.23
    keep: 2
"""

RETURN = r"""
venvs:
  description: Every virtualenv found under O(root), newest first.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The virtualenv.
      type: str
    release:
      description: The SGLang version installed in it, or null.
      type: str
    kept:
      description: Why it was kept (C(current), C(installed unit), C(last good unit), C(newest)), or null when removed.
      type: str
removed:
  description: The virtualenvs removed (in check mode, those that would be).
  returned: always
  type: list
  elements: str
"""

import glob
import json
import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule

# The interpreter of a unit's ExecStart= (after the optional output filter's "--"): <venv>/bin/python[3...].
_VENV_OF_EXEC = re.compile(r"(?:^|\s)(/\S+)/bin/python[0-9.]*\s")


def venv_of_unit(text: str) -> str | None:
    """The virtualenv a unit's ExecStart= runs, or None."""
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            match = _VENV_OF_EXEC.search(line[len("ExecStart="):] + " ")
            if match:
                return os.path.normpath(match.group(1))
    return None


def release_in(venv: str) -> str | None:
    """The SGLang version a virtualenv holds (its sglang-<version>.dist-info), or None."""
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "sglang-*.dist-info")))
    return os.path.basename(found[-1])[len("sglang-"):-len(".dist-info")] if found else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def plan(root: str, current: str, keep: int, in_use: dict[str, str]) -> list[dict]:
    """Every virtualenv under root, newest first, each with why it is kept (None: to remove)."""
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        path = os.path.join(root, name)
        python = os.path.join(path, "bin", "python")
        if os.path.isdir(path) and not os.path.islink(path) and os.path.lexists(python):
            found.append((os.lstat(python).st_mtime, path))
    found.sort(reverse=True)
    current = os.path.normpath(current)
    kept = 1 if any(path == current for _, path in found) else 0
    out = []
    for _, path in found:
        if path == current:
            why = "current"
        elif path in in_use:
            why = in_use[path]
        elif kept < keep:
            why, kept = "newest", kept + 1
        else:
            why = None
        out.append({"path": path, "release": release_in(path), "kept": why})
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "current": {"type": "path", "required": True},
            "keep": {"type": "int", "default": 2},
            "unit_file": {"type": "path", "default": "/etc/systemd/system/sglang.service"},
            "record_file": {"type": "path", "default": "/var/lib/moefleet/last-good.json"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["keep"] < 1:
        module.fail_json(msg=f"keep is {params['keep']}: keep at least 1 virtualenv (the one this run installed)")
    in_use = {}
    try:
        record_unit = json.loads(_read(params["record_file"]) or "{}").get("unit", "")
    except ValueError:
        record_unit = ""
    for text, why in ((record_unit, "last good unit"), (_read(params["unit_file"]), "installed unit")):
        venv = venv_of_unit(text) if isinstance(text, str) else None
        if venv:
            in_use[venv] = why
    venvs = plan(os.path.normpath(params["root"]), params["current"], params["keep"], in_use)
    removed = [v["path"] for v in venvs if v["kept"] is None]
    if not module.check_mode:
        for path in removed:
            shutil.rmtree(path)
    module.exit_json(changed=bool(removed), venvs=venvs, removed=removed)


if __name__ == "__main__":
    main()
