"""The simulator's memory physics, without processes: per-rank tensors, allocator, KV pool, CUDA graphs."""

from __future__ import annotations

import json

import pytest
from conftest import K26_CONFIG
from sglang._sim import args as A
from sglang._sim import gpu as G
from sglang._sim import model as M
from sglang._sim import plan as P
from sglang._sim import throughput as T

CFG = M.parse_config(json.loads(K26_CONFIG.read_text()))
SPEC = dict(G.DEFAULT_SPEC)


def plan(*flags, faults=(), env=None):
    args = A.parse_args(["--model-path", "m", *flags])
    return P.build_plan(args, CFG, SPEC, env or {}, list(faults), list(range(8)), set())


def fail_text(pl):
    for rp in pl.ranks:
        for _t, kind, payload in rp.events:
            if kind == "fail":
                return payload
    return None


@pytest.fixture(autouse=True)
def no_other_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_GPU_STATE_DIR", str(tmp_path / "procs"))


def test_config_both_forms_read_the_same_text_model():
    flat = dict(json.loads(K26_CONFIG.read_text())["text_config"])
    flat["quantization_config"] = json.loads(K26_CONFIG.read_text())["quantization_config"]
    top = M.parse_config(flat)
    assert (top.hidden_size, top.n_routed_experts, top.num_hidden_layers) == (7168, 384, 61)
    assert top.quant_method == "compressed-tensors" and top.quant_bits == 4 and top.quant_group_size == 32
    assert not top.is_multimodal and CFG.is_multimodal
    assert CFG.is_quantized("language_model.model.layers.3.mlp.experts.0.gate_proj")
    assert not CFG.is_quantized("language_model.model.layers.3.self_attn.o_proj")
    assert not CFG.is_quantized("language_model.model.layers.3.mlp.shared_experts.down_proj")


def test_tp4_ep2_runs_out_of_memory_while_loading_with_pytorchs_message():
    pl = plan("--tp-size", "4", "--ep-size", "2")
    assert pl.fails and len(pl.ranks) == 4  # --tp-size 4 makes a 4-GPU world
    kind, (message, tensor) = fail_text(pl)
    assert kind == "oom_weights" and tensor.endswith("w2_weight_packed")
    assert message.startswith("CUDA out of memory. Tried to allocate 672.00 MiB. GPU 0 has a total capacity of "
                              "94.97 GiB of which ")
    assert "Including non-PyTorch memory, this process has" in message
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in message


@pytest.mark.parametrize("flags,ranks", [
    (("--tp-size", "8", "--mem-fraction-static", "0.8"), 8),
    (("--tp-size", "8", "--ep-size", "8", "--mem-fraction-static", "0.79"), 8),
    (("--tp-size", "8", "--ep-size", "4", "--mem-fraction-static", "0.79"), 8),
    (("--pp-size", "8", "--mem-fraction-static", "0.82"), 8),
])
def test_layouts_that_fit(flags, ranks):
    pl = plan(*flags)
    assert not pl.fails and len(pl.ranks) == ranks
    assert pl.max_total_num_tokens > 10_000
    for rp in pl.ranks:
        assert 55 * G.GiB < rp.weights_bytes < 80 * G.GiB
        assert rp.kv_bytes > 0 and rp.graph_bytes > 0


