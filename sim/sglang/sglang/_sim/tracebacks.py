"""Tracebacks of SGLang's start-up failures, as a scheduler process prints them.

Frame lists follow SGLang 0.5.x's call chain (scheduler.run_scheduler_process -> Scheduler -> TpModelWorker ->
ModelRunner -> loader -> model constructor); line numbers are indicative, not taken from one release.
"""

from __future__ import annotations

import os
import sys

import sglang

PKG = os.path.dirname(os.path.abspath(sglang.__file__))
SITE = os.path.dirname(PKG)
TORCH = os.path.join(SITE, "torch")

_HEAD = [
    ("srt/managers/scheduler.py", 2790, "run_scheduler_process", "scheduler = Scheduler("),
    ("srt/managers/scheduler.py", 326, "__init__", "self.tp_worker = TpModelWorker("),
    ("srt/managers/tp_worker.py", 95, "__init__", "self.model_runner = ModelRunner("),
    ("srt/model_executor/model_runner.py", 278, "__init__", "self.initialize(min_per_gpu_memory)"),
]


def _frames(frames: list[tuple]) -> str:
    out = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        full = path if path.startswith("/") else os.path.join(PKG, path)
        out.append(f'  File "{full}", line {line}, in {func}')
        out.append(f"    {code}")
    return "\n".join(out)


def oom_weights(message: str, tensor: str, architecture: str) -> str:
    arch_file = "kimi_k25.py" if architecture.startswith("KimiK25") else "deepseek_v2.py"
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 341, "initialize", "self.load_model()"),
        ("srt/model_executor/model_runner.py", 790, "load_model", "self.model = get_model("),
        ("srt/model_loader/__init__.py", 28, "get_model", "return loader.load_model("),
        ("srt/model_loader/loader.py", 595, "load_model", "model = _initialize_model("),
        ("srt/model_loader/loader.py", 262, "_initialize_model", "return model_class("),
    ]
    if arch_file == "kimi_k25.py":
        frames.append(("srt/models/kimi_k25.py", 664, "__init__", "self.language_model = DeepseekV3ForCausalLM("))
    frames += [
        ("srt/models/deepseek_v2.py", 2668, "__init__", "self.model = DeepseekV2Model("),
        ("srt/models/deepseek_v2.py", 2484, "__init__", "self.layers, self.start_layer, self.end_layer = make_layers("),
        ("srt/utils/common.py", 602, "make_layers", "+ ["),
        ("srt/utils/common.py", 603, "<listcomp>",
         "maybe_offload_to_cpu(layer_fn(idx=idx, prefix=add_prefix(idx, prefix)))"),
        ("srt/models/deepseek_v2.py", 2486, "<lambda>", "lambda idx, prefix: DeepseekV2DecoderLayer("),
    ]
    if ".experts." in tensor or tensor.endswith("experts"):
        frames += [
            ("srt/models/deepseek_v2.py", 2210, "__init__", "self.mlp = DeepseekV2MoE("),
            ("srt/models/deepseek_v2.py", 352, "__init__", "self.experts = get_moe_impl_class(quant_config)("),
            ("srt/layers/moe/fused_moe_triton/layer.py", 253, "__init__", "self.quant_method.create_weights("),
            ("srt/layers/quantization/compressed_tensors/compressed_tensors_moe.py", 681, "create_weights",
             "torch.empty("),
        ]
    elif ".self_attn." in tensor:
        frames += [
            ("srt/models/deepseek_v2.py", 2180, "__init__", "self.self_attn = DeepseekV2AttentionMLA("),
            ("srt/layers/linear.py", 420, "__init__", "torch.empty("),
        ]
    else:
        frames += [
            ("srt/models/deepseek_v2.py", 2224, "__init__", "self.mlp = DeepseekV2MLP("),
            ("srt/layers/linear.py", 420, "__init__", "torch.empty("),
        ]
    frames.append((os.path.join(TORCH, "utils/_device.py"), 104, "__torch_function__",
                   "return func(*args, **kwargs)"))
    return _frames(frames) + f"\ntorch.OutOfMemoryError: {message}"


