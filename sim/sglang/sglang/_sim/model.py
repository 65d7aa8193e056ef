"""The model as SGLang builds it: config reading and the tensors each rank allocates.

This is the simulator's own physics, written from SGLang's sources (python/sglang/srt/models/
deepseek_v2.py, kimi_k25.py, layers/quantization/compressed_tensors, distributed/parallel_state.py)
and the checkpoint's tensor list. It never imports the product's planner.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "fp8": 1, "int64": 8}


@dataclass
class ModelConfig:
    architecture: str
    text_architecture: str
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    quant_method: str | None
    quant_bits: int
    quant_group_size: int
    quant_ignore: list[str] = field(default_factory=list)
    vision: dict | None = None  # the vision config object's attributes, as SGLang's config class builds it
    raw: dict = field(default_factory=dict)

    @property
    def is_multimodal(self) -> bool:
        return self.vision is not None

    def is_quantized(self, name: str) -> bool:
        """compressed-tensors: a Linear is quantized unless a name or re: pattern in ignore matches."""
        if not self.quant_method:
            return False
        for pat in self.quant_ignore:
            if pat.startswith("re:"):
                if re.match(pat[3:], name):
                    return False
            elif name == pat or name.endswith("." + pat) or name.startswith(pat):
                return False
        return True


class ConfigError(Exception):
    pass


def load_config(model_path: str) -> ModelConfig:
    path = os.path.join(model_path, "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"Can't load the configuration of '{model_path}'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same "
            f"name. Otherwise, make sure '{model_path}' is the correct path to a directory containing "
            "a config.json file"
        ) from exc
    return parse_config(raw)


# KimiK25VisionConfig.__init__ defaults (python/sglang/srt/configs/kimi_k25.py). SGLang builds the vision
# config object as KimiK25VisionConfig(**vision_config): a JSON key of one of these names replaces the
# default, any other key (K2.5 ships vt_hidden_size, vt_num_hidden_layers, ...) is only kept as an extra
# attribute. MoonViT3dPretrainedModel is built from the named attributes; the projector reads vt_hidden_size.
KIMI_K25_VISION_DEFAULTS = {
    "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64, "init_pos_emb_time": 4,
    "num_attention_heads": 16, "num_hidden_layers": 27, "hidden_size": 1152, "intermediate_size": 4304,
    "merge_kernel_size": [2, 2], "text_hidden_size": 7168,
}


def vision_object(raw: dict) -> dict | None:
    """The attributes of the vision config object SGLang's model config holds, or None without one."""
    vc = raw.get("vision_config")
    if not isinstance(vc, dict):
        return None
    if raw.get("model_type") == "kimi_k25":
        return {**KIMI_K25_VISION_DEFAULTS, **vc}
    return dict(vc)  # another model's own config class: only what the JSON says is known here


def parse_config(raw: dict) -> ModelConfig:
    text = raw.get("text_config") or raw
    qc = raw.get("quantization_config") or text.get("quantization_config")
    quant_method = bits = group = None
    ignore: list[str] = []
    if qc:
        quant_method = qc.get("quant_method")
        groups = qc.get("config_groups") or {}
        for grp in groups.values():
            w = grp.get("weights") or {}
            bits = w.get("num_bits", bits)
            group = w.get("group_size", group)
        ignore = list(qc.get("ignore") or [])
        if quant_method == "fp8":  # DeepSeek-V3 native block FP8
            bits = 8
            group = (qc.get("weight_block_size") or [128, 128])[0]
    arch = (raw.get("architectures") or ["DeepseekV3ForCausalLM"])[0]
    text_arch = (text.get("architectures") or [arch])[0]
    vision = vision_object(raw)
    return ModelConfig(
        architecture=arch,
        text_architecture=text_arch,
        hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"],
        moe_intermediate_size=text["moe_intermediate_size"],
        num_hidden_layers=text["num_hidden_layers"],
        first_k_dense_replace=text.get("first_k_dense_replace", 0),
        n_routed_experts=text["n_routed_experts"],
        n_shared_experts=text.get("n_shared_experts", 0) or 0,
        num_experts_per_tok=text["num_experts_per_tok"],
        num_attention_heads=text["num_attention_heads"],
        q_lora_rank=text.get("q_lora_rank"),
        kv_lora_rank=text["kv_lora_rank"],
        qk_nope_head_dim=text["qk_nope_head_dim"],
        qk_rope_head_dim=text["qk_rope_head_dim"],
        v_head_dim=text["v_head_dim"],
        vocab_size=text["vocab_size"],
        max_position_embeddings=text.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        quant_method=quant_method,
        quant_bits=bits or 16,
        quant_group_size=group or 0,
        quant_ignore=ignore,
        vision=vision,
        raw=raw,
    )