def test_expert_split_follows_sglang_semantics():
    ep4 = M.enumerate_ranks(8, 1, 4, 1, False)
    assert [(r.moe_ep_rank, r.moe_tp_rank) for r in ep4[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    t = {x.name.rsplit(".", 1)[-1]: x for x in M.rank_tensors(CFG, ep4[0], {}) if ".layers.5.mlp.experts" in x.name}
    assert t["w13_weight_packed"].shape == (96, 7168 // 8, 2 * 1024)  # 384/4 experts, each split 2-way
    ep8 = M.enumerate_ranks(8, 1, 8, 1, False)[0]
    t8 = {x.name.rsplit(".", 1)[-1]: x for x in M.rank_tensors(CFG, ep8, {}) if ".layers.5.mlp.experts" in x.name}
    assert t8["w2_weight_packed"].shape == (48, 2048 // 8, 7168)  # 48 whole experts


def test_pipeline_split_puts_remainder_on_last_stages_and_env_overrides():
    assert M.pp_partition(61, 8, {}) == [7, 7, 7, 8, 8, 8, 8, 8]
    assert M.pp_partition(61, 2, {"SGLANG_PP_LAYER_PARTITION": "30,31"}) == [30, 31]
    with pytest.raises(AssertionError):
        M.pp_partition(61, 2, {"SGLANG_PP_LAYER_PARTITION": "30,30"})
    names = [x.name for x in M.rank_tensors(CFG, M.enumerate_ranks(1, 8, 1, 1, False)[7], {})]
    assert any(n.endswith("lm_head.weight") for n in names)
    assert not any("embed_tokens" in n for n in names)


def test_vision_tower_is_built_on_every_pipeline_rank_with_its_attention_split_over_tp():
    # KimiK25ForConditionalGeneration builds vision_tower and mm_projector on every rank (models/kimi_k25.py).
    def tower(rank):
        return {x.name: x for x in M.rank_tensors(CFG, rank, {}) if x.name.startswith(("vision_tower", "mm_projector"))}
    pp8 = M.enumerate_ranks(1, 8, 1, 1, False)
    assert {n: x.shape for n, x in tower(pp8[7]).items()} == {n: x.shape for n, x in tower(pp8[0]).items()}
    tp8 = tower(M.enumerate_ranks(8, 1, 1, 1, False)[0])
    assert tp8["vision_tower.encoder.blocks.0.wqkv.weight"].shape == (3 * 1152 // 8, 1152)
    assert tp8["vision_tower.encoder.blocks.0.wo.weight"].shape == (1152, 1152 // 8)
    assert tp8["vision_tower.encoder.blocks.0.wo.bias"].shape == (1152,)  # RowParallelLinear keeps it whole
    assert tp8["vision_tower.encoder.blocks.0.mlp.fc0.weight"].shape == (4304, 1152)  # nn.Linear: whole
    assert len([n for n in tp8 if n.endswith("wqkv.weight")]) == 27


def test_kimi_vision_config_object_keeps_its_defaults_where_the_json_says_vt_star():
    assert (CFG.vision["num_hidden_layers"], CFG.vision["hidden_size"]) == (27, 1152)
    raw = json.loads(K26_CONFIG.read_text())
    raw["vision_config"].update({"vt_num_hidden_layers": 12, "vt_hidden_size": 768})  # ignored by the tower
    assert (M.parse_config(raw).vision["num_hidden_layers"], M.parse_config(raw).vision["hidden_size"]) == (27, 1152)
    raw["vision_config"].update({"num_hidden_layers": 24, "hidden_size": 1024})  # SGLang's own names win
    args = A.parse_args(["--model-path", "m", "--tp-size", "8"])
    P.default_mem_settings(args, M.parse_config(raw), 97887)
    assert args.mem_fraction_static == pytest.approx(0.848 * 0.95)


def test_fp4_kv_cache_packs_two_values_a_byte_plus_scales():
    assert M.kv_cell_bytes(CFG, 61, "fp4_e2m1") == 576 * 61 // 2 + 576 // 16 * 61
    assert M.kv_cell_bytes(CFG, 61, "fp8_e5m2") == 576 * 61
    assert M.kv_cell_bytes(CFG, 61, "bf16") == M.kv_cell_bytes(CFG, 61, "auto") == 576 * 61 * 2


def test_default_mem_fraction_follows_server_args_formula():
    args = A.parse_args(["--model-path", "m", "--tp-size", "8"])
    P.default_mem_settings(args, CFG, 97887)
    assert args.chunked_prefill_size == 8192 and args.cuda_graph_max_bs == 512
    # adjust_mem_fraction_for_vlm on KimiK25VisionConfig's 27 x 1152 tower: 0.95 x (1 - 0.1 x (1.3500 - 1))
    assert args.mem_fraction_static == pytest.approx(0.848 * 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1)))
    assert round(args.mem_fraction_static, 3) == 0.771


def test_text_only_default_reserves_for_piecewise_cuda_graphs():
    raw = json.loads(K26_CONFIG.read_text())
    cfg = M.parse_config(dict(raw["text_config"], quantization_config=raw["quantization_config"]))
    args = A.parse_args(["--model-path", "m", "--tp-size", "8"])
    P.default_mem_settings(args, cfg, 97887)
    assert args.mem_fraction_static == round((97887 - 14848 - 1536) / 97887, 3) == 0.833
    pp = A.parse_args(["--model-path", "m", "--tp-size", "4", "--pp-size", "2"])  # pp > 1: no piecewise graphs
    P.default_mem_settings(pp, cfg, 97887)
    assert pp.mem_fraction_static == round((97887 - 14848) / 97887, 3)


def test_tp8_at_sglangs_default_fraction_runs_out_sizing_the_kv_pool():
    kind, _ = fail_text(plan("--tp-size", "8"))  # 0.771 x free < 73.3 GiB of weights
    assert kind == "kv"


def test_kv_pool_failure_when_fraction_too_low():
    kind, _ = fail_text(plan("--tp-size", "8", "--mem-fraction-static", "0.7"))
    assert kind == "kv"


def test_cuda_graph_failure_when_fraction_too_high():
    pl = plan("--tp-size", "8", "--mem-fraction-static", "0.99")
    kind, (message, _) = fail_text(pl)
    assert kind in ("graph", "oom_kv_alloc")
    assert "CUDA out of memory" in message


def test_allocator_rounding_and_message_lists_other_processes():
    a = G.CachingAllocator(device=2, total=10 * G.GiB, pid=1, others=[(4242, 3 * G.GiB)])
    a.malloc(100)  # small pool: a 2 MiB segment
    a.malloc(3 * G.MiB)  # 1-10 MiB: a 20 MiB segment
    assert a.reserved == 22 * G.MiB
    with pytest.raises(G.OutOfMemory) as exc:
        a.malloc(8 * G.GiB)
    msg = str(exc.value)
    assert "Tried to allocate 8.00 GiB. GPU 2 has a total capacity of 10.00 GiB" in msg
    assert "Process 4242 has 3.00 GiB memory in use." in msg


def test_throughput_model_is_calibrated():
    for (tp, pp, ep), (s1, agg) in {(8, 1, 1): (26, 808), (1, 8, 1): (37, 396), (8, 1, 8): (65, 960),
                                     (8, 1, 4): (48, 1531)}.items():
        r1, ra = T.layout_rates(tp, pp, ep)
        assert T.per_request(1, r1, ra) == pytest.approx(s1)
        assert T.aggregate(512, r1, ra) == pytest.approx(agg, rel=0.02)


def test_top_level_deepseek_v3_config_plans_too():
    raw = json.loads(K26_CONFIG.read_text())
    flat = dict(raw["text_config"], quantization_config=raw["quantization_config"])
    cfg = M.parse_config(flat)
    args = A.parse_args(["--model-path", "m", "--tp-size", "8", "--ep-size", "8"])
    pl = P.build_plan(args, cfg, SPEC, {}, [], list(range(8)), set())
    assert not pl.fails and pl.max_total_num_tokens > 0
    assert not any("vision_tower" in t.name for t in M.rank_tensors(cfg, pl.ranks[0].rank, {}))