def oom_post_load(message: str) -> str:
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 341, "initialize", "self.load_model()"),
        ("srt/model_executor/model_runner.py", 790, "load_model", "self.model = get_model("),
        ("srt/model_loader/__init__.py", 28, "get_model", "return loader.load_model("),
        ("srt/model_loader/loader.py", 612, "load_model", "self.load_weights_and_postprocess("),
        ("srt/model_loader/loader.py", 640, "load_weights_and_postprocess", "model.load_weights(weights)"),
        ("srt/models/deepseek_v2.py", 3120, "post_load_weights",
         "w_kc.transpose(1, 2).contiguous().transpose(1, 2)"),
    ]
    return _frames(frames) + f"\ntorch.OutOfMemoryError: {message}"


def kv_not_enough() -> str:
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 362, "initialize", "self.init_memory_pool("),
        ("srt/model_executor/model_runner.py", 1480, "init_memory_pool", "raise RuntimeError("),
    ]
    return _frames(frames) + "\nRuntimeError: Not enough memory. Please try to increase --mem-fraction-static."


def oom_kv_alloc(message: str) -> str:
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 362, "initialize", "self.init_memory_pool("),
        ("srt/model_executor/model_runner.py", 1560, "init_memory_pool", "self.token_to_kv_pool = MLATokenToKVPool("),
        ("srt/mem_cache/memory_pool.py", 1080, "__init__", "self._create_buffers()"),
        ("srt/mem_cache/memory_pool.py", 1112, "_create_buffers", "torch.zeros("),
    ]
    return _frames(frames) + f"\ntorch.OutOfMemoryError: {message}"


GRAPH_HELP = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def graph_oom(message: str) -> str:
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 378, "initialize", "self.init_device_graphs()"),
        ("srt/model_executor/model_runner.py", 1890, "init_device_graphs", "self.graph_runner = graph_runners["),
        ("srt/model_executor/cuda_graph_runner.py", 381, "__init__", "raise Exception("),
    ]
    return _frames(frames) + f"\nException: Capture cuda graph failed: {message}\n{GRAPH_HELP}"


def nccl_error() -> str:
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 300, "initialize", "min_per_gpu_memory = self.init_torch_distributed()"),
        ("srt/model_executor/model_runner.py", 680, "init_torch_distributed", "initialize_model_parallel("),
        ("srt/distributed/parallel_state.py", 1490, "initialize_model_parallel", "_TP = init_model_parallel_group("),
        ("srt/distributed/parallel_state.py", 1290, "init_model_parallel_group", "return GroupCoordinator("),
        ("srt/distributed/parallel_state.py", 300, "__init__", "self.pynccl_comm = PyNcclCommunicator("),
        ("srt/distributed/device_communicators/pynccl.py", 110, "__init__", "self.all_reduce(data)"),
        (os.path.join(TORCH, "distributed/c10d_logger.py"), 81, "wrapper", "return func(*args, **kwargs)"),
        (os.path.join(TORCH, "distributed/distributed_c10d.py"), 2806, "all_reduce",
         "work = group.allreduce([tensor], opts)"),
    ]
    return _frames(frames) + (
        "\ntorch.distributed.DistBackendError: NCCL error in: "
        "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error "
        "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
        "Last error:\n"
        "Error while creating shared memory segment /dev/shm/nccl-2Bq3Kx (size 9637888), "
        "error: No space left on device (28)"
    )


def invalid_ordinal() -> str:
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 300, "initialize", "min_per_gpu_memory = self.init_torch_distributed()"),
        ("srt/model_executor/model_runner.py", 626, "init_torch_distributed",
         "torch.get_device_module(self.device).set_device(self.gpu_id)"),
        (os.path.join(TORCH, "cuda/__init__.py"), 567, "set_device", "torch._C._cuda_setDevice(device)"),
    ]
    return _frames(frames) + (
        "\ntorch.AcceleratorError: CUDA error: invalid device ordinal\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )


def main_exception(exc_type: str, message: str, frames: list[tuple]) -> str:
    base = [
        (os.path.join(PKG, "launch_server.py"), 29, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
    ]
    return _frames(base + frames) + f"\n{exc_type}: {message}" if message else _frames(base + frames) + f"\n{exc_type}"


def python_version() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"
