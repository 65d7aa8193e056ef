"""Memory planner: what one SGLang parallelism layout puts on each GPU, and whether it fits.

Pure standard library, no I/O: callers hand in the parsed model ``config.json``, the host's GPU count
and per-GPU memory (PyTorch's "total capacity" figure, e.g. 94.97 GiB for an RTX PRO 6000), and a
layout. The semantics follow SGLang (docs/facts.md §2):

- GPUs used = tp × pp (× dp only without DP attention); EP never adds GPUs.
- Experts are split into ``ep`` groups inside the TP group; each group's experts are sharded
  ``moe_tp = tp / ep`` ways along the intermediate dimension.
- Attention (MLA) runs on ``attn_tp = tp / dp`` GPUs with DP attention, ``tp`` without it. SGLang keeps
  the fused q_a/kv_a projection replicated and shards q_b, kv_b and o_proj across the attention TP group
  (python/sglang/srt/models/deepseek_v2.py, ``fused_qkv_a_proj_with_mqa = ReplicatedLinear``).
- embed_tokens lives on the first PP stage and lm_head on the last; both are vocab-parallel over TP,
  except that embed_tokens is replicated under DP attention (``enable_tp=not is_dp_attention_enabled()``).
- Pipeline stages get ``layers // pp`` layers each and the remainder goes to the last stages.

The KV pool is what SGLang's model runner sizes after loading: ``free_at_init × mem_fraction_static −
weights``; with the default ``mem_fraction_static`` taken from SGLang's own heuristic
(``default_mem_fraction_static``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1 << 30
MIB = 1 << 20

# Memory a rank has already lost when SGLang measures "total" memory at init (CUDA context, NCCL
# communicators, cuBLAS workspaces). An estimate: SGLang measures it, we cannot.
INIT_OVERHEAD_GIB = 1.0

# Verdict thresholds.
# A pool under this many tokens can be exhausted by one long agentic request: the server starts but
# serves little, so the layout is "tight" even when no context length is set.
TIGHT_MIN_KV_TOKENS = 32768
# A layout whose profile sets a context length is "tight" when the pool cannot hold one request of
# that length (SGLang then silently caps concurrency at less than one full-length request).

VERDICTS = ("fits", "tight", "oom", "invalid")

# --kv-cache-dtype choices of SGLang 0.5.10 (server_args.py, add_cli_args); "auto" is the model's
# dtype (BF16 for Kimi K2.x and DeepSeek-V3, whose checkpoints carry no FP8 KV-cache scheme).
KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")


class PlanError(ValueError):
    """Input the planner cannot work with; the message is a sentence for the operator."""


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """An SGLang parallelism layout plus the tuning flags that change memory."""

    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = False
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None
    chunked_prefill_size: int | None = None
    context_length: int | None = None
    kv_cache_dtype: str = "auto"

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> Layout:
        """Build a layout from SGLang flag names without dashes (``tp_size``, ``enable_dp_attention``...)."""
        return cls(
            tp=int(flags.get("tp_size", 1)),
            ep=int(flags.get("ep_size", 1)),
            pp=int(flags.get("pp_size", 1)),
            dp=int(flags.get("dp_size", 1)),
            dp_attention=bool(flags.get("enable_dp_attention", False)),
            mem_fraction_static=flags.get("mem_fraction_static"),
            cuda_graph_max_bs=flags.get("cuda_graph_max_bs"),
            chunked_prefill_size=flags.get("chunked_prefill_size"),
            context_length=flags.get("context_length"),
            kv_cache_dtype=str(flags.get("kv_cache_dtype", "auto")),
        )

    def flags(self) -> dict[str, Any]:
        """The layout as SGLang flag names without dashes; defaults are left out."""
        out: dict[str, Any] = {"tp_size": self.tp}
        if self.ep != 1:
            out["ep_size"] = self.ep
        if self.pp != 1:
            out["pp_size"] = self.pp
        if self.dp != 1:
            out["dp_size"] = self.dp
        if self.dp_attention:
            out["enable_dp_attention"] = True
        for name in ("mem_fraction_static", "cuda_graph_max_bs", "chunked_prefill_size", "context_length"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.kv_cache_dtype != "auto":
            out["kv_cache_dtype"] = self.kv_cache_dtype
        return out

    def cli(self) -> str:
        """The parallelism part of the layout as SGLang command-line flags."""
        parts = [f"--tp-size {self.tp}"]
        if self.ep != 1:
            parts.append(f"--ep-size {self.ep}")
        if self.pp != 1:
            parts.append(f"--pp-size {self.pp}")
        if self.dp != 1:
            parts.append(f"--dp-size {self.dp}")
        if self.dp_attention:
            parts.append("--enable-dp-attention")
        return " ".join(parts)

    @property
    def gpus_used(self) -> int:
        """GPUs SGLang starts for this layout: tp × pp, times dp only without DP attention."""
        world = self.tp * self.pp
        return world if self.dp_attention else world * self.dp

    @property
    def moe_tp(self) -> int:
        """How many ways each expert is split (SGLang's moe_tp_size)."""
        return self.tp // self.ep if self.ep else 0

    @property
    def attn_tp(self) -> int:
        """GPUs one attention replica is sharded across."""
        return self.tp // self.dp if self.dp_attention and self.dp else self.tp


def layout_problems(layout: Layout) -> list[str]:
    """SGLang's flag invariants, each broken one as a sentence; empty when the flags are consistent."""
    problems: list[str] = []
    for name in ("tp", "ep", "pp", "dp"):
        value = getattr(layout, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"--{name}-size must be a whole number of at least 1, not {value!r}.")
    if problems:
        return problems
    if layout.tp % layout.ep:
        problems.append(
            f"--ep-size {layout.ep} does not divide --tp-size {layout.tp}: SGLang carves expert groups "
            "out of the TP group, so tp must be a multiple of ep."
        )
    if layout.dp_attention:
        if layout.dp < 2:
            problems.append("--enable-dp-attention needs --dp-size of 2 or more (SGLang ignores it at 1).")
        elif layout.tp % layout.dp:
            problems.append(
                f"--dp-size {layout.dp} does not divide --tp-size {layout.tp}: with DP attention each "
                "attention replica takes tp/dp GPUs."
            )
    frac = layout.mem_fraction_static
    if frac is not None and not 0.0 < float(frac) < 1.0:
        problems.append(f"--mem-fraction-static must lie between 0 and 1, not {frac}.")
    if layout.kv_cache_dtype not in KV_CACHE_DTYPES:
        problems.append(
            f"--kv-cache-dtype {layout.kv_cache_dtype!r} is not one SGLang accepts; use one of "
            f"{', '.join(KV_CACHE_DTYPES)}."
        )
    return problems


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its linear weights, reduced to what memory depends on."""

    method: str  # "none", "compressed-tensors", "fp8"
    num_bits: int = 16
    group_size: int = 0  # compressed-tensors group size
    symmetric: bool = True
    block: tuple[int, int] = (0, 0)  # fp8 weight_block_size
    ignore: tuple[str, ...] = ()

    def is_quantized(self, module: str) -> bool:
        """Whether a Linear module (HF name, e.g. ``model.layers.3.self_attn.o_proj``) is quantized."""
        if self.method == "none":
            return False
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module):
                    return False
            elif module == pattern or module.endswith("." + pattern):
                return False
        return True

    def matrix_bytes(self, rows: int, cols: int, module: str) -> int:
        """Bytes one (rows × cols) weight matrix of ``module`` takes on the GPU, scales included."""
        if not self.is_quantized(module):
            return rows * cols * 2
        if self.method == "fp8":
            brow, bcol = self.block
            blocks = _ceil_div(rows, brow) * _ceil_div(cols, bcol) if brow and bcol else 1
            return rows * cols + blocks * 4  # e4m3 weights + fp32 weight_scale_inv per block
        # compressed-tensors pack-quantized: num_bits values packed into int32, one BF16 scale per group
        # (plus a packed zero point when asymmetric), and a 2 × int32 weight_shape per matrix.
        groups = rows * _ceil_div(cols, self.group_size)
        packed = _ceil_div(rows * cols * self.num_bits, 32) * 4
        zero_points = 0 if self.symmetric else _ceil_div(groups * self.num_bits, 32) * 4
        return packed + groups * 2 + zero_points + 8


@dataclass(frozen=True)
class VisionTower:
    """A MoonViT-style vision tower and its patch-merger projector, with the sizes SGLang builds them at."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    patch: int
    pos_emb: tuple[int, int]
    merge: tuple[int, int]
    projector_hidden: int  # the vision width the projector merges (Kimi K2.5: vt_hidden_size)
    text_hidden: int


# KimiK25VisionConfig's defaults (sglang/srt/configs/kimi_k25.py). SGLang builds that class from the
# JSON's vision_config: keys with these names override a default, other keys (the vt_* ones Kimi K2.5
# ships) only become extra attributes, so the tower is built at these sizes whatever vt_* say.
_KIMI_K25_VISION_DEFAULTS = {
    "num_hidden_layers": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_attention_heads": 16,
    "patch_size": 14,
    "init_pos_emb_height": 64,
    "init_pos_emb_width": 64,
    "merge_kernel_size": (2, 2),
}
# What adjust_mem_fraction_for_vlm (server_args.py) falls back to when the vision config object has no
# num_hidden_layers / hidden_size: a ViT-L/14.
_VIT_L_LAYERS, _VIT_L_HIDDEN = 24, 1024


def vision_tower(config: Mapping[str, Any]) -> VisionTower | None:
    """The vision tower SGLang builds for ``config``, or None for a text-only model.

    SGLang reads the tower's sizes from the config *object* it builds, not from the raw JSON: for Kimi
    K2.5/K2.6 (``model_type`` kimi_k25) that is ``KimiK25VisionConfig(**vision_config)``, whose defaults
    stand wherever the JSON uses other key names; for any other model the JSON's own
    ``num_hidden_layers`` / ``hidden_size`` count, with SGLang's ViT-L fallback when they are absent.
    """
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    text = config.get("text_config")
    text_hidden = int((text if isinstance(text, Mapping) else config).get("hidden_size", 0))
    if config.get("model_type") == "kimi_k25":
        built = {**_KIMI_K25_VISION_DEFAULTS, **{k: v for k, v in vision.items() if k in _KIMI_K25_VISION_DEFAULTS}}
    else:
        built = {"num_hidden_layers": _VIT_L_LAYERS, "hidden_size": _VIT_L_HIDDEN, **dict(vision)}
    try:
        hidden = int(built["hidden_size"])
        merge = built.get("merge_kernel_size") or (2, 2)
        return VisionTower(
            layers=int(built["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(built.get("intermediate_size", 4 * hidden)),
            heads=int(built.get("num_attention_heads", 16)),
            patch=int(built.get("patch_size", 14)),
            pos_emb=(int(built.get("init_pos_emb_height", 0)), int(built.get("init_pos_emb_width", 0))),
            merge=(int(merge[0]), int(merge[1])),
            projector_hidden=int(vision.get("vt_hidden_size", hidden)),
            text_hidden=int(vision.get("text_hidden_size", text_hidden)),
        )
    except (TypeError, ValueError, IndexError) as exc:
        raise PlanError(f"The model config's vision_config has a field of the wrong type ({exc}).") from None


@dataclass(frozen=True)
class ModelShape:
    """The fields of a DeepSeek-V3-style config that decide memory."""

    num_layers: int
    hidden: int
    intermediate: int
    moe_intermediate: int
    n_routed_experts: int
    n_shared_experts: int
    first_k_dense: int
    moe_layer_freq: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    quant: Quantization
    vision: VisionTower | None = None
    architecture: str = ""  # config.json's architectures[0], which some of SGLang's rules read

    @property
    def multimodal(self) -> bool:
        """Whether SGLang treats the model as multimodal (it has a vision tower)."""
        return self.vision is not None

    def is_moe_layer(self, index: int) -> bool:
        return (
            self.n_routed_experts > 0
            and index >= self.first_k_dense
            and index % max(self.moe_layer_freq, 1) == 0
        )


_REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "vocab_size",
)


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Read a model config.json (K2.5/K2.6 ``text_config`` form or top-level DeepSeek-V3 form)."""
    if not isinstance(config, Mapping):
        raise PlanError("The model config must be a JSON object (the model's config.json).")
    text = config.get("text_config")
    lm = text if isinstance(text, Mapping) else config
    missing = [name for name in _REQUIRED if name not in lm]
    if missing:
        raise PlanError(
            "The model config lacks " + ", ".join(missing) + ": the planner needs a DeepSeek-V3-style "
            "(MLA + MoE) config.json, either top-level or under text_config."
        )
    quant_cfg = lm.get("quantization_config") or config.get("quantization_config")
    try:
        return ModelShape(
            num_layers=int(lm["num_hidden_layers"]),
            hidden=int(lm["hidden_size"]),
            intermediate=int(lm.get("intermediate_size", 0)),
            moe_intermediate=int(lm.get("moe_intermediate_size", 0)),
            n_routed_experts=int(lm.get("n_routed_experts") or 0),
            n_shared_experts=int(lm.get("n_shared_experts") or 0),
            first_k_dense=int(lm.get("first_k_dense_replace", 0)),
            moe_layer_freq=int(lm.get("moe_layer_freq", 1)),
            num_heads=int(lm["num_attention_heads"]),
            q_lora_rank=int(lm["q_lora_rank"]) if lm.get("q_lora_rank") else None,
            kv_lora_rank=int(lm["kv_lora_rank"]),
            qk_nope_head_dim=int(lm.get("qk_nope_head_dim", 128)),
            qk_rope_head_dim=int(lm["qk_rope_head_dim"]),
            v_head_dim=int(lm.get("v_head_dim", 128)),
            vocab_size=int(lm["vocab_size"]),
            max_position_embeddings=int(lm.get("max_position_embeddings", 0)),
            tie_word_embeddings=bool(lm.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
            quant=_quantization(quant_cfg),
            vision=vision_tower(config),
            architecture=_architecture(config),
        )
    except (TypeError, ValueError) as exc:
        raise PlanError(f"The model config has a field of the wrong type ({exc}).") from None


def _architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs else ""


def _quantization(qc: Any) -> Quantization:
    if not isinstance(qc, Mapping):
        return Quantization(method="none")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        block = qc.get("weight_block_size") or [0, 0]
        return Quantization(method="fp8", num_bits=8, block=(int(block[0]), int(block[1])))
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        weights = next(
            (g.get("weights") for g in groups.values() if isinstance(g, Mapping) and g.get("weights")), None
        )
        if not isinstance(weights, Mapping) or weights.get("type", "int") != "int":
            raise PlanError(
                "The model's compressed-tensors scheme is not integer weight-only; the planner knows "
                "pack-quantized INT4/INT8 (Kimi K2.x) and block FP8 (DeepSeek-V3)."
            )
        return Quantization(
            method="compressed-tensors",
            num_bits=int(weights.get("num_bits", 4)),
            group_size=int(weights.get("group_size") or 128),
            symmetric=bool(weights.get("symmetric", True)),
            ignore=tuple(str(p) for p in qc.get("ignore") or ()),
        )
    raise PlanError(
        f"The model's quantization method {method or '(none given)'!r} is unknown to the planner; it "
        "knows compressed-tensors (Kimi K2.x) and fp8 (DeepSeek-V3)."
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------------
# SGLang's own rules
# ---------------------------------------------------------------------------------------------------


def pp_layer_split(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, remainder on the last stages (SGLang's get_pp_indices)."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if stage >= pp - extra else 0) for stage in range(pp)]


def gpu_memory_defaults(gpu_mem_mib: float, tp: int) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, cuda_graph_max_bs) defaults for a GPU of this size."""
    if gpu_mem_mib < 20 * 1024:
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:
        return 2048, 24 if tp < 4 else 80
    if gpu_mem_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


# SGLang 0.5.23's multimodal architectures whose language model keeps the breakable prefill CUDA graph
# (configs/model_config.py multimodal_breakable_cuda_graph_supported_model_archs; the Kimi ones here, the models
# moefleet plans: every other multimodal model has it off, as arg_groups/cuda_graph_hook.py says).
PREFILL_GRAPH_MULTIMODAL_ARCHS = frozenset({"KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration"})


def prefill_cuda_graphs(layout: Layout, multimodal: bool, release: str, architecture: str = "") -> bool:
    """Whether SGLang captures a CUDA graph for prefill, whose reserve (1.5 GiB on MLA models) the default fraction
    keeps out of the pool. 0.5.10 (``_handle_piecewise_cuda_graph``, piecewise graphs): not with pipeline stages,
    DP attention or a multimodal model. 0.5.23 (``arg_groups/cuda_graph_hook.py``, the breakable prefill graph, on
    by default): not with pipeline stages, nor for a multimodal model outside PREFILL_GRAPH_MULTIMODAL_ARCHS; DP
    attention no longer turns it off. The other conditions they check are flags no profile sets."""
    if release == "0.5.10":
        return layout.pp == 1 and not layout.dp_attention and not multimodal
    if release == "0.5.23":
        return layout.pp == 1 and (not multimodal or architecture in PREFILL_GRAPH_MULTIMODAL_ARCHS)
    raise PlanError(f"The planner has no memory arithmetic of SGLang {release}; it knows 0.5.10 and 0.5.23.")


def reserved_memory_mib(gpu_mem_mib: float, layout: Layout, multimodal: bool, release: str,
                        architecture: str = "") -> float:
    """MiB SGLang ``release`` keeps outside the static pool for activations and CUDA graphs
    (0.5.10's ``ServerArgs._handle_gpu_memory_settings``, 0.5.23's ``arg_groups/memory_hook.py``, the same sum
    for these layouts on GPUs above 60 GiB; its MLA models reserve 1.5 GiB more for prefill graphs)."""
    chunked, graph_bs = gpu_memory_defaults(gpu_mem_mib, layout.tp)
    chunked = layout.chunked_prefill_size if layout.chunked_prefill_size is not None else chunked
    graph_bs = layout.cuda_graph_max_bs if layout.cuda_graph_max_bs is not None else graph_bs
    reserved = 512.0  # constant metadata, e.g. the attention backend's
    reserved += max(chunked, 2048) * 1.5  # activations of a large prefill (max_prefill_tokens when <= 0)
    reserved += graph_bs * 2  # CUDA graphs
    reserved += layout.tp * layout.pp / 8 * 1024  # larger parallel groups need more
    if layout.dp_attention:
        reserved += graph_bs * layout.dp * 3
        if graph_bs > 300:
            reserved += graph_bs * layout.dp * 1.5
    if prefill_cuda_graphs(layout, multimodal, release, architecture):
        reserved += 1.5 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


def vlm_mem_fraction_factor(vision: VisionTower | None) -> float:
    """SGLang's multiplier on mem_fraction_static for a model with a vision tower
    (``adjust_mem_fraction_for_vlm``): 0.95, scaled by the tower's size against a ViT-L/14."""
    if vision is None:
        return 1.0
    ratio = vision.layers * vision.hidden**2 / (_VIT_L_LAYERS * _VIT_L_HIDDEN**2)
    dynamic = max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return 0.95 * dynamic


def max_mem_fraction_static(gpu_mem_mib: float, layout: Layout, multimodal: bool, release: str,
                            architecture: str = "") -> float:
    """The largest --mem-fraction-static that keeps SGLang's own reserve for activations and CUDA graphs
    outside the pool: its default before the vision-tower reduction, ``round((total − reserved) / total, 3)``
    with ``gpu_mem_mib`` nvidia-smi's memory.total."""
    reserved = reserved_memory_mib(gpu_mem_mib, layout, multimodal, release, architecture)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def default_mem_fraction_static(gpu_mem_mib: float, layout: Layout, vision: VisionTower | None,
                                release: str, architecture: str = "") -> float:
    """SGLang ``release``'s default --mem-fraction-static on a GPU whose nvidia-smi memory.total is ``gpu_mem_mib``.

    A port of ``ServerArgs._handle_gpu_memory_settings`` (sglang/srt/server_args.py in 0.5.10,
    arg_groups/memory_hook.py in 0.5.23; no speculative decoding) followed by ``adjust_mem_fraction_for_vlm`` for a
    model with a vision tower (the same factor in both).
    """
    return (max_mem_fraction_static(gpu_mem_mib, layout, vision is not None, release, architecture)
            * vlm_mem_fraction_factor(vision))


def custom_all_reduce_pairs(layout: Layout) -> list[str]:
    """The process groups in which SGLang's custom all-reduce runs over CUDA P2P on PCIe-only GPUs.

    SGLang gives a custom all-reduce to the TP group and to the MoE EP, TP and DP groups that differ
    from it (distributed/parallel_state.py); on GPUs without NVLink it disables it for groups of more
    than two (custom_all_reduce_utils.can_use_custom_all_reduce_with_nvlink), so exactly the groups of
    two keep it, and it talks P2P whatever NCCL_P2P_DISABLE says.
    """
    groups = [("TP", layout.tp)]
    if layout.ep != layout.tp:
        groups.append(("MoE EP", layout.ep))
    if layout.moe_tp != layout.tp:
        groups.append(("MoE TP", layout.moe_tp))
    return [f"the {name} group" for name, size in groups if size == 2]


def kv_bytes_per_token_layer(shape: ModelShape, kv_cache_dtype: str) -> int:
    """KV-cache bytes of one token in one layer: MLA keeps one latent of kv_lora_rank + qk_rope_head_dim
    (model_runner_kv_cache_mixin.get_cell_size_per_token); fp4_e2m1 packs two values a byte plus one
    scale byte per 16."""
    latent = shape.kv_lora_rank + shape.qk_rope_head_dim
    if kv_cache_dtype == "fp4_e2m1":
        return latent // 2 + latent // 16
    return latent * (1 if kv_cache_dtype.startswith("fp8") else 2)


# ---------------------------------------------------------------------------------------------------
# Weights per rank
# ---------------------------------------------------------------------------------------------------


def _attention_bytes(shape: ModelShape, attn_tp: int, index: int) -> int:
    q = shape.quant
    name = f"model.layers.{index}.self_attn."
    heads = shape.num_heads // attn_tp
    qk_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    total = 0
    if shape.q_lora_rank:
        # fused q_a + kv_a_with_mqa: replicated on every attention rank
        total += q.matrix_bytes(shape.q_lora_rank, shape.hidden, name + "q_a_proj")
        total += q.matrix_bytes(heads * qk_head, shape.q_lora_rank, name + "q_b_proj")
        total += shape.q_lora_rank * 2  # q_a_layernorm
    else:
        total += q.matrix_bytes(heads * qk_head, shape.hidden, name + "q_proj")
    total += q.matrix_bytes(
        shape.kv_lora_rank + shape.qk_rope_head_dim, shape.hidden, name + "kv_a_proj_with_mqa"
    )
    total += shape.kv_lora_rank * 2  # kv_a_layernorm
    total += q.matrix_bytes(
        heads * (shape.qk_nope_head_dim + shape.v_head_dim), shape.kv_lora_rank, name + "kv_b_proj"
    )
    total += q.matrix_bytes(shape.hidden, heads * shape.v_head_dim, name + "o_proj")
    total += 2 * shape.hidden * 2  # input_layernorm + post_attention_layernorm
    return total


def _mlp_bytes(shape: ModelShape, intermediate: int, module: str) -> int:
    """gate, up and down projections of one MLP whose intermediate size is already sharded."""
    q = shape.quant
    return (
        q.matrix_bytes(intermediate, shape.hidden, module + ".gate_proj")
        + q.matrix_bytes(intermediate, shape.hidden, module + ".up_proj")
        + q.matrix_bytes(shape.hidden, intermediate, module + ".down_proj")
    )


def routed_expert_bytes(shape: ModelShape, moe_tp: int, index: int = 1) -> int:
    """Bytes of one routed expert's shard (1/moe_tp of its intermediate size) on one GPU."""
    return _mlp_bytes(shape, shape.moe_intermediate // moe_tp, f"model.layers.{index}.mlp.experts.0")


def expert_index_bytes(shape: ModelShape, moe_tp: int, index: int = 1) -> int:
    """Bytes of the int32 activation-order indices a compressed-tensors (WNA16) fused-MoE layer allocates
    per local expert on top of the checkpoint's tensors (CompressedTensorsWNA16MoEMethod.create_weights):
    ``w13_weight_g_idx`` and ``w13_g_idx_sort_indices`` over the hidden size, which moe_tp does not split,
    and ``w2_weight_g_idx`` and ``w2_g_idx_sort_indices`` over the intermediate shard. With every expert
    on every GPU (--ep-size 1) they come to about 1.3 GiB per GPU for K2.6."""
    module = f"model.layers.{index}.mlp.experts.0.gate_proj"
    if shape.quant.method != "compressed-tensors" or not shape.quant.is_quantized(module):
        return 0
    return 2 * (shape.hidden + shape.moe_intermediate // moe_tp) * 4


def mla_absorb_bytes(shape: ModelShape, attn_tp: int) -> int:
    """Bytes of the BF16 copies of kv_b_proj, split per head, that DeepseekV2's post_load_weights keeps for
    MLA's absorbed matmuls (w_kc, w_vc), in one layer; about 1 GiB per GPU for K2.6 at attn_tp 1."""
    heads = shape.num_heads // attn_tp
    return heads * shape.kv_lora_rank * (shape.qk_nope_head_dim + shape.v_head_dim) * 2


def stage_weight_bytes(shape: ModelShape, layout: Layout, stage: int) -> dict[str, int]:
    """Weight bytes on one GPU of pipeline stage ``stage``, by component."""
    split = pp_layer_split(shape.num_layers, layout.pp)
    start = sum(split[:stage])
    layers = range(start, start + split[stage])
    attn_tp, tp, moe_tp = layout.attn_tp, layout.tp, layout.moe_tp
    experts_here = shape.n_routed_experts // layout.ep
    parts = {"attention": 0, "mla_absorb": 0, "dense_mlp": 0, "shared_experts": 0, "router": 0,
             "routed_experts": 0, "expert_indices": 0}
    for index in layers:
        parts["attention"] += _attention_bytes(shape, attn_tp, index)
        parts["mla_absorb"] += mla_absorb_bytes(shape, attn_tp)
        if shape.is_moe_layer(index):
            parts["router"] += shape.n_routed_experts * shape.hidden * 2 + shape.n_routed_experts * 4
            if shape.n_shared_experts:
                parts["shared_experts"] += _mlp_bytes(
                    shape,
                    shape.n_shared_experts * shape.moe_intermediate // tp,
                    f"model.layers.{index}.mlp.shared_experts",
                )
            parts["routed_experts"] += experts_here * routed_expert_bytes(shape, moe_tp, index)
            parts["expert_indices"] += experts_here * expert_index_bytes(shape, moe_tp, index)
        else:
            parts["dense_mlp"] += _mlp_bytes(shape, shape.intermediate // tp, f"model.layers.{index}.mlp")
    vocab_row = shape.hidden * 2
    if shape.vision is not None:  # KimiK25ForConditionalGeneration builds it on every pipeline rank
        parts["vision_tower"] = vision_tower_bytes(shape.vision, attn_tp)
    if stage == 0:
        embed_shards = 1 if layout.dp_attention else tp
        parts["embed_tokens"] = _ceil_div(shape.vocab_size, embed_shards) * vocab_row
    if stage == layout.pp - 1:
        parts["final_norm"] = shape.hidden * 2
        if not (shape.tie_word_embeddings and layout.pp == 1):
            parts["lm_head"] = _ceil_div(shape.vocab_size, tp) * vocab_row
    return parts


def vision_tower_bytes(vision: VisionTower, attn_tp: int) -> int:
    """BF16 bytes of a MoonViT-style vision tower plus its patch-merger projector on one GPU.

    Each encoder block's attention is TP-sharded over the attention TP group (VisionAttention's
    QKVParallelLinear and RowParallelLinear, layers/attention/vision.py; the output bias stays whole);
    its MLP (nn.Linear), norms, the patch and position embeddings and the projector are replicated.
    """
    h, inter = vision.hidden, vision.intermediate
    heads_here = max(vision.heads // attn_tp, 1)
    head_dim = h // vision.heads if vision.heads else h
    qkv = 3 * heads_here * head_dim
    attention = qkv * h + qkv + h * heads_here * head_dim + h
    per_block = attention + 2 * h * inter + inter + h + 4 * h  # MLP fc0/fc1 with biases, two LayerNorms
    embed = h * 3 * vision.patch**2 + h + vision.pos_emb[0] * vision.pos_emb[1] * h
    merged = vision.projector_hidden * vision.merge[0] * vision.merge[1]
    text = vision.text_hidden
    projector = 2 * vision.projector_hidden + merged * merged + merged + text * merged + text
    return 2 * (vision.layers * per_block + 2 * h + embed + projector)


# ---------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """The planner's answer for one layout on one host.

    Byte figures are for one GPU of the heaviest pipeline stage (``weights_*``) or of the stage with
    the fewest KV tokens (``kv_*``); ``experts_per_gpu`` counts whole-expert equivalents (48 for
    --tp-size 8 whether experts are whole or split); ``suggested_flags``/``suggested_profile`` are set
    when GPUs sit idle. ``sglang_default_mem_fraction_static`` is what SGLang would pick with the flag
    unset, ``max_mem_fraction_static`` the most that keeps SGLang's own reserve for activations and CUDA
    graphs outside the pool, and ``suggested_mem_fraction_static`` the planner's choice when the default
    leaves too few KV tokens (None when the default is enough or nothing fits).
    """

    layout: Layout
    gpus_available: int
    gpus_used: int
    verdict: str
    reason: str
    free_bytes_per_gpu: int = 0
    weights_bytes_per_gpu: int = 0
    weights_gib_per_gpu: float = 0.0
    heaviest_stage: int = 0
    weights_breakdown: dict[str, int] = field(default_factory=dict)
    experts_per_gpu: float = 0.0
    mem_fraction_static: float = 0.0
    sglang_default_mem_fraction_static: float = 0.0
    max_mem_fraction_static: float = 0.0
    suggested_mem_fraction_static: float | None = None
    kv_pool_bytes: int = 0
    kv_bytes_per_token: int = 0
    kv_tokens: int = 0
    suggested_flags: dict[str, Any] | None = None
    suggested_profile: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["flags"] = self.layout.flags()
        out.pop("layout")
        return out


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def suggest_full_host_layout(layout: Layout, gpus: int) -> Layout | None:
    """The layout an operator probably meant when theirs leaves GPUs idle.

    Operators name layouts "TPx EPy" for "experts in y groups, each split x ways", which in SGLang is
    ``--tp-size x·y --ep-size y``; typing ``--tp-size x --ep-size y`` instead starts only x GPUs.
    """
    if layout.gpus_used >= gpus or layout.gpus_used <= 0 or gpus % layout.gpus_used:
        return None
    scale = gpus // layout.gpus_used
    if layout.ep > 1 and scale == layout.ep:
        return Layout(**{**asdict(layout), "tp": layout.tp * layout.ep})
    return Layout(**{**asdict(layout), "tp": layout.tp * scale})


def _catalog_match(catalog: Mapping[str, Mapping[str, Any]] | None, wanted: Layout) -> str | None:
    if not catalog:
        return None
    key = (
        wanted.tp,
        wanted.ep,
        wanted.pp,
        wanted.dp if wanted.dp_attention or wanted.dp > 1 else 1,
        wanted.dp_attention,
    )
    for name, profile in catalog.items():
        flags = profile.get("flags", profile) if isinstance(profile, Mapping) else {}
        try:
            other = Layout.from_flags(flags)
        except (TypeError, ValueError):
            continue
        if (other.tp, other.ep, other.pp, other.dp, other.dp_attention) == key:
            return name
    return None


def plan(
    config: Mapping[str, Any] | ModelShape,
    gpus: int,
    gpu_memory_gib: float,
    layout: Layout | Mapping[str, Any],
    catalog: Mapping[str, Mapping[str, Any]] | None = None,
    smi_memory_mib: float | None = None,
    *,
    release: str,
) -> Plan:
    """Plan one layout on a host of ``gpus`` GPUs of ``gpu_memory_gib`` GiB (PyTorch's total capacity).

    ``layout`` is a Layout or a flag mapping (``{"tp_size": 8, "ep_size": 4}``); ``catalog`` maps profile
    names to profiles (or bare flag mappings) and is used only to name the profile an operator probably
    meant; ``smi_memory_mib`` is nvidia-smi's memory.total, which SGLang's default mem fraction is sized
    from (97887 on an RTX PRO 6000; defaults to the PyTorch figure in MiB, which gives the same three
    decimals there); ``release`` the SGLang release whose default fraction and reserve are reproduced.
    """
    shape = config if isinstance(config, ModelShape) else model_shape(config)
    if not isinstance(layout, Layout):
        try:
            layout = Layout.from_flags(layout)
        except (TypeError, ValueError) as exc:
            raise PlanError(f"The layout flags are not numbers where numbers are needed ({exc}).") from None
    if gpus < 1 or gpu_memory_gib <= 0:
        raise PlanError("The GPU count and GPU memory must both be positive.")

    def invalid(reason: str) -> Plan:
        return Plan(layout, gpus, layout.gpus_used if not layout_problems(layout) else 0, "invalid", reason)

    problems = layout_problems(layout)
    if problems:
        return invalid(" ".join(problems))
    problems = _model_problems(shape, layout)
    if layout.gpus_used > gpus:
        problems.append(f"{layout.cli()} starts {layout.gpus_used} GPUs but the host has {gpus}.")
    if problems:
        return invalid(" ".join(problems))

    gpu_mem_mib = smi_memory_mib if smi_memory_mib else gpu_memory_gib * 1024
    sglang_default = default_mem_fraction_static(gpu_mem_mib, layout, shape.vision, release, shape.architecture)
    ceiling = max_mem_fraction_static(gpu_mem_mib, layout, shape.multimodal, release, shape.architecture)
    frac = float(layout.mem_fraction_static) if layout.mem_fraction_static is not None else sglang_default
    free_at_init = (gpu_memory_gib - INIT_OVERHEAD_GIB) * GIB

    stages = [stage_weight_bytes(shape, layout, s) for s in range(layout.pp)]
    split = pp_layer_split(shape.num_layers, layout.pp)
    kv_bytes_per_layer = kv_bytes_per_token_layer(shape, layout.kv_cache_dtype)
    stage_weights = [sum(parts.values()) for parts in stages]

    def tokens_by_stage(fraction: float) -> list[int]:
        # SGLang sizes one pool for the whole model; the rank with least room decides the token count.
        return [
            int(max(free_at_init * fraction - w, 0) // (kv_bytes_per_layer * split[s]))
            for s, w in enumerate(stage_weights)
        ]

    pools = [free_at_init * frac - w for w in stage_weights]
    kv_tokens_by_stage = tokens_by_stage(frac)
    heaviest = max(range(layout.pp), key=lambda s: stage_weights[s])
    if min(pools) <= 0:
        tightest = min(range(layout.pp), key=lambda s: pools[s])
    else:
        tightest = min(range(layout.pp), key=lambda s: kv_tokens_by_stage[s])
    weights = stage_weights[heaviest]
    wanted_tokens = max(TIGHT_MIN_KV_TOKENS, layout.context_length or 0)
    # The fraction the planner would set: the least (to 0.01) that holds the wanted tokens on every stage,
    # never above the ceiling that keeps SGLang's reserve; the ceiling itself when even that falls short.
    needed = max(
        (w + wanted_tokens * kv_bytes_per_layer * split[s]) / free_at_init for s, w in enumerate(stage_weights)
    )
    chosen = min(_ceil_hundredth(needed), ceiling)
    if weights >= free_at_init * ceiling or min(tokens_by_stage(sglang_default)) >= wanted_tokens:
        chosen = None
    result = Plan(
        layout=layout,
        gpus_available=gpus,
        gpus_used=layout.gpus_used,
        verdict="fits",
        reason="",
        free_bytes_per_gpu=int(free_at_init),
        weights_bytes_per_gpu=weights,
        weights_gib_per_gpu=round(weights / GIB, 2),
        heaviest_stage=heaviest,
        weights_breakdown=dict(stages[heaviest]),
        experts_per_gpu=shape.n_routed_experts / layout.ep / layout.moe_tp,
        mem_fraction_static=round(frac, 3),
        sglang_default_mem_fraction_static=round(sglang_default, 3),
        max_mem_fraction_static=ceiling,
        suggested_mem_fraction_static=chosen,
        kv_pool_bytes=int(max(pools[tightest], 0)),
        kv_bytes_per_token=kv_bytes_per_layer * split[tightest],
        kv_tokens=kv_tokens_by_stage[tightest],
    )

    idle = ""
    if layout.gpus_used < gpus:
        idle = _idle_sentence(shape, layout, gpus)
        wanted = suggest_full_host_layout(layout, gpus)
        if wanted is not None:
            result.suggested_flags = wanted.flags()
            result.suggested_profile = _catalog_match(catalog, wanted)
            meant = (
                f"{result.suggested_profile} ({wanted.cli()})" if result.suggested_profile else wanted.cli()
            )
            idle += f" Did you mean {meant}?"

    routed = stages[heaviest].get("routed_experts", 0)
    where = f" on pipeline stage {heaviest}" if layout.pp > 1 else ""
    default_words = _default_words(ceiling, shape.vision)
    reserve = _gib(reserved_memory_mib(gpu_mem_mib, layout, shape.multimodal, release, shape.architecture) * MIB)
    if weights > free_at_init:
        result.verdict = "oom"
        result.reason = (
            f"Weights need {_gib(weights)} per GPU{where} ({_gib(routed)} of it routed experts) but only "
            f"{_gib(free_at_init)} of {gpu_memory_gib:g} GiB is free after start-up: the model load "
            f"runs out of memory. {idle}"
        ).strip()
        return result
    fix = (
        f" Set mem_fraction_static {chosen:.2f} in the profile: the least that holds {wanted_tokens:,} tokens "
        f"while SGLang keeps its {reserve} for activations and CUDA graphs (up to {ceiling:.3f} does)."
        if chosen is not None and layout.mem_fraction_static is None
        else ""
    )
    if pools[tightest] <= 0:
        at_least = weights / free_at_init
        origin = f"SGLang's default: {default_words}" if layout.mem_fraction_static is None else "set by the profile"
        result.verdict = "oom"
        result.reason = (
            f"Weights ({_gib(weights)} per GPU{where}) exceed the static pool, {_gib(free_at_init * frac)} at "
            f"mem fraction {frac:.3f} ({origin}), "
            f'so SGLang stops with "Not enough memory" when it sizes the KV cache; --mem-fraction-static '
            f"above {at_least:.3f} would leave room.{fix} {idle}"
        ).strip()
        return result

    summary = (
        f"{_gib(weights)} of weights per GPU{where}, KV pool {_gib(pools[tightest])} for "
        f"{result.kv_tokens:,} tokens at mem fraction {frac:.3f}"
    )
    if layout.mem_fraction_static is None:
        summary += f" (SGLang's default: {default_words})."
    else:
        default_tokens = min(tokens_by_stage(sglang_default))
        summary += (
            f", set by the profile; SGLang's default, {sglang_default:.3f} ({default_words}), would leave "
            f"{default_tokens:,} tokens."
        )
        if frac <= ceiling:
            summary += f" Up to {ceiling:.3f} keeps SGLang's {reserve} for activations and CUDA graphs."
    if result.kv_tokens < wanted_tokens:
        result.verdict = "tight"
        result.reason = (
            f"{summary} That is fewer than {wanted_tokens:,} tokens, so few long requests fit.{fix} {idle}"
        )
    elif frac > ceiling:
        result.verdict = "tight"
        result.reason = (
            f"{summary} Above {ceiling:.3f} less stays outside the pool for activations and CUDA graphs than "
            f"the {reserve} SGLang's own heuristic keeps. {idle}"
        )
    else:
        result.reason = f"{summary} {idle}"
    result.reason = result.reason.strip()
    return result


def _ceil_hundredth(value: float) -> float:
    return -(-round(value * 100, 6) // 1) / 100


def _default_words(ceiling: float, vision: VisionTower | None) -> str:
    """Where SGLang's default fraction comes from, e.g. "0.848 x 0.910 for a 27-layer, 1152-wide vision tower"."""
    if vision is None:
        return "no vision tower"
    return (
        f"{ceiling:.3f} x {vlm_mem_fraction_factor(vision):.3f} for a {vision.layers}-layer, "
        f"{vision.hidden}-wide vision tower"
    )


def _model_problems(shape: ModelShape, layout: Layout) -> list[str]:
    problems = []
    if shape.n_routed_experts and shape.n_routed_experts % layout.ep:
        problems.append(
            f"--ep-size {layout.ep} does not divide the model's {shape.n_routed_experts} experts."
        )
    if shape.moe_intermediate and shape.moe_intermediate % layout.moe_tp:
        problems.append(
            f"Each expert cannot be split {layout.moe_tp} ways: "
            f"its intermediate size is {shape.moe_intermediate}."
        )
    if shape.num_heads % layout.attn_tp:
        problems.append(f"{shape.num_heads} attention heads cannot be split across {layout.attn_tp} GPUs.")
    if layout.pp > shape.num_layers:
        problems.append(f"--pp-size {layout.pp} exceeds the model's {shape.num_layers} layers.")
    return problems


def _idle_sentence(shape: ModelShape, layout: Layout, gpus: int) -> str:
    text = f"{layout.cli()} uses only {layout.gpus_used} of {gpus} GPUs"
    if shape.n_routed_experts:
        share = shape.n_routed_experts // layout.ep
        split = f", each split {layout.moe_tp} ways" if layout.moe_tp > 1 else ""
        text += (
            f": each GPU holds {share} of the {shape.n_routed_experts} experts{split}, 1/{layout.tp} of all "
            f"expert weights, because EP groups are carved out of the {layout.tp}-GPU TP group "
            "and add no GPUs"
        )
    return text + "."


def headroom_bytes(result: Plan) -> int:
    """Free bytes left after weights on the heaviest GPU, whatever the mem fraction: the margin
    against a weight-load OOM, which a fallback must widen. Zero for layouts that cannot start."""
    if result.verdict == "invalid":
        return 0
    return max(result.free_bytes_per_gpu - result.weights_bytes_per_gpu, 0)


def plan_many(
    config: Mapping[str, Any],
    gpus: int,
    gpu_memory_gib: float,
    layouts: Mapping[str, Layout | Mapping[str, Any]] | Sequence[tuple[str, Layout | Mapping[str, Any]]],
    catalog: Mapping[str, Mapping[str, Any]] | None = None,
    smi_memory_mib: float | None = None,
    *,
    release: str,
) -> list[tuple[str, Plan]]:
    """Plan several named layouts against one model config (parsed once), for SGLang ``release``."""
    shape = model_shape(config)
    items = layouts.items() if isinstance(layouts, Mapping) else layouts
    return [(name, plan(shape, gpus, gpu_memory_gib, lay, catalog, smi_memory_mib, release=release))
            for name, lay in items]
