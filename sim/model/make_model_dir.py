#!/usr/bin/env python3
"""Create the lab's model directory: config.json, model.safetensors.index.json and sparse shards.

    make_model_dir.py DEST [--config FILE]

The shards are real safetensors files (8-byte header length, JSON header with every tensor's dtype, shape
and offsets) whose sizes match the checkpoint; the data part is a hole (truncate), so they cost no disk.
Idempotent: files that already have the right content and size are left alone. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, "kimi_k26_config.json")
ST_DTYPE = {"bfloat16": ("BF16", 2), "int32": ("I32", 4), "float32": ("F32", 4), "fp8": ("F8_E4M3", 1)}


def checkpoint_tensors(raw: dict) -> list[tuple[int, str, str, tuple]]:
    """(shard number, name, dtype, shape) for every tensor of the checkpoint, in the released layout:
    shard 1 holds layer 0, shard k+1 holds layer k, then embeddings/norm/lm_head, the projector and the
    vision tower (K2.5/K2.6 form) in the last shards."""
    text = raw.get("text_config") or raw
    mm = "text_config" in raw
    lm = "language_model." if mm else ""
    qc = raw.get("quantization_config") or text.get("quantization_config") or {}
    H, L = text["hidden_size"], text["num_hidden_layers"]
    E, Im, ID = text["n_routed_experts"], text["moe_intermediate_size"], text["intermediate_size"]
    heads, q_lora, kv_lora = text["num_attention_heads"], text.get("q_lora_rank"), text["kv_lora_rank"]
    nope, rope, vdim = text["qk_nope_head_dim"], text["qk_rope_head_dim"], text["v_head_dim"]
    dense = text.get("first_k_dense_replace", 0)
    shared = text.get("n_shared_experts", 0) or 0
    vocab = text["vocab_size"]
    method = qc.get("quant_method")
    w = next(iter((qc.get("config_groups") or {}).values()), {}).get("weights", {})
    bits, group = w.get("num_bits", 4), w.get("group_size", 32)
    out = []
    for layer in range(L):
        s = layer + 1
        p = f"{lm}model.layers.{layer}."
        out.append((s, p + "input_layernorm.weight", "bfloat16", (H,)))
        out.append((s, p + "post_attention_layernorm.weight", "bfloat16", (H,)))
        a = p + "self_attn."
        out.append((s, a + "kv_a_layernorm.weight", "bfloat16", (kv_lora,)))
        out.append((s, a + "kv_a_proj_with_mqa.weight", "bfloat16", (kv_lora + rope, H)))
        out.append((s, a + "kv_b_proj.weight", "bfloat16", (heads * (nope + vdim), kv_lora)))
        out.append((s, a + "o_proj.weight", "bfloat16", (H, heads * vdim)))
        if q_lora:
            out.append((s, a + "q_a_layernorm.weight", "bfloat16", (q_lora,)))
            out.append((s, a + "q_a_proj.weight", "bfloat16", (q_lora, H)))
            out.append((s, a + "q_b_proj.weight", "bfloat16", (heads * (nope + rope), q_lora)))
        else:
            out.append((s, a + "q_proj.weight", "bfloat16", (heads * (nope + rope), H)))
        m = p + "mlp."
        if layer < dense:
            for nm, shp in (("gate_proj", (ID, H)), ("up_proj", (ID, H)), ("down_proj", (H, ID))):
                out.append((s, m + nm + ".weight", "bfloat16", shp))
            continue
        for e in range(E):
            x = f"{m}experts.{e}."
            for nm, (rows, cols) in (("down_proj", (H, Im)), ("gate_proj", (Im, H)), ("up_proj", (Im, H))):
                if method == "compressed-tensors":
                    pack = 32 // bits
                    out.append((s, x + nm + ".weight_packed", "int32", (rows, cols // pack)))
                    out.append((s, x + nm + ".weight_scale", "bfloat16", (rows, cols // group)))
                    out.append((s, x + nm + ".weight_shape", "int32", (2,)))
                elif method == "fp8":
                    b = (qc.get("weight_block_size") or [128, 128])[0]
                    out.append((s, x + nm + ".weight", "fp8", (rows, cols)))
                    out.append((s, x + nm + ".weight_scale_inv", "float32", (-(-rows // b), -(-cols // b))))
                else:
                    out.append((s, x + nm + ".weight", "bfloat16", (rows, cols)))
        out.append((s, m + "gate.e_score_correction_bias", "float32", (E,)))
        out.append((s, m + "gate.weight", "bfloat16", (E, H)))
        if shared:
            si = Im * shared
            for nm, shp in (("down_proj", (H, si)), ("gate_proj", (si, H)), ("up_proj", (si, H))):
                out.append((s, f"{m}shared_experts.{nm}.weight", "bfloat16", shp))
    s = L + 1
    out.append((s, f"{lm}lm_head.weight", "bfloat16", (vocab, H)))
    out.append((s, f"{lm}model.embed_tokens.weight", "bfloat16", (vocab, H)))
    out.append((s, f"{lm}model.norm.weight", "bfloat16", (H,)))
    if mm:
        v = raw.get("vision_config") or {}
        vh, vi, ph = v.get("vt_hidden_size", 1152), v.get("vt_intermediate_size", 4304), v.get("patch_size", 14)
        k = v.get("merge_kernel_size", [2, 2])
        mh = vh * k[0] * k[1]
        s = L + 2
        for nm, shp in (("pre_norm.bias", (vh,)), ("pre_norm.weight", (vh,)), ("proj.0.bias", (mh,)),
                        ("proj.0.weight", (mh, mh)), ("proj.2.bias", (H,)), ("proj.2.weight", (H, mh))):
            out.append((s, "mm_projector." + nm, "bfloat16", shp))
        s = L + 3
        for b in range(v.get("vt_num_hidden_layers", 27)):
            x = f"vision_tower.encoder.blocks.{b}."
            for nm, shp in (("mlp.fc0.bias", (vi,)), ("mlp.fc0.weight", (vi, vh)), ("mlp.fc1.bias", (vh,)),
                            ("mlp.fc1.weight", (vh, vi)), ("norm0.bias", (vh,)), ("norm0.weight", (vh,)),
                            ("norm1.bias", (vh,)), ("norm1.weight", (vh,)), ("wo.bias", (vh,)),
                            ("wo.weight", (vh, vh)), ("wqkv.bias", (3 * vh,)), ("wqkv.weight", (3 * vh, vh))):
                out.append((s, x + nm, "bfloat16", shp))
        out.append((s, "vision_tower.encoder.final_layernorm.bias", "bfloat16", (vh,)))
        out.append((s, "vision_tower.encoder.final_layernorm.weight", "bfloat16", (vh,)))
        out.append((s, "vision_tower.patch_embed.pos_emb.weight", "bfloat16",
                    (v.get("init_pos_emb_height", 64), v.get("init_pos_emb_width", 64), vh)))
        out.append((s, "vision_tower.patch_embed.proj.bias", "bfloat16", (vh,)))
        out.append((s, "vision_tower.patch_embed.proj.weight", "bfloat16", (vh, 3, ph, ph)))
    return out


def nbytes(dtype: str, shape: tuple) -> int:
    n = ST_DTYPE[dtype][1]
    for d in shape:
        n *= d
    return n


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:06d}.safetensors"  # the released repos number shards as 00001-of-000064


def write_if_changed(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except FileNotFoundError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return True


def write_shard(path: str, tensors: list[tuple[str, str, tuple]]) -> bool:
    header, off = {}, 0
    for name, dtype, shape in sorted(tensors):
        size = nbytes(dtype, shape)
        header[name] = {"dtype": ST_DTYPE[dtype][0], "shape": list(shape), "data_offsets": [off, off + size]}
        off += size
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)  # safetensors pads the header to 8 bytes
    prefix = len(hjson).to_bytes(8, "little") + hjson
    total = len(prefix) + off
    try:
        if os.path.getsize(path) == total:
            with open(path, "rb") as fh:
                if fh.read(len(prefix)) == prefix:
                    return False
    except FileNotFoundError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(prefix)
        fh.truncate(total)  # sparse: the data part is a hole
    os.replace(tmp, path)
    return True


def build(dest: str, config_path: str) -> dict:
    with open(config_path, encoding="utf-8") as fh:
        cfg_text = fh.read()
    raw = json.loads(cfg_text)
    os.makedirs(dest, exist_ok=True)
    tensors = checkpoint_tensors(raw)
    n = max(s for s, *_ in tensors)
    by_shard: dict[int, list] = {}
    weight_map, total = {}, 0
    for s, name, dtype, shape in tensors:
        by_shard.setdefault(s, []).append((name, dtype, shape))
        weight_map[name] = shard_name(s, n)
        total += nbytes(dtype, shape)
    changed = write_if_changed(os.path.join(dest, "config.json"), cfg_text.encode())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    changed |= write_if_changed(os.path.join(dest, "model.safetensors.index.json"),
                                (json.dumps(index, indent=2) + "\n").encode())
    for s, items in sorted(by_shard.items()):
        changed |= write_shard(os.path.join(dest, shard_name(s, n)), items)
    text = raw.get("text_config") or raw
    gen = {"max_length": text.get("max_position_embeddings", 262144), "bos_token_id": raw.get("bos_token_id"),
           "eos_token_id": raw.get("eos_token_id")}
    changed |= write_if_changed(os.path.join(dest, "generation_config.json"),
                                (json.dumps(gen, indent=2) + "\n").encode())
    tok = {"tokenizer_class": "TikTokenTokenizer", "model_max_length": text.get("max_position_embeddings", 262144),
           "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
           "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}
    changed |= write_if_changed(os.path.join(dest, "tokenizer_config.json"),
                                (json.dumps(tok, indent=2) + "\n").encode())
    return {"dest": dest, "shards": n, "tensors": len(tensors), "total_size": total, "changed": changed}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="make_model_dir.py", description=__doc__.splitlines()[0])
    ap.add_argument("dest")
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="config.json to use (default: Kimi K2.6)")
    a = ap.parse_args(argv)
    res = build(a.dest, a.config)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
