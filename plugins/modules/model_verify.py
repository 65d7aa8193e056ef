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
author: moefleet
"""

EXAMPLES = r"""
- name: Check the staged model
  model_verify:
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
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.model_files import (
    HEADER_LEN_BYTES,
    ModelDirError,
    check_config,
    expected_shard_size,
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


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "fail_incomplete": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    root = module.params["path"]
    result = {"changed": False, "complete": False, "problems": [], "shards": 0, "total_bytes": 0}
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
        result["complete"] = not result["problems"]
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
