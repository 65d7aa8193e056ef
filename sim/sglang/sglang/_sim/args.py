"""SGLang's command line (a subset of python/sglang/srt/server_args.py ServerArgs.add_cli_args).

Flags, aliases and defaults follow SGLang 0.5.x. argparse keeps SGLang's behaviour: unknown flags fail with
`launch_server.py: error: unrecognized arguments: ...` and exit status 2; unique prefixes are accepted.
"""

from __future__ import annotations

import argparse
import json

KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
QUANTIZATIONS = [
    "awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq", "w4afp8",
    "mxfp4", "compressed-tensors",
]
TOOL_CALL_PARSERS = ["deepseekv3", "deepseekv31", "glm", "glm45", "gpt-oss", "kimi_k2", "llama3", "mistral",
                     "pythonic", "qwen", "qwen25", "qwen3_coder", "step3"]
REASONING_PARSERS = ["deepseek-r1", "deepseek-v3", "glm45", "gpt-oss", "kimi", "kimi_k2", "qwen3",
                     "qwen3-thinking", "step3"]
LOG_LEVELS = ["debug", "info", "warning", "error", "critical"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py")
    a = p.add_argument
    # model and tokenizer
    a("--model-path", "--model", type=str, required=True, dest="model_path",
      help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.")
    a("--tokenizer-path", type=str)
    a("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow"])
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", type=str, default="auto")
    a("--trust-remote-code", action="store_true")
    a("--context-length", type=int)
    a("--is-embedding", action="store_true")
    a("--revision", type=str)
    a("--model-impl", type=str, default="auto")
    a("--dtype", type=str, default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    a("--quantization", type=str, choices=QUANTIZATIONS)
    a("--quantization-param-path", type=str)
    a("--kv-cache-dtype", type=str, default="auto", choices=KV_CACHE_DTYPES)
    a("--json-model-override-args", type=str, default="{}")
    # HTTP server
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--skip-server-warmup", action="store_true")
    a("--warmups", type=str)
    a("--nccl-port", type=int)
    # memory and scheduling
    a("--mem-fraction-static", type=float)
    a("--max-running-requests", type=int)
    a("--max-queued-requests", type=int)
    a("--max-total-tokens", type=int)
    a("--chunked-prefill-size", type=int)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", type=str, default="fcfs")
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=1)
    a("--disable-radix-cache", action="store_true")
    # runtime
    a("--device", type=str)
    a("--tensor-parallel-size", "--tp-size", "--tp", type=int, default=1, dest="tp_size")
    a("--pipeline-parallel-size", "--pp-size", "--pp", type=int, default=1, dest="pp_size")
    a("--pp-max-micro-batch-size", type=int)
    a("--stream-interval", type=int, default=1)
    a("--stream-output", action="store_true")
    a("--random-seed", type=int)
    a("--watchdog-timeout", type=float, default=300)
    a("--dist-timeout", type=int)
    a("--download-dir", type=str)
    a("--base-gpu-id", type=int, default=0)
    a("--gpu-id-step", type=int, default=1)
    a("--sleep-on-idle", action="store_true")
    # logging
    a("--log-level", type=str, default="info", choices=LOG_LEVELS)
    a("--log-level-http", type=str)
    a("--log-requests", action="store_true")
    a("--log-requests-level", type=int, default=2)
    a("--show-time-cost", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--enable-metrics-for-all-schedulers", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    # API
    a("--api-key", type=str)
    a("--served-model-name", type=str)
    a("--chat-template", type=str)
    a("--completion-template", type=str)
    a("--file-storage-path", type=str, default="sglang_storage")
    a("--enable-cache-report", action="store_true")
    a("--reasoning-parser", type=str, choices=REASONING_PARSERS)
    a("--tool-call-parser", type=str, choices=TOOL_CALL_PARSERS)
    # data parallelism
    a("--data-parallel-size", "--dp-size", "--dp", type=int, default=1, dest="dp_size")
    a("--load-balance-method", type=str, default="round_robin")
    # multi-node
    a("--dist-init-addr", "--nccl-init-addr", type=str, dest="dist_init_addr")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    # kernels, expert parallelism
    a("--attention-backend", type=str)
    a("--prefill-attention-backend", type=str)
    a("--decode-attention-backend", type=str)
    a("--sampling-backend", type=str)
    a("--sampling-defaults", type=str, choices=["openai", "model"], default="model")
    a("--grammar-backend", type=str)
    a("--mm-attention-backend", type=str)
    a("--expert-parallel-size", "--ep-size", "--ep", type=int, default=1, dest="ep_size")
    a("--moe-a2a-backend", type=str, default="none", choices=["none", "deepep", "mooncake"])
    a("--moe-runner-backend", type=str, default="auto")
    a("--enable-ep-moe", action="store_true", help=argparse.SUPPRESS)
    a("--enable-eplb", action="store_true")
    a("--ep-num-redundant-experts", type=int, default=0)
    # optimisations
    a("--disable-cuda-graph", action="store_true")
    a("--disable-cuda-graph-padding", action="store_true")
    a("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", type=int, dest="cuda_graph_max_bs")
    a("--cuda-graph-bs", type=int, nargs="+")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--disable-custom-all-reduce", action="store_true")
    a("--disable-piecewise-cuda-graph", action="store_true")
    a("--enforce-piecewise-cuda-graph", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    a("--enable-dp-attention", action="store_true")
    a("--enable-dp-lm-head", action="store_true")
    a("--enable-two-batch-overlap", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--disable-shared-experts-fusion", action="store_true")
    a("--disable-chunked-prefix-cache", action="store_true")
    a("--enable-p2p-check", action="store_true")
    a("--triton-attention-reduce-in-fp32", action="store_true")
    a("--num-continuous-decode-steps", type=int, default=1)
    a("--speculative-algorithm", type=str)
    a("--speculative-draft-model-path", type=str)
    a("--enable-memory-saver", action="store_true")
    a("--delete-ckpt-after-loading", action="store_true")
    a("--enable-multimodal", action="store_true", default=None)
    a("--keep-mm-feature-on-device", action="store_true")
    return p


def _config_args(path: str) -> list[str]:
    """A --config YAML file as command-line arguments, like SGLang's ConfigArgumentMerger: flat
    `key: value` pairs, keys with dashes or underscores, booleans as switches. Only what a flat YAML
    mapping of scalars needs (the simulator has no YAML library)."""
    out: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
            if not line or line == "---":
                continue
            key, _, value = line.partition(":")
            flag, value = "--" + key.strip().replace("_", "-"), value.strip()
            if value.startswith('"') or value.startswith("'"):
                value = json.loads(value) if value.startswith('"') else value[1:-1]
            if value in ("true", "True"):
                out.append(flag)
            elif value not in ("false", "False", "null", "~", ""):
                out += [flag, value]
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--config" in argv:  # values from the file come first, so the command line wins
        i = argv.index("--config")
        argv = _config_args(argv[i + 1]) + argv[:i] + argv[i + 2:]
    args = build_parser().parse_args(argv)
    args.json_model_override_args = json.loads(args.json_model_override_args or "{}")
    if args.enable_ep_moe:
        args.ep_size = args.tp_size
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    if args.dp_size == 1:
        args.enable_dp_attention = False
    return args


# Fields /server_info reports (a subset of ServerArgs plus runtime state)
SERVER_INFO_FIELDS = [
    "model_path", "tokenizer_path", "served_model_name", "host", "port", "tp_size", "pp_size", "ep_size",
    "dp_size", "enable_dp_attention", "enable_dp_lm_head", "mem_fraction_static", "context_length",
    "chunked_prefill_size", "max_prefill_tokens", "cuda_graph_max_bs", "cuda_graph_bs", "disable_cuda_graph",
    "max_running_requests", "max_total_tokens", "kv_cache_dtype", "quantization", "dtype", "trust_remote_code",
    "tool_call_parser", "reasoning_parser", "enable_metrics", "enable_metrics_for_all_schedulers", "watchdog_timeout",
    "log_level", "page_size",
    "moe_a2a_backend", "attention_backend", "random_seed", "base_gpu_id", "nnodes", "node_rank",
    "disable_custom_all_reduce", "load_format", "stream_interval", "sampling_defaults",
]