# --------------------------------------------------------------------------------------------
# Layout of ranks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rank:
    tp_rank: int
    pp_rank: int
    dp_rank: int
    gpu_id: int
    tp_size: int
    pp_size: int
    ep_size: int
    dp_size: int
    dp_attention: bool

    @property
    def moe_tp_size(self) -> int:
        return self.tp_size // self.ep_size

    @property
    def moe_ep_rank(self) -> int:
        # parallel_state.initialize_model_parallel: EP groups take every moe_tp-th rank of the TP group
        return self.tp_rank // self.moe_tp_size

    @property
    def moe_tp_rank(self) -> int:
        return self.tp_rank % self.moe_tp_size

    @property
    def attn_tp_size(self) -> int:
        return self.tp_size // self.dp_size if self.dp_attention else self.tp_size

    @property
    def log_prefix(self) -> str:
        """scheduler.run_scheduler_process: ' DPn' ' TPn' ' EPn' ' PPn' as they apply."""
        p = ""
        if self.dp_size > 1:
            p += f" DP{self.dp_rank}"
        if self.tp_size > 1:
            p += f" TP{self.tp_rank}"
        if self.ep_size > 1:
            p += f" EP{self.moe_ep_rank}"
        if self.pp_size > 1:
            p += f" PP{self.pp_rank}"
        return p

    @property
    def proc_title(self) -> str:
        return "sglang::scheduler" + self.log_prefix.replace(" ", "_")


def pp_partition(num_layers: int, pp_size: int, env: dict | None = None) -> list[int]:
    """Layers per pipeline stage: remainder layers on the last stages (docs/facts.md §2);
    SGLANG_PP_LAYER_PARTITION (comma-separated counts) overrides."""
    env = os.environ if env is None else env
    override = env.get("SGLANG_PP_LAYER_PARTITION")
    if override:
        parts = [int(x) for x in override.split(",") if x.strip()]
        if len(parts) != pp_size:
            raise AssertionError(f"len(partitions)={len(parts)} != pp_size={pp_size}")
        if sum(parts) != num_layers:
            raise AssertionError(f"sum(partitions)={sum(parts)} != num_hidden_layers={num_layers}")
        return parts
    base = num_layers // pp_size
    parts = [base] * pp_size
    for i in range(num_layers % pp_size):
        parts[pp_size - 1 - i] += 1
    return parts


def enumerate_ranks(tp: int, pp: int, ep: int, dp: int, dp_attention: bool,
                    base_gpu_id: int = 0, gpu_id_step: int = 1) -> list[Rank]:
    ranks = []
    replicas = 1 if dp_attention else dp
    for d in range(replicas):
        for p in range(pp):
            for t in range(tp):
                gpu = base_gpu_id + (d * pp * tp + p * tp + t) * gpu_id_step
                dp_rank = t // (tp // dp) if dp_attention else d
                ranks.append(Rank(t, p, dp_rank, gpu, tp, pp, ep, dp, dp_attention))
    return ranks


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------


@dataclass
class Tensor:
    name: str
    shape: tuple
    dtype: str
    phase: str = "load"  # load | post_load

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


def _div(a: int, b: int, what: str) -> int:
    if a % b:
        raise ValueError(f"{what} ({a}) is not divisible by {b}")
    return a // b


