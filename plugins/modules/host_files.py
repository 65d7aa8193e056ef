#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_files
short_description: Ensure a role's directories and small files in one module run
description:
  - Each role installs a few helpers beside what it serves (a script, a copy of a module_utils file, a small
    configuration). With M(ansible.builtin.copy) each such file costs two module runs on the host (a stat, then a
    copy or a file), every deploy, whether it changed or not; this module checks and writes them all in one.
  - Directories are created when missing (with their parents, as M(ansible.builtin.file) C(state=directory)), and
    their owner, group and mode set. A file is written when its content differs, through a temporary file in the
    same directory renamed over it (a reader sees the old file or the new one, never a part), and its owner, group
    and mode set.
  - Supports check mode (reports what would change, writes nothing) and diff mode (each changed file's text).
  - It logs the paths it was given to the host's journal, not its arguments (each file's whole text).
  - Files that must pass a checker before they replace the old one (systemd units), or that hold a secret, are not
    for this module; use M(ansible.builtin.template) with C(validate), or C(no_log).
options:
  directories:
    description: Directories to ensure, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: An absolute path.
        type: path
        required: true
      mode:
        description: Octal mode, as a string (C("0755")).
        type: str
        default: "0755"
      owner:
        description: Owner's name.
        type: str
        default: root
      group:
        description: Group's name.
        type: str
        default: root
  files:
    description: Files to ensure, in order, after the directories; a file's directory must exist.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: An absolute path.
        type: path
        required: true
      content:
        description: The whole text of the file (read on the controller, for example with
          C(lookup('file', path, rstrip=false))).
        type: str
        required: true
      mode:
        description: Octal mode, as a string (C("0644")).
        type: str
        default: "0644"
      owner:
        description: Owner's name.
        type: str
        default: root
      group:
        description: Group's name.
        type: str
        default: root
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Install the watcher's files
  moefleet.serving.host_files:
    directories:
      - path: /usr/local/lib/moefleet
    files:
      - dest: /usr/local/libexec/moefleet/moefleet-fault-watch
        content: "{{ lookup('file', 'moefleet-fault-watch', rstrip=false) }}"
        mode: "0755"
  register: watcher_files
"""

RETURN = r"""
changed_paths:
  description: The directories and files this run created or changed (content, mode or owner), in order; in check
    mode, those it would.
  returned: always
  type: list
  elements: str
"""

import grp
import os
import pwd
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _ids(owner: str, group: str) -> tuple[int, int]:
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise ValueError(f"no such user on this host: {owner} (create it first, or name another owner)") from None
    try:
        return uid, grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no such group on this host: {group} (create it first, or name another group)") from None


def _mode(text: str, where: str) -> int:
    try:
        value = int(text, 8)
    except (TypeError, ValueError):
        value = -1
    if not 0 <= value <= 0o7777:
        raise ValueError(f"{where}: mode {text!r} is not an octal mode such as \"0644\"")
    return value


def _fix_metadata(path: str, mode: int, uid: int, gid: int, check: bool) -> bool:
    """Set owner, group and mode; whether any differed."""
    st = os.lstat(path)
    changed = False
    if (st.st_uid, st.st_gid) != (uid, gid):
        changed = True
        if not check:
            os.chown(path, uid, gid)
    if stat.S_IMODE(st.st_mode) != mode:
        changed = True
        if not check:
            os.chmod(path, mode)
    return changed


def ensure_directory(spec: dict, check: bool) -> bool:
    path = spec["path"]
    mode = _mode(spec["mode"], path)
    uid, gid = _ids(spec["owner"], spec["group"])
    if os.path.isdir(path):
        return _fix_metadata(path, mode, uid, gid, check)
    if os.path.lexists(path):
        raise ValueError(f"{path} exists and is not a directory: remove it, or choose another path")
    if not check:
        os.makedirs(path, exist_ok=True)
        _fix_metadata(path, mode, uid, gid, False)
    return True


def ensure_file(spec: dict, check: bool) -> tuple[bool, dict | None]:
    """Whether the file changed, and the diff of its text when its content did."""
    dest, content = spec["dest"], spec["content"].encode()
    mode = _mode(spec["mode"], dest)
    uid, gid = _ids(spec["owner"], spec["group"])
    directory = os.path.dirname(dest)
    if os.path.lexists(dest) and not os.path.isfile(dest):
        raise ValueError(f"{dest} exists and is not a regular file: remove it, or choose another path")
    before = None
    if os.path.isfile(dest):
        with open(dest, "rb") as handle:
            before = handle.read()
    if before == content:
        return _fix_metadata(dest, mode, uid, gid, check), None
    diff = {"before_header": dest, "after_header": dest,
            "before": "" if before is None else before.decode(errors="replace"), "after": spec["content"]}
    if check:
        return True, diff
    if not os.path.isdir(directory):
        raise ValueError(f"{dest}: its directory {directory} does not exist: list it under directories first")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(dest)}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True, diff


class _FilesModule(AnsibleModule):
    """Logs the paths it was given, not each file's whole text: AnsibleModule writes every argument to the host's
    journal on every run ("Invoked with ..."), which ansible.builtin.copy, sending the file apart from its
    arguments, does not do either."""

    def _log_invocation(self) -> None:
        paths = [d["path"] for d in self.params["directories"]] + [f["dest"] for f in self.params["files"]]
        self.log(f"Invoked with {len(paths)} paths: {' '.join(paths)}")


def main() -> None:
    owner = {"owner": {"type": "str", "default": "root"}, "group": {"type": "str", "default": "root"}}
    module = _FilesModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True}, "mode": {"type": "str", "default": "0755"}, **owner}},
            "files": {"type": "list", "elements": "dict", "default": [], "options": {
                "dest": {"type": "path", "required": True}, "content": {"type": "str", "required": True},
                "mode": {"type": "str", "default": "0644"}, **owner}},
        },
        supports_check_mode=True,
    )
    check = module.check_mode
    changed_paths, diffs = [], []
    try:
        for spec in module.params["directories"]:
            if ensure_directory(spec, check):
                changed_paths.append(spec["path"])
        for spec in module.params["files"]:
            changed, diff = ensure_file(spec, check)
            if changed:
                changed_paths.append(spec["dest"])
            if diff:
                diffs.append(diff)
    except (ValueError, OSError) as exc:
        module.fail_json(msg=str(exc), changed=bool(changed_paths), changed_paths=changed_paths)
    result = {"changed": bool(changed_paths), "changed_paths": changed_paths}
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
