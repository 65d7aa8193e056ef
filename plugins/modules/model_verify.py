#!/usr/bin/python
# Copyright: moefleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_verify
short_description: Verify a safetensors model directory before SGLang loads it
description:
  - Checks that C(config.json) parses and that every shard that C(model.safetensors.index.json)
    names exists and has exactly the size its safetensors header announces.
  - Reads only the first bytes of each shard, so a 600 GB model is verified in well under a second.
  - Never fails on an incomplete directory by itself; it reports C(complete) so a play can download
    what is missing, then call it again with O(fail_incomplete=true).
options:
  path:
    description: The model directory.
    type: path
    required: true
  fail_incomplete:
    description: Fail with the problems found when the directory is not complete.
    type: bool
    default: false
  revision:
    description:
      - The commit the files must be at. Read from the records C(hf download --local-dir) keeps in
        C(.cache/huggingface/download/); files at another commit, or without a record, are not complete.
    type: str
  checksums:
    description:
      - Also hash every shard and compare it with the sha256 the Hub gave as its ETag (recorded by C(hf download)).
      - "Reads every byte (minutes for a large model): a shard corrupt at the same size is caught."
    type: bool
    default: false
  remote_files:
    description:
      - The files the Hub lists for the revision, name to size in bytes; the module then returns
        RV(bytes_needed) and RV(space_problem) for the filesystem that holds O(path).
    type: dict
  reserve_bytes:
    description: Bytes to keep free beyond the download.
    type: int
    default: 0
author: moefleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the staged model
  moefleet.serving.model_verify:
    path: /srv/models/Kimi-K2.6
    fail_incomplete: true
"""

RETURN = r"""
complete:
  description: Whether config.json parses and every indexed shard is whole.
  returned: always
  type: bool
problems:
  description: One sentence per problem found.
  returned: always
  type: list
  elements: str
shards:
  description: Number of shards the index names.
  returned: always
  type: int
total_bytes:
  description: Bytes on disk of the indexed shards (apparent size).
  returned: always
  type: int
architectures:
  description: The model's architectures from config.json.
  returned: when config.json parses
  type: list
revision:
  description: The commit every file was downloaded at (from hf's records), or null.
  returned: always
  type: str
free_bytes:
  description: Free bytes on the filesystem that holds the path (or its nearest existing parent).
  returned: always
  type: int
bytes_needed:
  description: Bytes of O(remote_files) not yet on disk at their size.
  returned: when remote_files is given
  type: int
space_problem:
  description: A sentence when the download does not fit, else null.
  returned: when remote_files is given
  type: str
"""

import contextlib
import hashlib
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.moefleet.serving.plugins.module_utils.model_files import (
    HEADER_LEN_BYTES,
    ModelDirError,
    bytes_to_download,
    check_config,
    disk_problem,
    expected_shard_size,
    local_revision,
    parse_header_length,
    shards_from_index,
    verify_shards,
)


def read_text(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def inspect_shard(path):
    if not os.path.isfile(path):
        return {"exists": False}
    size = os.stat(path).st_size
    try:
        with open(path, "rb") as handle:
            header_len = parse_header_length(handle.read(HEADER_LEN_BYTES))
            expected = expected_shard_size(header_len, handle.read(header_len))
    except ModelDirError as exc:
        return {"exists": True, "size": size, "error": str(exc)}
    return {"exists": True, "size": size, "expected_size": expected}


def hf_record(root, name):
    """(commit, etag) from hf's local-dir record of NAME, or (None, None)."""
    try:
        with open(os.path.join(root, ".cache", "huggingface", "download", name + ".metadata"), encoding="utf-8") as f:
            return f.readline().strip() or None, f.readline().strip() or None
    except OSError:
        return None, None


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 * 1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def free_bytes(path):
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "fail_incomplete": {"type": "bool", "default": False},
            "revision": {"type": "str"},
            "checksums": {"type": "bool", "default": False},
            "remote_files": {"type": "dict"},
            "reserve_bytes": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    root = module.params["path"]
    result = {"changed": False, "complete": False, "problems": [], "shards": 0, "total_bytes": 0,
              "revision": None, "free_bytes": free_bytes(root)}
    names = []
    try:
        config = check_config(read_text(os.path.join(root, "config.json")))
        result["architectures"] = config.get("architectures", [])
        names = shards_from_index(read_text(os.path.join(root, "model.safetensors.index.json")))
    except FileNotFoundError as exc:
        result["problems"].append(f"{os.path.basename(exc.filename)} is missing from {root}")
    except ModelDirError as exc:
        result["problems"].append(str(exc))
    else:
        shards = {name: inspect_shard(os.path.join(root, name)) for name in names}
        result["shards"] = len(names)
        result["total_bytes"] = sum(s.get("size", 0) for s in shards.values())
        result["problems"] = verify_shards(shards)
        if module.params["checksums"] and not result["problems"]:
            for name in names:
                etag = hf_record(root, name)[1]
                if etag and re.fullmatch(r"[0-9a-f]{64}", etag) and sha256_of(os.path.join(root, name)) != etag:
                    result["problems"].append(f"{name} does not match the sha256 the Hub gave for it "
                                              "(corrupt: delete it and rerun to fetch it again)")
    records = {n: hf_record(root, n)[0] for n in ["config.json", *names]}
    result["revision"] = local_revision(records)
    wanted = module.params["revision"]
    if wanted and not result["problems"] and result["revision"] != wanted:
        result["problems"].append(f"the files are at revision {result['revision'] or 'unknown'}, not {wanted}")
    result["complete"] = not result["problems"] and bool(names)
    remote = module.params["remote_files"]
    if remote is not None:
        local = {}
        for name in remote:
            with contextlib.suppress(OSError):
                local[name] = os.stat(os.path.join(root, name)).st_size
        result["bytes_needed"] = bytes_to_download({k: int(v) for k, v in remote.items()}, local)
        result["space_problem"] = disk_problem(result["bytes_needed"], result["free_bytes"], root,
                                               module.params["reserve_bytes"])
    if module.params["fail_incomplete"] and not result["complete"]:
        module.fail_json(
            msg=f"The model in {root} is incomplete: "
            + "; ".join(result["problems"][:10])
            + ". Download it again (or re-stage it) before starting SGLang.",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
