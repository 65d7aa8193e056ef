# Checks of a model directory in the Hugging Face safetensors layout: pure functions over what the
# caller read (config.json text, the index's JSON, each shard's header and size on disk).
# A safetensors file is: 8-byte little-endian header length N, N bytes of JSON header whose tensors
# carry "data_offsets" [begin, end] relative to the end of the header, then the data. Its exact size
# is therefore 8 + N + max(end), which lets a truncated download be told from a complete one.

from __future__ import annotations

import json
import struct

HEADER_LEN_BYTES = 8
# A header larger than this is not a safetensors header (the format caps it at 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024


class ModelDirError(Exception):
    """A model directory problem, with a sentence that names the fix."""


def parse_header_length(first8: bytes) -> int:
    if len(first8) < HEADER_LEN_BYTES:
        raise ModelDirError("file is shorter than a safetensors header")
    (length,) = struct.unpack("<Q", first8)
    if length > MAX_HEADER_BYTES:
        raise ModelDirError(f"header length {length} is implausible: not a safetensors file")
    return length


def expected_shard_size(header_len: int, header_json: bytes) -> int:
    """Exact size of a complete safetensors file, from its header."""
    try:
        header = json.loads(header_json)
    except ValueError as exc:
        raise ModelDirError(f"header is not JSON ({exc})") from exc
    ends = [t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"]
    return HEADER_LEN_BYTES + header_len + max(ends, default=0)


def shards_from_index(index_text: str) -> list[str]:
    """Shard file names that model.safetensors.index.json maps tensors to, in order."""
    try:
        index = json.loads(index_text)
        weight_map = index["weight_map"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelDirError(f"model.safetensors.index.json is not a valid index ({exc})") from exc
    return sorted(set(weight_map.values()))


def check_config(config_text: str) -> dict:
    try:
        config = json.loads(config_text)
    except ValueError as exc:
        raise ModelDirError(f"config.json does not parse ({exc}); download the model again") from exc
    if not isinstance(config, dict) or not ({"architectures", "model_type"} & set(config)):
        raise ModelDirError("config.json has neither architectures nor model_type: not a model config")
    return config


def verify_shards(shards: dict[str, dict]) -> list[str]:
    """Problems found in shards: {name: {"exists", "size", "expected_size" or "error"}} → sentences."""
    problems = []
    for name, info in sorted(shards.items()):
        if not info.get("exists"):
            problems.append(f"{name} is missing")
        elif info.get("error"):
            problems.append(f"{name}: {info['error']}")
        elif info["size"] != info["expected_size"]:
            problems.append(
                f"{name} has {info['size']} bytes, its header says {info['expected_size']} (truncated?)"
            )
    return problems


def local_revision(metadata: dict[str, str | None]) -> str | None:
    """The commit a local-dir download of hf holds: {file: first line of .cache/huggingface/download/<file>.metadata
    or None} -> the one commit all files share, else None (some file missing its record, or two commits)."""
    commits = set(metadata.values())
    return commits.pop() if len(commits) == 1 and None not in commits else None


def bytes_to_download(remote: dict[str, int], local: dict[str, int]) -> int:
    """Bytes still to fetch: each remote file's size less what a same-sized local copy already holds."""
    return sum(size for name, size in remote.items() if local.get(name) != size)


def disk_problem(needed: int, free: int, path: str, reserve: int) -> str | None:
    """A sentence when NEEDED bytes (plus RESERVE) do not fit in FREE bytes of PATH's filesystem."""
    if needed + reserve <= free:
        return None
    gib = 1024**3
    return (f"the model needs {needed / gib:.1f} GiB more in {path} (plus {reserve / gib:.1f} GiB kept free) but its "
            f"filesystem has {free / gib:.1f} GiB free: free space there or point sglang_model_path at a larger disk")
