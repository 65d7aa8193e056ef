"""SGLang's command line (a subset of ServerArgs.add_cli_args), as the release the simulator is parses it.

Flags, aliases and defaults follow the wheel of each release (_sim/release.py): 0.5.10's
python/sglang/srt/server_args.py, 0.5.23's (its arguments in srt/arg_groups/). Where 0.5.23 dropped or split a flag,
its parser refuses the old spelling as the real one does: ``--cuda-graph-max-bs`` is an ambiguous prefix of
``--cuda-graph-max-bs-decode`` and ``--cuda-graph-max-bs-prefill``, ``--enable-nan-detection`` unrecognized.
argparse keeps SGLang's behaviour (prepare_server_args: ``ArgumentParser(prog="sglang serve")`` in both): an
unknown flag fails with ``sglang serve: error: unrecognized arguments: ...`` and exit status 2; unique prefixes are
accepted, judged against this subset (an abbreviation real SGLang finds ambiguous among flags the simulator lacks is
taken here). tests/sim/test_releases.py holds every spelling and choice here against the generated table of each
release (plugins/module_utils/sglang_args_<release>.py).

The rest of the simulator reads the layout in 0.5.10's vocabulary (``dp_size`` with ``enable_dp_attention``,
``cuda_graph_max_bs``, ``cuda_graph_bs``): parse_args translates 0.5.23's names into it and keeps what 0.5.23's
resolution reports under its own names in ``args.reported`` (/server_info).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from decimal import Decimal

from . import release as R

KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
QUANTIZATIONS = [
    "awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq", "w4afp8",
    "mxfp4", "compressed-tensors",
]
# Choices 0.5.23 dropped (its own lists have others this subset leaves out)
DROPPED_IN_0_5_23 = {"kv_cache_dtype": {"fp4_e2m1"}, "quantization": {"marlin", "qoq"}}
TOOL_CALL_PARSERS = ["deepseekv3", "deepseekv31", "glm", "glm45", "gpt-oss", "kimi_k2", "llama3", "mistral",
                     "pythonic", "qwen", "qwen25", "qwen3_coder", "step3"]
REASONING_PARSERS = ["deepseek-r1", "deepseek-v3", "glm45", "gpt-oss", "kimi", "kimi_k2", "qwen3",
                     "qwen3-thinking", "step3"]
LOG_LEVELS = ["debug", "info", "warning", "error", "critical"]
CUDA_GRAPH_BACKENDS = ["full", "breakable", "disabled"]  # 0.5.23 model_executor/cuda_graph_config.py Backend


def human_readable_int(value: str) -> int:
    """SGLang's converter of token counts in both releases (utils/common.py): an integer, or one with an SI suffix
    (k, M, G, T; decimals allowed: "25.6k") or an IEC one (Ki, Mi, Gi, Ti; whole numbers only), case-sensitive."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'.")
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes "
            "(1Ki, 1Mi). Suffixes are case-sensitive.") from None


class DeprecatedStoreTrue(argparse.Action):
    """0.5.23's DeprecatedStoreTrueAction (arg_groups/argparse_actions.py): stores True and warns. The warning goes
    through SGLang's logger before logging is set up, so Python's last-resort handler prints the bare message."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=0, const=True, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print(f"\033[1;33m'{option_string}' is deprecated and will be removed in a future release.{replacement}"
              "\033[0m", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, True)


def build_parser(release: str | None = None) -> argparse.ArgumentParser:
    """SGLang ``release``'s parser (default: the release the simulator is), the subset the simulator takes."""
    release = release or R.current()
    new = release != "0.5.10"  # 0.5.23's argument layer

    def choices(name: str, values: list[str]) -> list[str]:
        return [v for v in values if not (new and v in DROPPED_IN_0_5_23.get(name, ()))]

    p = argparse.ArgumentParser(prog="sglang serve")
    a = p.add_argument
    # model and tokenizer
    a("--model-path", "--model", type=str, required=True, dest="model_path",
      help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.")
    a("--tokenizer-path", type=str)
    a("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow"])
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", type=str, default="auto")
    a("--trust-remote-code", action="store_true")
    a("--context-length", type=human_readable_int)
    a("--is-embedding", action="store_true")
    a("--revision", type=str)
    a("--model-impl", type=str, default="auto")
    a("--dtype", type=str, default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    a("--quantization", type=str, choices=choices("quantization", QUANTIZATIONS))
    a("--quantization-param-path", type=str)
    a("--kv-cache-dtype", type=str, default="auto", choices=choices("kv_cache_dtype", KV_CACHE_DTYPES))
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
    a("--max-total-tokens", type=human_readable_int)
    a("--chunked-prefill-size", type=int)
    a("--max-prefill-tokens", type=human_readable_int, default=16384)
    a("--schedule-policy", type=str, default="fcfs")
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=1)
    a("--disable-radix-cache", action="store_true")
    # runtime
    a("--device", type=str)
    # `--tp 8` and `--dp 8` are unique prefixes in both releases; `--pp` is ambiguous (three pp flags)
    a("--tensor-parallel-size", "--tp-size", type=int, default=1, dest="tp_size")
    a("--pipeline-parallel-size", "--pp-size", type=int, default=1, dest="pp_size")
    a("--pp-max-micro-batch-size", type=int)
    a("--pp-async-batch-depth", type=int, default=0)
    a("--stream-interval", type=int, default=1)
    if not new:
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
    a("--data-parallel-size", "--dp-size", type=int, default=1, dest="dp_size")
    if new:  # attention DP has its own width (arg_groups/fields); --dp-size counts replicas again
        a("--attention-data-parallel-size", "--attn-dp-size", type=int, default=1, dest="attn_dp_size")
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
    a("--enable-eplb", action="store_true")
    a("--ep-num-redundant-experts", type=int, default=0)
    # optimisations
    if new:  # CUDA graphs by phase (arg_groups/fields/exec_.py), in the order 0.5.23 registers them
        a("--cuda-graph-backend-decode", type=str, choices=CUDA_GRAPH_BACKENDS)
        a("--cuda-graph-backend-prefill", type=str, choices=CUDA_GRAPH_BACKENDS)
        a("--cuda-graph-bs-decode", type=int, nargs="+")
        a("--cuda-graph-bs-prefill", type=int, nargs="+")
        a("--cuda-graph-max-bs-decode", type=int)
        a("--cuda-graph-max-bs-prefill", type=int)
        a("--disable-decode-cuda-graph", action="store_true")
        a("--disable-prefill-cuda-graph", action="store_true")
        a("--disable-cuda-graph", action=DeprecatedStoreTrue,
          new_flag="--cuda-graph-backend-{decode,prefill}=disabled")
    else:
        a("--disable-cuda-graph", action="store_true")
        a("--cuda-graph-max-bs", type=int)
        a("--cuda-graph-bs", type=int, nargs="+")
        a("--disable-piecewise-cuda-graph", action="store_true")
        a("--enforce-piecewise-cuda-graph", action="store_true")
        a("--enable-nan-detection", action="store_true")
    a("--disable-cuda-graph-padding", action="store_true")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    if new:
        a("--enable-dp-attention", action=DeprecatedStoreTrue, new_flag="--attn-dp-size <dp-size>")
    else:
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
    if not new:
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