def rank_tensors(cfg: ModelConfig, rank: Rank, env: dict | None = None,
                 enable_dp_lm_head: bool = False) -> list[Tensor]:
    """The parameters one rank allocates, in the order SGLang's model constructor creates them,
    followed by the tensors DeepseekV2 post_load_weights materialises (w_kc, w_vc)."""
    t: list[Tensor] = []
    H = cfg.hidden_size
    attn_tp = rank.attn_tp_size
    tp = rank.tp_size
    parts = pp_partition(cfg.num_hidden_layers, rank.pp_size, env)
    start = sum(parts[: rank.pp_rank])
    end = start + parts[rank.pp_rank]
    first, last = rank.pp_rank == 0, rank.pp_rank == rank.pp_size - 1
    lm = "language_model." if cfg.is_multimodal else ""

    if cfg.is_multimodal:  # KimiK25ForConditionalGeneration builds tower and projector on every PP rank
        t.extend(_vision_tensors(cfg.vision, H, attn_tp))

    vocab_local = -(-cfg.vocab_size // attn_tp)  # VocabParallelEmbedding pads to the shard
    if first:
        t.append(Tensor(f"{lm}model.embed_tokens.weight", (vocab_local, H), "bfloat16"))

    heads = _div(cfg.num_attention_heads, attn_tp, "num_attention_heads")
    qk_head = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    I_dense = _div(cfg.intermediate_size, tp, "intermediate_size")
    I_shared = _div(cfg.moe_intermediate_size * max(cfg.n_shared_experts, 1), tp, "shared intermediate")
    moe_tp = rank.moe_tp_size
    I_moe = _div(cfg.moe_intermediate_size, moe_tp, "moe_intermediate_size")
    E_local = _div(cfg.n_routed_experts, rank.ep_size, "n_routed_experts")
    post: list[Tensor] = []

    for layer in range(start, end):
        pre = f"{lm}model.layers.{layer}."
        a = pre + "self_attn."
        if cfg.q_lora_rank:
            t.append(Tensor(a + "fused_qkv_a_proj_with_mqa.weight",
                            (cfg.q_lora_rank + cfg.kv_lora_rank + cfg.qk_rope_head_dim, H), "bfloat16"))
            t.append(Tensor(a + "q_a_layernorm.weight", (cfg.q_lora_rank,), "bfloat16"))
            t.append(Tensor(a + "q_b_proj.weight", (heads * qk_head, cfg.q_lora_rank), "bfloat16"))
        else:
            t.append(Tensor(a + "q_proj.weight", (heads * qk_head, H), "bfloat16"))
            t.append(Tensor(a + "kv_a_proj_with_mqa.weight", (cfg.kv_lora_rank + cfg.qk_rope_head_dim, H),
                            "bfloat16"))
        t.append(Tensor(a + "kv_a_layernorm.weight", (cfg.kv_lora_rank,), "bfloat16"))
        t.append(Tensor(a + "kv_b_proj.weight",
                        (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank), "bfloat16"))
        t.append(Tensor(a + "o_proj.weight", (H, heads * cfg.v_head_dim), "bfloat16"))
        post.append(Tensor(a + "w_kc", (heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank), "bfloat16", "post_load"))
        post.append(Tensor(a + "w_vc", (heads, cfg.kv_lora_rank, cfg.v_head_dim), "bfloat16", "post_load"))

        m = pre + "mlp."
        if layer < cfg.first_k_dense_replace:
            t.append(Tensor(m + "gate_up_proj.weight", (2 * I_dense, H), "bfloat16"))
            t.append(Tensor(m + "down_proj.weight", (H, I_dense), "bfloat16"))
        else:
            t.append(Tensor(m + "gate.weight", (cfg.n_routed_experts, H), "bfloat16"))
            t.append(Tensor(m + "gate.e_score_correction_bias", (cfg.n_routed_experts,), "float32"))
            t.extend(_expert_tensors(cfg, m + "experts.", E_local, I_moe, H))
            if cfg.n_shared_experts:
                s = m + "shared_experts."
                t.append(Tensor(s + "gate_up_proj.weight", (2 * I_shared, H), "bfloat16"))
                t.append(Tensor(s + "down_proj.weight", (H, I_shared), "bfloat16"))
        t.append(Tensor(pre + "input_layernorm.weight", (H,), "bfloat16"))
        t.append(Tensor(pre + "post_attention_layernorm.weight", (H,), "bfloat16"))

    if last:
        t.append(Tensor(f"{lm}model.norm.weight", (H,), "bfloat16"))
        head_tp = attn_tp if enable_dp_lm_head else tp
        if not cfg.tie_word_embeddings or not first:
            t.append(Tensor(f"{lm}lm_head.weight", (-(-cfg.vocab_size // head_tp), H), "bfloat16"))
    return t + post


def _vision_tensors(v: dict, text_hidden: int, attn_tp: int) -> list[Tensor]:
    """MoonViT3dPretrainedModel + K2VLMultiModalProjector parameters on one rank (models/kimi_k25.py):
    VisionAttention's qkv (QKVParallelLinear) and proj (RowParallelLinear, whole bias) split over the
    attention TP group (layers/attention/vision.py); MLP2's nn.Linear layers, norms, embeddings and the
    projector (ReplicatedLinear) whole."""
    vh = v.get("hidden_size", 1152)
    vi = v.get("intermediate_size", 4304)
    heads = v.get("num_attention_heads", 16)
    ph = v.get("patch_size", 14)
    heads_local = _div(heads, attn_tp, "vision num_attention_heads")
    qkv_local = 3 * heads_local * (vh // heads)
    t = [Tensor("vision_tower.patch_embed.proj.weight", (vh, 3, ph, ph), "bfloat16"),
         Tensor("vision_tower.patch_embed.proj.bias", (vh,), "bfloat16"),
         Tensor("vision_tower.patch_embed.pos_emb.weight",
                (v.get("init_pos_emb_height", 64), v.get("init_pos_emb_width", 64), vh), "bfloat16")]
    for b in range(v.get("num_hidden_layers", 27)):
        pre = f"vision_tower.encoder.blocks.{b}."
        for nm, shp in (("norm0.weight", (vh,)), ("norm0.bias", (vh,)), ("wqkv.weight", (qkv_local, vh)),
                        ("wqkv.bias", (qkv_local,)), ("wo.weight", (vh, qkv_local // 3)), ("wo.bias", (vh,)),
                        ("norm1.weight", (vh,)), ("norm1.bias", (vh,)), ("mlp.fc0.weight", (vi, vh)),
                        ("mlp.fc0.bias", (vi,)), ("mlp.fc1.weight", (vh, vi)), ("mlp.fc1.bias", (vh,))):
            t.append(Tensor(pre + nm, shp, "bfloat16"))
    t.append(Tensor("vision_tower.encoder.final_layernorm.weight", (vh,), "bfloat16"))
    t.append(Tensor("vision_tower.encoder.final_layernorm.bias", (vh,), "bfloat16"))
    pvh = v.get("vt_hidden_size", vh)
    mk = v.get("merge_kernel_size", [2, 2])
    mh = pvh * mk[0] * mk[1]
    th = v.get("text_hidden_size", text_hidden)
    t.append(Tensor("mm_projector.pre_norm.weight", (pvh,), "bfloat16"))
    t.append(Tensor("mm_projector.pre_norm.bias", (pvh,), "bfloat16"))
    t.append(Tensor("mm_projector.proj.0.weight", (mh, mh), "bfloat16"))
    t.append(Tensor("mm_projector.proj.0.bias", (mh,), "bfloat16"))
    t.append(Tensor("mm_projector.proj.2.weight", (th, mh), "bfloat16"))
    t.append(Tensor("mm_projector.proj.2.bias", (th,), "bfloat16"))
    return t


def _expert_tensors(cfg: ModelConfig, pre: str, E: int, Im: int, H: int) -> list[Tensor]:
    """Fused MoE parameters of one layer on one rank, in create_weights order."""
    probe = pre.replace("experts.", "experts.0.gate_proj")
    if cfg.quant_method == "compressed-tensors" and cfg.is_quantized(probe) and cfg.quant_bits in (4, 8):
        pack = 32 // cfg.quant_bits
        g = cfg.quant_group_size or 128
        return [
            # CompressedTensorsWNA16MoEMethod.create_weights
            Tensor(pre + "w13_weight_packed", (E, H // pack, 2 * Im), "int32"),
            Tensor(pre + "w2_weight_packed", (E, Im // pack, H), "int32"),
            Tensor(pre + "w2_weight_scale", (E, Im // g, H), "bfloat16"),
            Tensor(pre + "w13_weight_scale", (E, H // g, 2 * Im), "bfloat16"),
            Tensor(pre + "w2_weight_shape", (E, 2), "int32"),
            Tensor(pre + "w13_weight_shape", (E, 2), "int32"),
            Tensor(pre + "w13_weight_g_idx", (E, H), "int32"),
            Tensor(pre + "w2_weight_g_idx", (E, Im), "int32"),
            Tensor(pre + "w13_g_idx_sort_indices", (E, H), "int32"),
            Tensor(pre + "w2_g_idx_sort_indices", (E, Im), "int32"),
        ]
    if cfg.quant_method == "fp8":
        b = cfg.quant_group_size or 128
        return [
            Tensor(pre + "w13_weight", (E, 2 * Im, H), "fp8"),
            Tensor(pre + "w2_weight", (E, H, Im), "fp8"),
            Tensor(pre + "w13_weight_scale_inv", (E, -(-2 * Im // b), -(-H // b)), "float32"),
            Tensor(pre + "w2_weight_scale_inv", (E, -(-H // b), -(-Im // b)), "float32"),
        ]
    return [
        Tensor(pre + "w13_weight", (E, 2 * Im, H), "bfloat16"),
        Tensor(pre + "w2_weight", (E, H, Im), "bfloat16"),
    ]


def kv_cell_bytes(cfg: ModelConfig, num_layers: int, kv_cache_dtype: str) -> int:
    """ModelRunnerKVCacheMixin.get_cell_size_per_token for MLA: one latent (kv_lora_rank + qk_rope_head_dim)
    per token per layer at the dtype's element size; fp4_e2m1 (float4_e2m1fn_x2, one byte per two values)
    halves that and adds one scale byte per 16 values."""
    latent = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    if kv_cache_dtype == "fp4_e2m1":
        return latent * num_layers // 2 + latent // 16 * num_layers
    nbytes = 1 if kv_cache_dtype.startswith("fp8") else 2
    return latent * num_layers * nbytes
