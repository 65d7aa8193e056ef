"""What each scheduler rank does during start-up, in simulated seconds, decided up front.

The main process computes this plan from the flags, the model config, the GPU spec and the memory other
live processes hold; each rank process then plays its part (log lines, memory it holds, its failure).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import gpu as G
from .model import ModelConfig, Rank, enumerate_ranks, kv_cell_bytes, pp_partition, rank_tensors

GB = G.GiB  # SGLang's get_available_gpu_memory divides by 1 << 30 and prints "GB"

# simulated durations (seconds of simulated time)
T_PROC_START = 2.0
T_DIST_INIT = 3.0
T_CONSTRUCT_PER_GIB = 0.1
DISK_BYTES_PER_S = 1.0 * GB  # page-cache-cold read of the checkpoint, shared by all ranks
T_KV = 2.0
T_GRAPH_PER_BS = 0.4
T_WARMUP = 5.0


@dataclass
class RankPlan:
    rank: Rank
    events: list = field(default_factory=list)  # (t, kind, payload)
    weights_bytes: int = 0
    weights_gib_reported: float = 0.0
    kv_bytes: int = 0
    graph_bytes: int = 0
    failed: bool = False


@dataclass
class Plan:
    ranks: list[RankPlan]
    mem_fraction_static: float
    max_total_num_tokens: int = 0
    max_running_requests: int = 0
    cuda_graph_max_bs: int = 0
    chunked_prefill_size: int = 0
    context_len: int = 0
    ready_at: float | None = None  # sim time the schedulers are ready; None: start-up fails or hangs
    fails: bool = False
    hangs: bool = False
    main_events: list = field(default_factory=list)


def default_mem_settings(args, cfg: ModelConfig, gpu_mem_mib: int) -> None:
    """The memory defaults of the release the simulator is (gpu_mem_mib: nvidia-smi's memory.total), filling
    chunked_prefill_size, the CUDA graph batch sizes and mem_fraction_static when absent. Runs once per args
    (ServerArgs.__post_init__ does, before the server logs server_args=)."""
    if getattr(args, "_memory_defaults_filled", False):
        return
    args._memory_defaults_filled = True
    if args.release == "0.5.10":
        _mem_settings_0_5_10(args, cfg, gpu_mem_mib)
    else:
        _mem_settings_0_5_23(args, cfg, gpu_mem_mib)


def _mem_settings_0_5_10(args, cfg: ModelConfig, gpu_mem_mib: int) -> None:
    """server_args._handle_gpu_memory_settings of 0.5.10 and the VLM adjustment."""
    if gpu_mem_mib < 35 * 1024:
        cps, gbs = 2048, (24 if args.tp_size < 4 else 80)
    elif gpu_mem_mib < 60 * 1024:
        cps, gbs = 4096, (32 if args.tp_size < 4 else 160)
    elif gpu_mem_mib < 160 * 1024:
        cps, gbs = 8192, (256 if args.tp_size < 4 else 512)
    else:
        cps, gbs = 16384, 512
    if args.chunked_prefill_size is None:
        args.chunked_prefill_size = cps
    if args.cuda_graph_max_bs is None:
        args.cuda_graph_max_bs = max(args.cuda_graph_bs) if args.cuda_graph_bs else gbs
    if args.mem_fraction_static is None:
        reserved = 512.0
        if args.chunked_prefill_size > 0:
            reserved += max(args.chunked_prefill_size, 2048) * 1.5
        else:
            reserved += max(args.max_prefill_tokens, 2048) * 1.5
        reserved += args.cuda_graph_max_bs * 2
        reserved += args.tp_size * args.pp_size / 8 * 1024
        if args.enable_dp_attention:
            reserved += args.cuda_graph_max_bs * args.dp_size * 3
            if args.cuda_graph_max_bs > 300:
                reserved += args.cuda_graph_max_bs * args.dp_size * 1.5
        # _handle_piecewise_cuda_graph leaves piecewise graphs on unless pp > 1, DP attention, a multimodal
        # model (or flags this simulator does not take); an MLA model then reserves 1.5 GiB for them.
        piecewise = args.pp_size == 1 and not args.enable_dp_attention and not cfg.is_multimodal
        if args.enforce_piecewise_cuda_graph or (piecewise and not args.disable_piecewise_cuda_graph):
            reserved += 1.5 * 1024
        if gpu_mem_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        mfs = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
        if cfg.is_multimodal:
            mfs = mfs * vlm_factor(cfg)
        args.mem_fraction_static = mfs
    if args.enable_dp_attention and args.dp_size > 1:
        args.chunked_prefill_size = args.chunked_prefill_size // args.dp_size


def vlm_factor(cfg: ModelConfig) -> float:
    """adjust_mem_fraction_for_vlm (the same in both releases), on the vision config object SGLang built."""
    v = cfg.vision or {}
    layers = v.get("num_hidden_layers", 24)  # getattr(vision_config, ..., ViT-L/14 default)
    hidden = v.get("hidden_size", 1024)
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


# 0.5.23: multimodal architectures that keep the breakable prefill CUDA graph (configs/model_config.py
# multimodal_breakable_cuda_graph_supported_model_archs; the Kimi ones, the models the simulator loads)
PREFILL_GRAPH_MULTIMODAL_ARCHS = ("KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration")
# 0.5.23 cuda_graph_hook: the breakable prefill graph is validated with these MoE all-to-all backends only
PREFILL_GRAPH_A2A = ("none", "deepep", "megamoe", "flashinfer")


def decode_bs_list(max_bs: int, no_padding: bool = False) -> list[int]:
    """0.5.23 generate_decode_cuda_graph_batch_sizes (no speculative decoding): 0.5.10's list, plus max_bs."""
    bs = list(range(1, max_bs + 1)) if no_padding else capture_bs_list(max_bs)
    return bs if max_bs in bs else bs + [max_bs]


def prefill_bs_list(max_bs: int) -> list[int]:
    """0.5.23 generate_prefill_cuda_graph_batch_sizes: the captured token counts."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [n for n in sizes if n <= max_bs]


# 0.5.23 memory_hook: (GPU memory below GiB, chunked_prefill_size, decode max_bs if tp < 4, else); larger GPUs
# take 16384 and 512
MEMORY_BUCKETS_0_5_23 = ((20, 2048, 8, 8), (35, 4096, 48, 160), (60, 4096, 32, 160), (160, 8192, 256, 512))


def _mem_settings_0_5_23(args, cfg: ModelConfig, gpu_mem_mib: int) -> None:
    """0.5.23's resolution of the same settings (arg_groups/cuda_graph_hook.py handle_cuda_graph_config,
    memory_hook.py handle_gpu_memory_settings, parallel_hook.py _handle_data_parallelism), for the flags the
    simulator takes and its MLA models: the decode graph's max_bs (capped by --max-running-requests when left to the
    default) and the breakable prefill graph, on by default, whose MLA reserve is 1.5 GiB; args.graphs holds both
    phases as /server_info's cuda_graph_config reports them."""
    # handle_cuda_graph_config: backends from the flags (an explicit one is kept), then the compatibility rules
    decode = "full"
    prefill, prefill_locked = "breakable", False
    if args.disable_cuda_graph:
        decode, prefill, prefill_locked = "disabled", "disabled", True
    if args.disable_prefill_cuda_graph:
        prefill, prefill_locked = "disabled", True
    if args.disable_decode_cuda_graph:
        decode = "disabled"
    if args.cuda_graph_backend_decode:
        decode = args.cuda_graph_backend_decode
    if args.cuda_graph_backend_prefill:
        prefill, prefill_locked = args.cuda_graph_backend_prefill, True
    notes = args._resolution_notes = []  # what the resolution logs (server.py prints them before server_args=)
    if not prefill_locked:
        if args.pp_size > 1 and prefill == "breakable":
            prefill = "disabled"  # opt-in with pipeline stages
            notes.append("Disabling breakable prefill CUDA graph by default for pipeline parallelism. "
                         "Set --cuda-graph-backend-prefill=breakable to opt in.")
        elif prefill == "breakable":
            rules = (("two-batch overlap", args.enable_two_batch_overlap),
                     ("unvalidated a2a backend", args.moe_a2a_backend not in PREFILL_GRAPH_A2A),
                     ("multimodal model",
                      cfg.is_multimodal and cfg.architecture not in PREFILL_GRAPH_MULTIMODAL_ARCHS))
            reason = next((name for name, applies in rules if applies), None)
            if reason:
                prefill = "disabled"
                notes.append(f"Breakable CUDA graph is incompatible with {reason}; disabling prefill CUDA graph.")
        attention = args.prefill_attention_backend or args.attention_backend
        if prefill != "disabled" and cfg.architecture == "DeepseekV3ForCausalLM" and attention == "trtllm_mla":
            prefill = "disabled"
    # handle_gpu_memory_settings: sizes by the GPU's memory (chunked prefill, decode max_bs below TP4 and from it)
    cps, small_tp, large_tp = next((tuple(b[1:]) for b in MEMORY_BUCKETS_0_5_23
                                    if gpu_mem_mib < b[0] * 1024), (16384, 512, 512))
    if args.chunked_prefill_size is None:
        args.chunked_prefill_size = cps
    max_bs = args.cuda_graph_max_bs_decode
    if max_bs is None:
        max_bs = small_tp if args.tp_size < 4 else large_tp
        if args.max_running_requests is not None and max_bs > args.max_running_requests:
            max_bs = args.max_running_requests
    if args.cuda_graph_bs_decode is None:
        bs = decode_bs_list(max_bs, args.disable_cuda_graph_padding)
    else:
        bs, max_bs = list(args.cuda_graph_bs_decode), max(args.cuda_graph_bs_decode)
    prefill_max_bs = args.cuda_graph_max_bs_prefill
    if prefill_max_bs is None:
        prefill_max_bs = min(8192, args.chunked_prefill_size)  # MLA: capture at most 8192 tokens
        if args.max_total_tokens is not None:
            prefill_max_bs = min(prefill_max_bs, args.max_total_tokens)
    prefill_bs = list(args.cuda_graph_bs_prefill) if args.cuda_graph_bs_prefill else prefill_bs_list(prefill_max_bs)
    if args.mem_fraction_static is None:
        tokens = args.chunked_prefill_size if args.chunked_prefill_size > 0 else args.max_prefill_tokens
        reserved = 512 + max(tokens, 2048) * 1.5 + args.tp_size * args.pp_size / 8 * 1024
        if decode != "disabled":  # reserve_for_graph_mb
            reserved += max_bs * 2
        if args.enable_dp_attention:  # attention DP (the simulator's layout: dp_size groups)
            reserved += max_bs * args.dp_size * 3
            if max_bs > 300:
                reserved += max_bs * args.dp_size * 1.5
        if prefill != "disabled":
            reserved += 1.5 * 1024  # MLA
            if prefill == "breakable" and args.moe_a2a_backend == "deepep":
                reserved += 1024
        if gpu_mem_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        if decode != "disabled" and args.moe_a2a_backend == "deepep":  # reserve_for_deepep_a2a_mb
            reserved += 2 * 1024
        mfs = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
        args.mem_fraction_static = mfs * vlm_factor(cfg) if cfg.is_multimodal else mfs
    if args.enable_dp_attention and args.dp_size > 1:  # _handle_data_parallelism, after the memory settings
        args._chunked_prefill_before_dp = args.chunked_prefill_size
        args.chunked_prefill_size = args.chunked_prefill_size // args.dp_size
        if prefill != "disabled" and prefill_max_bs > args.chunked_prefill_size \
                and args.cuda_graph_max_bs_prefill is None:
            prefill_max_bs = args.chunked_prefill_size
            if args.cuda_graph_bs_prefill is None:
                prefill_bs = prefill_bs_list(prefill_max_bs)
    args.cuda_graph_max_bs, args.cuda_graph_bs = max_bs, bs
    args.graphs = {"decode": {"backend": decode, "max_bs": max_bs, "bs": bs},
                   "prefill": {"backend": prefill, "max_bs": prefill_max_bs, "bs": prefill_bs}}