def parse_args(argv: list[str], release: str | None = None) -> argparse.Namespace:
    release = release or R.current()
    if "--config" in argv:  # values from the file come first, so the command line wins
        i = argv.index("--config")
        argv = _config_args(argv[i + 1]) + argv[:i] + argv[i + 2:]
    args = build_parser(release).parse_args(argv)
    args.release = release
    args.json_model_override_args = json.loads(args.json_model_override_args or "{}")
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    args.reported = {}
    if release != "0.5.10":
        _resolve_0_5_23(args)
    if args.dp_size == 1:
        args.enable_dp_attention = False
    return args


def _resolve_0_5_23(args: argparse.Namespace) -> None:
    """0.5.23's names in the simulator's (0.5.10's) vocabulary, and what its resolution reports under its own.

    Attention DP: ``--attn-dp-size N``; the deprecated ``--dp-size N --enable-dp-attention`` is rewritten to
    attn_dp_size=N, dp_size=1 (arg_groups/parallel_hook.py handle_deprecated_dp_attention), and /server_info reports
    enable_dp_attention as ``attn_dp_size > 1`` (ServerArgs.resolved_dict). The simulator's layout is dp_size=N with
    enable_dp_attention. Both widths above 1 is refused at start (check_args), as _handle_data_parallelism does.
    CUDA graphs: the decode graph's max_bs and bs are what 0.5.10's cuda_graph_max_bs and cuda_graph_bs sized; the
    prefill graph (breakable, on by default) is planned by plan.py."""
    attn, dp = args.attn_dp_size, args.dp_size
    if args.enable_dp_attention and attn == 1:
        attn, dp = dp, 1
    args.reported = {"attn_dp_size": attn, "dp_size": dp, "enable_dp_attention": attn > 1}
    args.dp_conflict = (f"--dp-size {dp} with --attn-dp-size {attn}: data-parallel replicas combined with attention "
                        "data parallelism are not supported.") if attn > 1 and dp > 1 else None
    if attn > 1:
        args.dp_size, args.enable_dp_attention = attn, True
    else:
        args.dp_size, args.enable_dp_attention = dp, False
    args.cuda_graph_max_bs = args.cuda_graph_max_bs_decode
    args.cuda_graph_bs = args.cuda_graph_bs_decode
    # prefill_graph_settings (plan.py) decides the prefill graph; 0.5.23 has no piecewise graphs
    args.disable_piecewise_cuda_graph = args.enforce_piecewise_cuda_graph = False


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
# 0.5.23 reports its resolved record (ServerArgs.resolved_dict): no cuda_graph_max_bs or cuda_graph_bs, but the
# per-phase flags as given, attn_dp_size, and cuda_graph_config (http.py adds it from the plan).
SERVER_INFO_FIELDS_0_5_23 = [f for f in SERVER_INFO_FIELDS if f not in ("cuda_graph_max_bs", "cuda_graph_bs")] + [
    "attn_dp_size", "cuda_graph_max_bs_decode", "cuda_graph_bs_decode", "cuda_graph_max_bs_prefill",
    "cuda_graph_bs_prefill", "cuda_graph_backend_decode", "cuda_graph_backend_prefill", "disable_decode_cuda_graph",
    "disable_prefill_cuda_graph",
]


def server_info_fields(release: str) -> list[str]:
    return SERVER_INFO_FIELDS if release == "0.5.10" else SERVER_INFO_FIELDS_0_5_23
