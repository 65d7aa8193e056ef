#!/usr/bin/env python3
"""The lab's stand-in of the Hugging Face Hub: build its content, run it in the lab's mirror container.

    hub.py build [MIRROR_DIR]   the test models into MIRROR_DIR/hub (default: the lab's mirror directory),
                                and the real hf client's wheels (huggingface_hub and its dependencies,
                                fetched once with pip download into .lab/hub-wheels) as a PEP 503 index
                                at MIRROR_DIR/hub/pypi/simple/
    hub.py up                   start server.py inside the mirror container (http://moefleet-mirror:8081),
                                unless it already answers
    hub.py serve [--port P]     run server.py here, in the foreground (tests, a look by hand)

Test and demo equipment: product code never names it. The models are small and deterministic, so their
commit hashes are constants (REVISIONS below; inventory/sim carries the same values).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "sim" / "mirrors"))
import build as mirrors  # noqa: E402 - the lab's wheel fetcher and package index writer

LAB = Path(os.environ.get("MOEFLEET_LAB_DIR", REPO / ".lab"))
HUB_PORT = 8081
MIRROR_CONTAINER = "moefleet-mirror"
# The token the lab's Hub accepts (a test sentinel: tests look for it where no secret may be).
LAB_HF_TOKEN = "hf_MoefleetLabSentinelToken7Qx9Zp"
# huggingface_hub as SGLang 0.5.10's dependencies resolve it today (sglang[all] installs it on real hosts).
HF_CLIENT_SPEC = "huggingface_hub==1.33.0"
GATED_REPO = "moefleet-lab/tiny-moe"
TOO_BIG_REPO = "moefleet-lab/too-big"
# Above huggingface_hub's 10 MiB write chunk, so an interrupted download leaves bytes to resume from.
SHARD_TENSOR_BYTES = 12 * 1024 * 1024


def _safetensors(name: str, seed: str) -> bytes:
    data = random.Random(seed).randbytes(SHARD_TENSOR_BYTES)
    header = json.dumps({"__metadata__": {"format": "pt"},
                         name: {"dtype": "U8", "shape": [SHARD_TENSOR_BYTES], "data_offsets": [0, SHARD_TENSOR_BYTES]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


# The tiny gated model's config: Kimi K2.6's text config (sim/model) at toy sizes, a complete DeepSeek-V3-style
# config, so that the planner (preflight) and the simulated SGLang serve it as they serve K2.6.
TINY_SIZES = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 16, "num_key_value_heads": 16,
              "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
              "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 16, "num_experts_per_tok": 2,
              "n_shared_experts": 1, "first_k_dense_replace": 1, "vocab_size": 1024, "max_position_embeddings": 4096,
              "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0, "dtype": "bfloat16"}


def tiny_config(version: int) -> dict:
    text = json.loads((REPO / "sim" / "model" / "kimi_k26_config.json").read_text())["text_config"]
    config = {k: v for k, v in text.items() if k not in ("quantization_config", "auto_map")}
    return {**config, **TINY_SIZES, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "moefleet_lab_version": version}


def model_files(version: int) -> dict[str, bytes]:
    """The tiny gated model at its version 1 or 2 (2 changes config.json and the second shard)."""
    config = tiny_config(version)
    index = {"metadata": {"total_size": 2 * SHARD_TENSOR_BYTES},
             "weight_map": {"layers.0.w": "model-00001-of-00002.safetensors",
                            "layers.1.w": "model-00002-of-00002.safetensors"}}
    return {
        "config.json": (json.dumps(config, indent=2) + "\n").encode(),
        "model.safetensors.index.json": (json.dumps(index, indent=2) + "\n").encode(),
        "model-00001-of-00002.safetensors": _safetensors("layers.0.w", "shard1"),
        "model-00002-of-00002.safetensors": _safetensors("layers.1.w", f"shard2-v{version}"),
    }


def git_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _commit(files: dict[str, dict], parent: str) -> str:
    return hashlib.sha1(json.dumps([parent, files], sort_keys=True).encode()).hexdigest()


def build_hub(out: Path) -> dict:
    """Write repos/, blobs/ and tokens.json under OUT; return {repo: [commit, ...]} oldest first."""
    blobs = out / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    revisions: dict[str, list[str]] = {}

    def entry(name: str, content: bytes) -> dict:
        sha = hashlib.sha256(content).hexdigest()
        if not (blobs / sha).exists():
            (blobs / f"{sha}.tmp").write_bytes(content)
            (blobs / f"{sha}.tmp").rename(blobs / sha)
        return {"oid": git_oid(content), "sha256": sha, "size": len(content), "lfs": name.endswith(".safetensors")}

    commits, parent = {}, ""
    for version in (1, 2):
        files = {name: entry(name, content) for name, content in model_files(version).items()}
        parent = _commit(files, parent)
        commits[parent] = {"files": files}
    revisions[GATED_REPO] = list(commits)
    repos = {GATED_REPO: {"gated": True, "refs": {"main": parent}, "commits": commits}}
    # Announces a 1 PiB shard (its bytes are never served): the free-disk check must refuse it first.
    small = model_files(1)
    big_files = {name: entry(name, small[name]) for name in ("config.json", "model.safetensors.index.json")}
    big_files["model-00001-of-00002.safetensors"] = {"oid": "0" * 40, "sha256": "f" * 64, "size": 2**50, "lfs": True}
    big_files["model-00002-of-00002.safetensors"] = {"oid": "1" * 40, "sha256": "e" * 64, "size": 2**50, "lfs": True}
    big = _commit(big_files, "")
    revisions[TOO_BIG_REPO] = [big]
    repos[TOO_BIG_REPO] = {"gated": True, "refs": {"main": big}, "commits": {big: {"files": big_files}}}
    for repo_id, repo in repos.items():
        path = out / "repos" / f"{repo_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(repo, indent=1) + "\n")
    (out / "tokens.json").write_text(json.dumps([hashlib.sha256(LAB_HF_TOKEN.encode()).hexdigest()]) + "\n")
    shutil.copy2(HERE / "server.py", out / "server.py")
    return revisions


def client_wheels() -> list[Path]:
    """huggingface_hub and its dependencies for each lab host's Python (x86_64), fetched once."""
    try:
        return mirrors.fetch_wheels(HF_CLIENT_SPEC, LAB / "hub-wheels")
    except mirrors.BuildError as exc:
        sys.exit(f"hub.py: {exc}")