def capture_bs_list(max_bs: int) -> list[int]:
    bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    return [b for b in bs if b <= max_bs]


def graph_pool_bytes(cfg: ModelConfig, rank: Rank, max_bs: int, n_graphs: int) -> tuple[int, list[int]]:
    """Private-pool memory of decode CUDA graphs (documented model, README.md): per-graph state plus
    the activations of the largest batch, captured largest first."""
    H = cfg.hidden_size
    vocab_local = -(-cfg.vocab_size // rank.tp_size)
    i_moe = cfg.moe_intermediate_size // rank.moe_tp_size
    per_token = 12 * H * 2 + vocab_local * 4 * 2 + cfg.num_experts_per_tok * 2 * i_moe * 2 * 2
    chunks = [256 * G.MiB]  # cuBLAS workspace, NCCL graph-registered buffers, attention metadata
    chunks += [max_bs * per_token]
    chunks += [12 * G.MiB] * n_graphs
    return sum(chunks), chunks


def build_plan(args, cfg: ModelConfig, spec: dict, env: dict, faults: list[dict], visible: list[int],
               exclude_pids: set[int]) -> Plan:
    gpu_mem_mib = int(spec["memory_total_mib"])
    default_mem_settings(args, cfg, gpu_mem_mib)
    total = G.torch_total_bytes(spec)
    ranks = enumerate_ranks(args.tp_size, args.pp_size, args.ep_size, args.dp_size, args.enable_dp_attention,
                            args.base_gpu_id, args.gpu_id_step)
    plan = Plan([RankPlan(r) for r in ranks], args.mem_fraction_static)
    plan.chunked_prefill_size = args.chunked_prefill_size
    plan.context_len = args.context_length or cfg.max_position_embeddings
    fault_names = {f["fault"] for f in faults}
    fault_gpus = {}
    for f in faults:
        fault_gpus[f["fault"]] = set(f["gpus"]) if isinstance(f.get("gpus"), list) else None

    def hit(name: str, rank: Rank) -> bool:
        if name not in fault_names:
            return False
        gpus = fault_gpus.get(name)
        return gpus is None or rank.gpu_id in gpus

    # Rank processes that have no GPU fail in set_device.
    missing = [rp for rp in plan.ranks if rp.rank.gpu_id >= len(visible)]
    t0 = T_PROC_START
    new = args.release != "0.5.10"
    for rp in plan.ranks:  # 0.5.23: distributed/bootstrap.py init_parallel_runtime
        rp.events.append((t0, "log", "Init parallel begin." if new else "Init torch distributed begin."))
    if missing:
        for rp in missing:
            rp.failed = True
            rp.events.append((t0 + 0.5, "fail", ("invalid_ordinal", None)))
        plan.fails = True
        return plan
    if "crash" in fault_names:
        for rp in plan.ranks:
            if hit("crash", rp.rank):
                rp.failed = True
                rp.events.append((t0 + T_DIST_INIT, "fail", ("nccl", None)))
        plan.fails = any(rp.failed for rp in plan.ranks)
        if plan.fails:
            return plan
    if "hang" in fault_names:
        plan.hangs = True
        for rp in plan.ranks:
            rp.events.append((t0 + 0.2, "mem", {rp.rank.gpu_id: G.CUDA_CONTEXT_BYTES}))
            rp.events.append((t0 + 0.5, "hang", None))
        return plan

    # --- init distributed: CUDA context and NCCL communicators
    allocs: dict[int, G.CachingAllocator] = {}
    t1 = t0 + T_DIST_INIT
    n_comms = sum(1 for s in (args.tp_size, args.pp_size, args.ep_size if args.ep_size < args.tp_size else 1)
                  if s > 1)
    world = len(plan.ranks)
    for rp in plan.ranks:
        r = rp.rank
        phys = visible[r.gpu_id]
        a = G.CachingAllocator(device=r.gpu_id, total=total, pid=0,
                               others=G.others_on_gpu(phys, exclude_pids))
        a.non_pytorch = G.CUDA_CONTEXT_BYTES
        before = a.device_free()
        a.non_pytorch += G.NCCL_COMM_BYTES * n_comms if world > 1 else 0
        allocs[r.gpu_id] = a
        rp.events.append((t0 + 0.2, "mem", {r.gpu_id: a.process_bytes - G.NCCL_COMM_BYTES * n_comms}))
        if args.tp_size > 2 and spec.get("pcie_only", True) and not args.disable_custom_all_reduce:
            # 0.5.23 tries its JIT all-reduce (CustomAllReduceV2) first, then the legacy one, and each says no
            for who in ("CustomAllReduceV2", "CustomAllreduce") if new else ("Custom allreduce",):
                rp.events.append((t1 - 0.5, "warn",
                                  f"{who} is disabled because it's not supported on more than two "
                                  "PCIe-only GPUs. To silence this warning, specify disable_custom_all_reduce=True "
                                  "explicitly."))
        rp.events.append((t1, "mem", {r.gpu_id: a.process_bytes}))
        rp.events.append((t1, "log", f"Init parallel ends. elapsed={T_DIST_INIT:.2f} s" if new else
                          f"Init torch distributed ends. elapsed={T_DIST_INIT:.2f} s, "
                          f"mem usage={(before - a.device_free()) / GB:.2f} GB"))
    if "stale_gpu_process" in fault_names:
        pass  # the stale holder was spawned before planning; its memory is already in `others`
    if "oom_weight_load" in fault_names:
        for rp in plan.ranks:
            if hit("oom_weight_load", rp.rank):
                a = allocs[rp.rank.gpu_id]
                w = sum(t.nbytes for t in rank_tensors(cfg, rp.rank, env, args.enable_dp_lm_head))
                a.hidden = max(0, a.device_free() - int(w * 0.7))
    pre_model_load = min(a.device_free() for a in allocs.values())  # all_reduce MIN over the world

    # --- weights
    t2 = t1 + 0.3
    load_secs = cfg_checkpoint_bytes(cfg) / DISK_BYTES_PER_S
    failed_at = None
    for rp in plan.ranks:
        r = rp.rank
        a = allocs[r.gpu_id]
        rp.events.append((t2, "log", f"Load weight begin. avail mem={a.device_free() / GB:.2f} GB"))
        before = a.device_free()
        tensors = rank_tensors(cfg, r, env, args.enable_dp_lm_head)
        load_t = [x for x in tensors if x.phase == "load"]
        post_t = [x for x in tensors if x.phase == "post_load"]
        done = 0
        try:
            for x in load_t:
                a.malloc(x.nbytes)
                done += x.nbytes
            rp.weights_bytes = done
            construct = T_CONSTRUCT_PER_GIB * done / GB
            rp.events.append((t2 + construct, "mem", {r.gpu_id: a.process_bytes}))
            for x in post_t:
                a.malloc(x.nbytes)
                done += x.nbytes
            rp.weights_bytes = done
        except G.OutOfMemory as exc:
            construct = T_CONSTRUCT_PER_GIB * done / GB
            rp.failed = True
            rp.events.append((t2 + construct, "mem", {r.gpu_id: a.process_bytes}))
            rp.events.append((t2 + construct + 0.1 + 0.5 * plan.ranks.index(rp), "fail",
                              ("oom_weights", (str(exc), x.name))))
            failed_at = t2 + construct
            continue
        t_end = t2 + T_CONSTRUCT_PER_GIB * rp.weights_bytes / GB + load_secs
        rp.weights_gib_reported = (before - a.device_free()) / GB
        if r.tp_rank == 0 and r.pp_rank == 0 and r.dp_rank == 0:
            rp.events.append((t2 + 0.2, "log", "Using model weights format ['*.safetensors']"))
            n = cfg_num_shards(cfg)
            for k in range(0, n + 1, max(1, n // 8)):
                frac = k / n
                rp.events.append((t2 + T_CONSTRUCT_PER_GIB * rp.weights_bytes / GB + load_secs * frac, "raw",
                                  _tqdm("Loading safetensors checkpoint shards", k, n, load_secs * frac,
                                        load_secs * (1 - frac))))
        rp.events.append((t_end, "mem", {r.gpu_id: a.process_bytes}))
        rp.events.append((t_end, "log", f"Load weight end. elapsed={t_end - t2:.2f} s, "
                                        f"type={cfg.architecture}, dtype=torch.bfloat16, "
                                        f"avail mem={a.device_free() / GB:.2f} GB, "
                                        f"mem usage={rp.weights_gib_reported:.2f} GB."))
    if failed_at is not None:
        plan.fails = True
        return plan
    t3 = t2 + T_CONSTRUCT_PER_GIB * max(rp.weights_bytes for rp in plan.ranks) / GB + load_secs + 0.5

    # --- KV cache pool (model_runner.init_memory_pool / profile_max_num_token)
    if "oom_kv_cache" in fault_names:
        for rp in plan.ranks:
            if hit("oom_kv_cache", rp.rank):
                a = allocs[rp.rank.gpu_id]
                rest = a.device_free() - pre_model_load * (1 - args.mem_fraction_static)
                a.hidden += max(0, int(rest) + 512 * G.MiB)
    post_load = min(a.device_free() for a in allocs.values())
    rest_gb = post_load / GB - pre_model_load / GB * (1 - args.mem_fraction_static)
    parts = pp_partition(cfg.num_hidden_layers, args.pp_size, env)
    kv_dtype = args.kv_cache_dtype if args.kv_cache_dtype != "auto" else "bfloat16"
    tokens = min(int(rest_gb * GB // kv_cell_bytes(cfg, n, kv_dtype)) for n in parts)
    if args.max_total_tokens is not None:
        tokens = min(tokens, args.max_total_tokens)
    tokens = tokens // args.page_size * args.page_size
    if tokens <= 0:
        for rp in plan.ranks:
            rp.failed = True
            rp.events.append((t3, "fail", ("kv", None)))
        plan.fails = True
        return plan
    plan.max_total_num_tokens = tokens
    ctx = plan.context_len
    max_reqs = args.max_running_requests or min(max(int(tokens / ctx * 512), 2048), 4096)
    plan.max_running_requests = max_reqs
    for rp in plan.ranks:
        r = rp.rank
        a = allocs[r.gpu_id]
        n_layers = parts[r.pp_rank]
        try:
            a.malloc((max_reqs + 1) * (ctx + 4) * 4)  # req_to_token_pool (int32)
            per_layer = (tokens + args.page_size) * kv_cell_bytes(cfg, 1, kv_dtype)
            for _ in range(n_layers):
                a.malloc(per_layer)
        except G.OutOfMemory as exc:
            rp.failed = True
            rp.events.append((t3, "fail", ("oom_kv_alloc", (str(exc), "kv_buffer"))))
            continue
        rp.kv_bytes = per_layer * n_layers
        rp.events.append((t3, "mem", {r.gpu_id: a.process_bytes}))
        dtype = f"dtype: {TORCH_DTYPES.get(kv_dtype, 'torch.bfloat16')}, " if new else ""  # 0.5.23 names it
        rp.events.append((t3, "log", f"KV Cache is allocated. {dtype}#tokens: {tokens}, "
                                     f"KV size: {rp.kv_bytes / GB:.2f} GB"))
        rp.events.append((t3 + 0.1, "log", f"Memory pool end. avail mem={a.device_free() / GB:.2f} GB"))
    if any(rp.failed for rp in plan.ranks):
        plan.fails = True
        return plan
    t4 = t3 + T_KV

    # --- CUDA graphs: 0.5.23 captures the prefill graph first (cuda_graph_setup.capture_cuda_graphs)
    if new:
        t4, failed = _capture_prefill_graph(args, plan, allocs, t4)
        if failed:
            plan.fails = True
            return plan
    gbs = min(args.cuda_graph_max_bs, max_reqs)
    plan.cuda_graph_max_bs = gbs
    t_ready = t4
    if (args.graphs["decode"]["backend"] != "disabled") if new else not args.disable_cuda_graph:
        bs_list = args.cuda_graph_bs or capture_bs_list(gbs)
        bs_list = [b for b in bs_list if b <= gbs]
        cap = T_GRAPH_PER_BS * len(bs_list)
        if "oom_cuda_graph" in fault_names:
            for rp in plan.ranks:
                if hit("oom_cuda_graph", rp.rank):
                    a = allocs[rp.rank.gpu_id]
                    need, _ = graph_pool_bytes(cfg, rp.rank, max(bs_list), len(bs_list))
                    a.hidden += max(0, a.device_free() - need // 2)
        for rp in plan.ranks:
            r = rp.rank
            a = allocs[r.gpu_id]
            before = a.device_free()
            rp.events.append((t4, "log", f"Capture target decode CUDA graph begin. backend="
                                         f"{args.graphs['decode']['backend']}, num_tokens_per_req=1, "
                                         f"avail mem={before / GB:.2f} GB" if new else
                              f"Capture cuda graph begin. This can take up to several minutes. "
                              f"avail mem={before / GB:.2f} GB"))
            _, chunks = graph_pool_bytes(cfg, r, max(bs_list), len(bs_list))
            try:
                for c in chunks:
                    a.malloc(c, private=True)
            except G.OutOfMemory as exc:
                rp.failed = True
                rp.events.append((t4 + cap / 2, "mem", {r.gpu_id: a.process_bytes}))
                rp.events.append((t4 + cap / 2, "fail", ("graph", (str(exc), None))))
                continue
            used = before - a.device_free()
            rp.graph_bytes += used
            rp.events.append((t4 + cap, "mem", {r.gpu_id: a.process_bytes}))
            rp.events.append((t4 + cap, "log", f"Capture target decode CUDA graph end. bs={bs_list}, "
                                               f"elapsed={cap:.2f} s, mem usage={used / GB:.2f} GB, "
                                               f"avail mem={a.device_free() / GB:.2f} GB." if new else
                              f"Capture cuda graph end. Time elapsed: {cap:.2f} s. "
                              f"mem usage={used / GB:.2f} GB. avail mem={a.device_free() / GB:.2f} GB."))
        if any(rp.failed for rp in plan.ranks):
            plan.fails = True
            return plan
        t_ready = t4 + cap
    for rp in plan.ranks:
        r = rp.rank
        if r.tp_rank == 0 and r.dp_rank == 0:
            a = allocs[r.gpu_id]
            rp.events.append((t_ready + 0.2, "log",
                              f"max_total_num_tokens={tokens}, chunked_prefill_size={args.chunked_prefill_size}, "
                              f"max_prefill_tokens={args.max_prefill_tokens}, max_running_requests={max_reqs}, "
                              f"context_len={ctx}, available_gpu_mem={a.device_free() / GB:.2f} GB"))
        rp.events.append((t_ready + 0.3, "ready", None))
    plan.ready_at = t_ready + 0.5
    return plan


# The KV pool's dtype as 0.5.23's "KV Cache is allocated" line prints it (--kv-cache-dtype auto: the model's bfloat16)
TORCH_DTYPES = {"bfloat16": "torch.bfloat16", "bf16": "torch.bfloat16", "fp8_e4m3": "torch.float8_e4m3fn",
                "fp8_e5m2": "torch.float8_e5m2"}
# 0.5.23's breakable prefill graphs share the eager runner's activation buffer ("torch memory is reused by cuda
# graph capture", memory_hook.reserve_for_graph_mb); what each captured size keeps besides is modelled as the 8 MiB
# that hook reserves per size for non-MLA models (a documented model, not measured).
PREFILL_GRAPH_BYTES_PER_SIZE = 8 * G.MiB
T_PREFILL_GRAPH_PER_SIZE = 0.2


def _capture_prefill_graph(args, plan: Plan, allocs: dict, t: float) -> tuple[float, bool]:
    """0.5.23's prefill graph capture on every rank (cuda_graph_setup.capture_prefill_graph): its begin and end
    lines, or the line saying it is disabled; returns when it ends and whether a rank ran out of memory."""
    prefill = args.graphs["prefill"]
    if prefill["backend"] == "disabled":
        for rp in plan.ranks:
            rp.events.append((t, "log", "Disable prefill CUDA graph because cuda_graph_config resolved "
                                        "prefill.backend='disabled' (e.g. via --cuda-graph-backend-prefill=disabled "
                                        "or auto-disable rules)."))
        return t, False
    sizes = prefill["bs"]
    cap = T_PREFILL_GRAPH_PER_SIZE * len(sizes)
    failed = False
    for rp in plan.ranks:
        a = allocs[rp.rank.gpu_id]
        before = a.device_free()
        rp.events.append((t, "log", f"Capture target prefill CUDA graph begin. backend={prefill['backend']}, "
                                    f"num_tokens={sizes}, avail mem={before / GB:.2f} GB"))
        try:
            a.malloc(PREFILL_GRAPH_BYTES_PER_SIZE * len(sizes), private=True)
        except G.OutOfMemory as exc:  # a breakable capture's OOM is PyTorch's own error, not wrapped
            rp.failed = failed = True
            rp.events.append((t + cap / 2, "mem", {rp.rank.gpu_id: a.process_bytes}))
            rp.events.append((t + cap / 2, "fail", ("prefill_graph", (str(exc), None))))
            continue
        rp.graph_bytes += before - a.device_free()
        rp.events.append((t + cap, "mem", {rp.rank.gpu_id: a.process_bytes}))
        rp.events.append((t + cap, "log", f"Capture target prefill CUDA graph end. elapsed={cap:.2f} s, "
                                          f"mem usage={(before - a.device_free()) / GB:.2f} GB, "
                                          f"avail mem={a.device_free() / GB:.2f} GB."))
    return t + cap, failed


def cfg_checkpoint_bytes(cfg: ModelConfig) -> int:
    """Bytes of the checkpoint every rank reads (all shards; each rank keeps its slice)."""
    from .model import Rank as _R
    r = _R(0, 0, 0, 0, 1, 1, 1, 1, False)
    return sum(t.nbytes for t in rank_tensors(cfg, r, {}) if t.phase == "load")


def cfg_num_shards(cfg: ModelConfig) -> int:
    return 64 if cfg.is_multimodal else 62


def _tqdm(desc: str, k: int, n: int, elapsed: float, remaining: float) -> str:
    pct = int(100 * k / n)
    rate = (elapsed / k) if k else 0.0

    def mmss(s: float) -> str:
        s = int(s)
        return f"{s // 60:02d}:{s % 60:02d}"

    rate_s = f"{rate:.2f}s/it" if k else "?it/s"
    rem = mmss(remaining) if k else "?"
    return f"{desc}: {pct:3d}% Completed | {k}/{n} [{mmss(elapsed)}<{rem}, {rate_s}]"


def env_dict() -> dict:
    return dict(os.environ)
