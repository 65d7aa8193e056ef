"""The memory planner against numbers computed here independently, and against the field observation."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import planner
from ansible_collections.moefleet.serving.plugins.module_utils.planner import GIB, Layout

ROOT = Path(__file__).resolve().parents[2]
# The arithmetic of SGLang 0.5.10 (the release the roles pin); a test of 0.5.23's says so.
RELEASE = "0.5.10"


def plan(*args, release: str = RELEASE, **kwargs):
    return planner.plan(*args, release=release, **kwargs)


DATA = ROOT / "tests" / "data" / "model-configs"
K26 = json.loads((DATA / "kimi-k2.6-config.json").read_text())
DSV3 = json.loads((DATA / "deepseek-v3-config.json").read_text())
GPUS, MEM = 8, 94.97
SMI_MIB = 97887  # nvidia-smi's memory.total of an RTX PRO 6000, which SGLang sizes its default from

# Kimi K2.x routed expert: three 7168 x 2048 matrices, INT4 packed (0.5 B/param) + BF16 scale per 32.
EXPERT_MATRIX_PARAMS = 7168 * 2048
INT4_G32 = 0.5 + 2 / 32
MOE_LAYERS = 60


def test_k26_config_is_read_from_text_config():
    shape = planner.model_shape(K26)
    assert (shape.num_layers, shape.hidden, shape.n_routed_experts, shape.first_k_dense) == (61, 7168, 384, 1)
    assert shape.quant.method == "compressed-tensors"
    assert (shape.quant.num_bits, shape.quant.group_size) == (4, 32)
    assert shape.vision is not None


def test_quantization_config_found_at_top_level_only():
    config = copy.deepcopy(K26)
    del config["text_config"]["quantization_config"]
    assert planner.model_shape(config).quant.method == "compressed-tensors"


def test_ignore_list_keeps_attention_shared_and_dense_mlp_bf16():
    quant = planner.model_shape(K26).quant
    assert not quant.is_quantized("model.layers.5.self_attn.o_proj")
    assert not quant.is_quantized("model.layers.5.mlp.shared_experts.up_proj")
    assert not quant.is_quantized("model.layers.0.mlp.gate_proj")
    assert not quant.is_quantized("lm_head")
    assert quant.is_quantized("model.layers.5.mlp.experts.17.down_proj")


def test_routed_expert_bytes_for_ep8():
    result = plan(K26, GPUS, MEM, {"tp_size": 8, "ep_size": 8})
    packed_and_scales = 48 * MOE_LAYERS * 3 * EXPERT_MATRIX_PARAMS * INT4_G32
    weight_shapes = 48 * MOE_LAYERS * 3 * 8
    assert result.weights_breakdown["routed_experts"] == packed_and_scales + weight_shapes


def test_routed_experts_total_matches_the_checkpoint_tensor_table():
    # K2.5's tensor table: 157.50 GiB packed + 19.69 GiB scales for each of the three projections.
    one_gpu = plan(K26, GPUS, MEM, {"tp_size": 8, "ep_size": 8}).weights_breakdown["routed_experts"]
    assert one_gpu * 8 / GIB == pytest.approx(3 * (157.50 + 19.6875), abs=0.01)


def test_tp8_splits_every_expert_and_holds_the_same_expert_bytes_as_ep8():
    tp8 = plan(K26, GPUS, MEM, {"tp_size": 8}).weights_breakdown["routed_experts"]
    ep8 = plan(K26, GPUS, MEM, {"tp_size": 8, "ep_size": 8}).weights_breakdown["routed_experts"]
    assert tp8 - ep8 == (384 - 48) * MOE_LAYERS * 3 * 8  # only the per-matrix weight_shape differs


def test_expert_indices_are_per_local_expert_and_not_split_by_moe_tp():
    # w13 g_idx + sort indices over hidden (7168), w2's over the expert's intermediate shard; int32.
    tp8 = plan(K26, GPUS, MEM, {"tp_size": 8}).weights_breakdown["expert_indices"]
    ep8 = plan(K26, GPUS, MEM, {"tp_size": 8, "ep_size": 8}).weights_breakdown["expert_indices"]
    assert tp8 == MOE_LAYERS * 384 * 2 * (7168 + 2048 // 8) * 4
    assert ep8 == MOE_LAYERS * 48 * 2 * (7168 + 2048) * 4
    assert tp8 / GIB == pytest.approx(1.27, abs=0.01)
    fp8 = plan(DSV3, GPUS, MEM, {"tp_size": 8}).weights_breakdown["expert_indices"]
    assert fp8 == 0  # block-FP8 experts carry no activation-order indices


def test_mla_absorb_copies_follow_attention_tp():
    per_head = 512 * (128 + 128) * 2  # w_kc (128 x 512) + w_vc (512 x 128), BF16
    tp8 = plan(K26, GPUS, MEM, {"tp_size": 8}).weights_breakdown["mla_absorb"]
    dpa = {"tp_size": 8, "ep_size": 8, "dp_size": 8, "enable_dp_attention": True}
    assert tp8 == 61 * 8 * per_head
    assert plan(K26, GPUS, MEM, dpa).weights_breakdown["mla_absorb"] == 61 * 64 * per_head


def test_attention_shards_by_attention_tp_and_replicates_the_a_projections():
    bf16 = 2
    replicated = (1536 * 7168 + 576 * 7168 + 1536 + 512 + 2 * 7168) * bf16
    sharded = (64 * 192 * 1536 + 64 * 256 * 512 + 7168 * 64 * 128) * bf16
    tp8 = plan(K26, GPUS, MEM, {"tp_size": 8}).weights_breakdown["attention"]
    assert tp8 == 61 * (replicated + sharded // 8)
    dpa = {"tp_size": 8, "ep_size": 8, "dp_size": 8, "enable_dp_attention": True}
    assert plan(K26, GPUS, MEM, dpa).weights_breakdown["attention"] == 61 * (replicated + sharded)


def test_embedding_is_replicated_under_dp_attention_and_lm_head_stays_sharded():
    dpa = {"tp_size": 8, "ep_size": 8, "dp_size": 8, "enable_dp_attention": True}
    parts = plan(K26, GPUS, MEM, dpa).weights_breakdown
    assert parts["embed_tokens"] == 163840 * 7168 * 2
    assert parts["lm_head"] == 163840 * 7168 * 2 // 8


def test_pp_split_puts_remainder_layers_last():
    assert planner.pp_layer_split(61, 8) == [7, 7, 7, 8, 8, 8, 8, 8]
    assert planner.pp_layer_split(61, 2) == [30, 31]


def test_pp8_heaviest_rank_is_the_last_stage_with_lm_head():
    result = plan(K26, GPUS, MEM, {"tp_size": 1, "pp_size": 8})
    assert result.heaviest_stage == 7
    assert result.weights_breakdown["lm_head"] == 163840 * 7168 * 2
    assert result.weights_breakdown["routed_experts"] == 8 * 384 * (3 * EXPERT_MATRIX_PARAMS * INT4_G32 + 24)
    # KV for 8 layers only on that stage
    assert result.kv_bytes_per_token in {(512 + 64) * 2 * 7, (512 + 64) * 2 * 8}


def test_kv_bytes_per_token_follow_mla_latent_and_dtype():
    assert plan(K26, GPUS, MEM, {"tp_size": 8}).kv_bytes_per_token == (512 + 64) * 61 * 2
    fp8 = plan(K26, GPUS, MEM, {"tp_size": 8, "kv_cache_dtype": "fp8_e4m3"})
    assert fp8.kv_bytes_per_token == (512 + 64) * 61
    bf16 = plan(K26, GPUS, MEM, {"tp_size": 8})
    assert fp8.kv_tokens == pytest.approx(2 * bf16.kv_tokens, rel=1e-4)


def test_kv_tokens_are_the_static_pool_minus_weights():
    result = plan(K26, GPUS, MEM, {"tp_size": 8, "mem_fraction_static": 0.8})
    free = (MEM - planner.INIT_OVERHEAD_GIB) * GIB
    pool = free * 0.8 - result.weights_bytes_per_gpu
    assert result.kv_tokens == int(pool // ((512 + 64) * 61 * 2))


def test_k26_default_mem_fraction_is_sglangs_0_771_from_its_vision_config_class():
    # SGLang builds KimiK25VisionConfig(**vision_config): num_hidden_layers/hidden_size keep their defaults
    # 27/1152 (the JSON says vt_num_hidden_layers/vt_hidden_size, which do not override them), so
    # adjust_mem_fraction_for_vlm scales 0.848 by 0.95 x (1 - 0.1 x (27 x 1152^2 / (24 x 1024^2) - 1)).
    factor = 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))
    assert factor == pytest.approx(0.9097, abs=1e-4)
    result = plan(K26, GPUS, MEM, {"tp_size": 8}, smi_memory_mib=SMI_MIB)
    assert result.sglang_default_mem_fraction_static == result.mem_fraction_static == 0.771
    assert round((SMI_MIB - 14848) / SMI_MIB, 3) * factor == pytest.approx(0.771, abs=5e-4)
    tower = planner.model_shape(K26).vision
    assert (tower.layers, tower.hidden, tower.intermediate, tower.heads) == (27, 1152, 4304, 16)


def test_kimi_vision_config_keys_with_sglangs_names_do_override_its_defaults():
    config = copy.deepcopy(K26)
    config["vision_config"].update({"num_hidden_layers": 24, "hidden_size": 1024})
    result = plan(config, GPUS, MEM, {"tp_size": 8}, smi_memory_mib=SMI_MIB)
    assert result.sglang_default_mem_fraction_static == round(0.848 * 0.95, 3)  # a ViT-L: factor 0.95 exactly


def test_other_vlm_reads_plain_vision_keys_and_falls_back_to_vit_l():
    config = copy.deepcopy(K26)
    config["model_type"] = "some_vlm"
    config["vision_config"] = {"num_hidden_layers": 48, "hidden_size": 2048}  # 8x a ViT-L: clamped at 0.8
    assert planner.vlm_mem_fraction_factor(planner.model_shape(config).vision) == pytest.approx(0.95 * 0.8)
    config["vision_config"] = {"patch_size": 14}  # neither key: SGLang's getattr defaults, 24 x 1024
    assert planner.vlm_mem_fraction_factor(planner.model_shape(config).vision) == pytest.approx(0.95)


def test_text_only_deepseek_v3_has_no_vlm_adjustment_but_reserves_for_piecewise_cuda_graphs():
    # No vision tower: no adjustment; an MLA model with piecewise CUDA graphs (pp 1, no DP attention,
    # not multimodal) reserves 1.5 GiB more: 512 + 8192 x 1.5 + 512 x 2 + 1024 + 1536 = 16384 MiB.
    result = plan(DSV3, GPUS, MEM, {"tp_size": 8}, smi_memory_mib=SMI_MIB)
    assert result.mem_fraction_static == round((SMI_MIB - 16384) / SMI_MIB, 3) == 0.833
    pp = plan(DSV3, GPUS, MEM, {"tp_size": 4, "pp_size": 2}, smi_memory_mib=SMI_MIB)  # pp: no piecewise graphs
    assert pp.mem_fraction_static == round((SMI_MIB - (512 + 12288 + 1024 + 1024)) / SMI_MIB, 3)


def test_default_mem_fraction_follows_sglang_heuristic():
    # 97887 MiB, TP8: reserved = 512 + 8192*1.5 + 512*2 + 8*1/8*1024 = 14848 MiB
    assert planner.reserved_memory_mib(SMI_MIB, Layout(tp=8), True, RELEASE) == 14848
    assert planner.max_mem_fraction_static(SMI_MIB, Layout(tp=8), True, RELEASE) == 0.848
    # DP attention reserves per DP rank; large graph batches reserve more.
    dpa = Layout(tp=8, ep=8, dp=8, dp_attention=True)
    assert planner.reserved_memory_mib(SMI_MIB, dpa, False, RELEASE) == 14848 + 512 * 8 * 3 + 512 * 8 * 1.5


def test_vision_tower_sits_on_every_pipeline_stage_with_its_attention_sharded():
    tp1 = plan(K26, GPUS, MEM, {"tp_size": 1, "pp_size": 8})
    stages = [planner.stage_weight_bytes(planner.model_shape(K26), tp1.layout, s) for s in range(8)]
    assert all(parts["vision_tower"] == stages[0]["vision_tower"] for parts in stages)
    h, blocks = 1152, 27
    tp8 = plan(K26, GPUS, MEM, {"tp_size": 8}).weights_breakdown["vision_tower"]
    # qkv weight and bias and the proj weight split 8 ways (BF16); proj's bias stays whole
    whole_but_attention_bias = blocks * (3 * h * h + 3 * h + h * h) * 2
    assert stages[0]["vision_tower"] - tp8 == whole_but_attention_bias * 7 // 8


@pytest.mark.parametrize(
    "flags",
    [
        {"tp_size": 8},
        {"tp_size": 8, "ep_size": 8},
        {"tp_size": 8, "ep_size": 4},
        {"tp_size": 8, "ep_size": 2},
        {"tp_size": 1, "pp_size": 8},
    ],
)
def test_layouts_that_served_in_the_field_fit_at_the_fraction_the_planner_chooses(flags):
    # At SGLang 0.5.10's default (about 0.771 for K2.6) the pool is short; the planner names the fix.
    chosen = plan(K26, GPUS, MEM, flags, smi_memory_mib=SMI_MIB).suggested_mem_fraction_static
    assert chosen is not None
    result = plan(K26, GPUS, MEM, {**flags, "mem_fraction_static": chosen}, smi_memory_mib=SMI_MIB)
    assert result.verdict == "fits" and result.kv_tokens >= planner.TIGHT_MIN_KV_TOKENS


def test_seed_layout_tp4_ep2_is_oom_and_names_what_was_meant():
    catalog = {"tp4ep2": {"flags": {"tp_size": 8, "ep_size": 2}}, "tp8": {"flags": {"tp_size": 8}}}
    result = plan(K26, GPUS, MEM, {"tp_size": 4, "ep_size": 2}, catalog)
    assert result.verdict == "oom"
    assert result.gpus_used == 4
    assert result.weights_gib_per_gpu > MEM
    # half of 384 experts, each split 2 ways: a quarter of all routed-expert bytes per GPU
    assert result.weights_breakdown["routed_experts"] == 192 * MOE_LAYERS * (
        3 * EXPERT_MATRIX_PARAMS // 2 * INT4_G32 + 24
    )
    assert "uses only 4 of 8 GPUs" in result.reason
    assert "192 of the 384 experts" in result.reason
    assert "did you mean tp4ep2 (--tp-size 8 --ep-size 2)?" in result.reason.lower()
    assert result.suggested_profile == "tp4ep2"
    assert result.suggested_flags == {"tp_size": 8, "ep_size": 2}


def test_seed_oom_allocation_size_matches_the_field_log():
    # The field OOM tried to allocate 672 MiB: one projection of 192 experts with the 2048 rows split 2 ways.
    assert 192 * (2048 // 2) * 7168 * 0.5 / 2**20 == 672
    shape = planner.model_shape(K26)
    assert planner.Layout(tp=4, ep=2).moe_tp == 2
    assert shape.n_routed_experts // 2 == 192


def test_idle_gpus_without_catalog_still_suggest_flags():
    result = plan(K26, GPUS, MEM, {"tp_size": 4, "ep_size": 2})
    assert result.suggested_profile is None
    assert "Did you mean --tp-size 8 --ep-size 2?" in result.reason


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"tp_size": 8, "ep_size": 3}, "does not divide --tp-size 8"),
        ({"tp_size": 8, "dp_size": 3, "enable_dp_attention": True}, "does not divide --tp-size 8"),
        ({"tp_size": 8, "enable_dp_attention": True}, "needs --dp-size of 2 or more"),
        ({"tp_size": 16}, "starts 16 GPUs but the host has 8"),
        ({"tp_size": 8, "mem_fraction_static": 1.5}, "between 0 and 1"),
        ({"tp_size": 8, "kv_cache_dtype": "int3"}, "--kv-cache-dtype"),
        ({"tp_size": 8, "kv_cache_dtype": "fp8"}, "use one of auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1"),
        ({"tp_size": 8, "kv_cache_dtype": "float16"}, "is not one SGLang accepts"),
    ],
)
def test_invalid_layouts_say_why(flags, words):
    result = plan(K26, GPUS, MEM, flags)
    assert result.verdict == "invalid"
    assert words in result.reason


def test_kv_pool_oom_names_the_fraction_that_would_work():
    result = plan(K26, GPUS, MEM, {"tp_size": 8, "mem_fraction_static": 0.7})
    assert result.verdict == "oom"
    assert "Not enough memory" in result.reason
    needed = result.weights_bytes_per_gpu / ((MEM - planner.INIT_OVERHEAD_GIB) * GIB)
    assert f"above {needed:.3f}" in result.reason


def test_tight_when_context_length_exceeds_the_pool():
    result = plan(K26, GPUS, MEM, {"tp_size": 8, "mem_fraction_static": 0.8, "context_length": 262144})
    assert result.verdict == "tight"
    assert "262,144" in result.reason


def test_deepseek_v3_top_level_fp8_form():
    shape = planner.model_shape(DSV3)
    assert shape.quant.method == "fp8" and shape.quant.block == (128, 128)
    assert shape.vision is None
    result = plan(DSV3, GPUS, MEM, {"tp_size": 8, "ep_size": 8})
    # 32 experts x 58 MoE layers x 3 matrices, FP8 + one fp32 scale per 128x128 block
    per_matrix = EXPERT_MATRIX_PARAMS + (7168 // 128) * (2048 // 128) * 4
    assert result.weights_breakdown["routed_experts"] == 32 * 58 * 3 * per_matrix
    assert result.mem_fraction_static == 0.832  # no vision tower; the PyTorch figure in MiB stands in for nvidia-smi's


def test_bad_configs_raise_sentences():
    with pytest.raises(planner.PlanError, match="lacks"):
        planner.model_shape({"hidden_size": 1})
    with pytest.raises(planner.PlanError, match="JSON object"):
        planner.model_shape([1, 2])
    odd = copy.deepcopy(DSV3)
    odd["quantization_config"] = {"quant_method": "awq"}
    with pytest.raises(planner.PlanError, match="unknown to the planner"):
        planner.model_shape(odd)


# SGLang 0.5.23's own default --mem-fraction-static for each catalog profile on an RTX PRO 6000 (97,887 MiB), from its
# resolve_once() with the real wheel (the oracle's resolution path, torch CPU; run during issue 35's research). It
# keeps the breakable prefill CUDA graph for K2.6 (an allow-listed multimodal architecture) and with DP attention,
# which 0.5.10's piecewise graphs were not: 1.5 GiB more reserve there, none where pipeline stages turn it off.
RESOLVED_0_5_23 = {
    ("K2.6", "tp8"): 0.757810361328125, ("K2.6", "ep8"): 0.757810361328125, ("K2.6", "tp2ep4"): 0.757810361328125,
    ("K2.6", "tp4ep2"): 0.757810361328125, ("K2.6", "pp8"): 0.7769148242187499,
    ("K2.6", "tp2pp4"): 0.7769148242187499, ("K2.6", "tp4pp2"): 0.7714564062499999,
    ("K2.6", "ep8dpa"): 0.7514422070312499,
    ("DeepSeek-V3", "tp8"): 0.833, ("DeepSeek-V3", "ep8"): 0.833, ("DeepSeek-V3", "tp2ep4"): 0.833,
    ("DeepSeek-V3", "tp4ep2"): 0.833, ("DeepSeek-V3", "pp8"): 0.854, ("DeepSeek-V3", "tp2pp4"): 0.854,
    ("DeepSeek-V3", "tp4pp2"): 0.848, ("DeepSeek-V3", "ep8dpa"): 0.826,
}


@pytest.mark.parametrize(("model", "profile"), sorted(RESOLVED_0_5_23))
def test_the_default_fraction_of_0_5_23_is_its_own(model, profile):
    import yaml  # noqa: PLC0415

    flags = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())["profiles"][profile]["flags"]
    shape = planner.model_shape(K26 if model == "K2.6" else DSV3)
    layout = planner.Layout.from_flags({k: v for k, v in flags.items() if k != "mem_fraction_static"})
    got = planner.default_mem_fraction_static(SMI_MIB, layout, shape.vision, "0.5.23", shape.architecture)
    assert got == pytest.approx(RESOLVED_0_5_23[(model, profile)], abs=1e-9)
    on_0510 = planner.default_mem_fraction_static(SMI_MIB, layout, shape.vision, "0.5.10", shape.architecture)
    prefill_graph_now = planner.prefill_cuda_graphs(layout, shape.multimodal, "0.5.23", shape.architecture)
    prefill_graph_before = planner.prefill_cuda_graphs(layout, shape.multimodal, "0.5.10")
    assert (on_0510 > got) == (prefill_graph_now and not prefill_graph_before)


def test_a_release_the_planner_does_not_know_is_refused():
    with pytest.raises(planner.PlanError, match="no memory arithmetic of SGLang 0.6.0"):
        planner.prefill_cuda_graphs(planner.Layout(tp=8), False, "0.6.0")