def build(mirror: Path) -> dict:
    """Build MIRROR/hub; a second build with the same inputs (this file, server.py, the wheels) only reads."""
    out = mirror / "hub"
    wheels = client_wheels()
    stamp = hashlib.sha256(b"".join(p.read_bytes() for p in (Path(__file__).resolve(), HERE / "server.py"))
                           + "\n".join(w.name for w in wheels).encode()).hexdigest()
    if (out / ".build-stamp").is_file() and (out / ".build-stamp").read_text() == stamp \
            and (out / "revisions.json").is_file():
        return json.loads((out / "revisions.json").read_text())
    revisions = build_hub(out)
    shutil.rmtree(out / "pypi", ignore_errors=True)
    mirrors.write_index(out / "pypi", wheels)
    (out / "revisions.json").write_text(json.dumps(revisions, indent=1) + "\n")
    (out / ".build-stamp").write_text(stamp)
    print(f"hub.py: built {out} ({', '.join(f'{r}@{v[-1][:12]}' for r, v in revisions.items())})", flush=True)
    return revisions


def up() -> None:
    sys.path.insert(0, str(REPO / "sim" / "lab"))
    import lab  # noqa: PLC0415  (the lab's podman settings)

    probe = (f"import urllib.request,sys\ntry: urllib.request.urlopen('http://127.0.0.1:{HUB_PORT}/api/models/x/y/revision/main')\n"
             "except Exception as e: sys.exit(0 if getattr(e, 'code', 0) == 401 else 1)")
    if lab.podman("exec", MIRROR_CONTAINER, "python3", "-c", probe, check=False).returncode == 0:
        return
    lab.podman("exec", "-d", MIRROR_CONTAINER, "python3", "/srv/mirror/hub/server.py", "/srv/mirror/hub",
               "--port", str(HUB_PORT))
    for _ in range(50):
        if lab.podman("exec", MIRROR_CONTAINER, "python3", "-c", probe, check=False).returncode == 0:
            print(f"hub.py: the Hub stand-in answers at http://{MIRROR_CONTAINER}:{HUB_PORT}", flush=True)
            return
        time.sleep(0.2)
    sys.exit(f"hub.py: the Hub stand-in did not answer in {MIRROR_CONTAINER}; is the mirror up (sim/lab/lab.py up)?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("mirror", nargs="?", type=Path, default=LAB / "mirror")
    sub.add_parser("up")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=HUB_PORT)
    s.add_argument("--mirror", type=Path, default=LAB / "mirror")
    args = parser.parse_args()
    if args.cmd == "build":
        build(args.mirror)
    elif args.cmd == "up":
        up()
    else:
        os.execv(sys.executable, [sys.executable, str(HERE / "server.py"), str(args.mirror / "hub"),
                                  "--port", str(args.port)])


if __name__ == "__main__":
    main()
