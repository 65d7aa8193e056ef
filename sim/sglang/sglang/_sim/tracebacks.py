"""Tracebacks of SGLang's start-up failures, as a scheduler process prints them.

Frame lists follow SGLang 0.5.x's call chain (scheduler.run_scheduler_process -> Scheduler -> TpModelWorker ->
ModelRunner -> loader -> model constructor); line numbers are indicative, not taken from one release.
"""

from __future__ import annotations

import errno
import os
import sys

import sglang

from . import release as R

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
        full = path if path.startswith(("/", "<")) else os.path.join(PKG, path)
        out.append(f'  File "{full}", line {line}, in {func}')
        if code:
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
# 0.5.23: model_executor/runner_backend_utils CUDA_GRAPH_CAPTURE_FAILED_MSG
GRAPH_HELP_0_5_23 = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
# 0.5.23's graph capture: ModelRunner.initialize -> cuda_graph_setup.capture_cuda_graphs -> the phase's runner
_GRAPHS_0_5_23 = [
    ("srt/model_executor/model_runner.py", 612, "initialize", "self.init_device_graphs()"),
    ("srt/model_executor/model_runner.py", 2175, "init_device_graphs", "captured = capture_cuda_graphs("),
]


def graph_oom(message: str) -> str:
    """The decode graph's capture running out of memory (the release's runner wraps it in its own Exception)."""
    if R.current() != "0.5.10":
        frames = _HEAD + _GRAPHS_0_5_23 + [
            ("srt/model_executor/model_runner_components/cuda_graph_setup.py", 437, "capture_cuda_graphs",
             "decode = capture_decode_graph(model_runner=model_runner)"),
            ("srt/model_executor/model_runner_components/cuda_graph_setup.py", 777, "capture_decode_graph",
             "runner = GraphRunnerCls(model_runner)"),
            ("srt/model_executor/runner/decode_cuda_graph_runner.py", 602, "__init__", "raise Exception("),
        ]
        return _frames(frames) + f"\nException: Capture cuda graph failed: {message}\n{GRAPH_HELP_0_5_23}"
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 378, "initialize", "self.init_device_graphs()"),
        ("srt/model_executor/model_runner.py", 1890, "init_device_graphs", "self.graph_runner = graph_runners["),
        ("srt/model_executor/cuda_graph_runner.py", 381, "__init__", "raise Exception("),
    ]
    return _frames(frames) + f"\nException: Capture cuda graph failed: {message}\n{GRAPH_HELP}"


def prefill_graph_oom(message: str) -> str:
    """0.5.23's breakable prefill graph running out of memory while it captures: PyTorch's error, unwrapped (only
    the tc_piecewise backend wraps it in "Capture prefill CUDA graph failed")."""
    frames = _HEAD + _GRAPHS_0_5_23 + [
        ("srt/model_executor/model_runner_components/cuda_graph_setup.py", 424, "capture_cuda_graphs",
         "prefill = capture_prefill_graph("),
        ("srt/model_executor/model_runner_components/cuda_graph_setup.py", 691, "capture_prefill_graph",
         "prefill_runner = PrefillCudaGraphRunner(model_runner)"),
    ]
    return _frames(frames) + f"\ntorch.OutOfMemoryError: {message}"


# A scheduler's event loop, as run_scheduler_process runs it once the server serves (scheduler.py, tp_worker.py,
# model_runner.py of 0.5.10): a forward pass that needs more activation memory than the pool left.
_SERVING = [
    ("srt/managers/scheduler.py", 3616, "run_scheduler_process", "scheduler.run_event_loop()"),
    ("srt/managers/scheduler.py", 1300, "run_event_loop", "dispatch_event_loop(self)"),
    ("srt/managers/scheduler.py", 3497, "dispatch_event_loop", "scheduler.event_loop_overlap()"),
    ("srt/managers/scheduler.py", 1361, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
    ("srt/managers/scheduler.py", 2684, "run_batch", "batch_result = self.model_worker.forward_batch_generation("),
    ("srt/managers/tp_worker.py", 469, "forward_batch_generation", "out = self.model_runner.forward("),
    ("srt/model_executor/model_runner.py", 2739, "forward", "output = self._forward_raw("),
    ("srt/model_executor/model_runner.py", 2849, "_forward_raw", "ret, can_run_graph = self.forward_extend("),
    ("srt/model_executor/model_runner.py", 2676, "forward_extend", "self.model.forward("),
]


def oom_forward(message: str) -> str:
    """PyTorch's OOM in a prefill's forward pass while serving (a runtime OOM)."""
    return _frames(_SERVING) + f"\ntorch.OutOfMemoryError: {message}"


def gpu_lost_forward() -> str:
    """A kernel launch on a GPU that fell off the bus while serving (Xid 79): the CUDA error PyTorch raises in the
    forward pass."""
    return _frames(_SERVING) + (
        "\ntorch.AcceleratorError: CUDA error: unspecified launch failure\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )


_DIST_INIT = _HEAD + [
    ("srt/model_executor/model_runner.py", 300, "initialize", "min_per_gpu_memory = self.init_torch_distributed()"),
]


def nccl_error(segment: str = "/dev/shm/nccl-2Bq3Kx", size: int = 9637888, err: int = errno.ENOSPC) -> str:
    """NCCL's failure to create its shared-memory segment (shmutils.cc), as PyTorch raises it."""
    frames = _DIST_INIT + [
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
        f"Error while creating shared memory segment {segment} (size {size}), "
        f"error: {os.strerror(err)} ({err})"
    )


_SET_DEVICE = _DIST_INIT + [
    ("srt/model_executor/model_runner.py", 626, "init_torch_distributed",
     "torch.get_device_module(self.device).set_device(self.gpu_id)"),
    (os.path.join(TORCH, "cuda/__init__.py"), 567, "set_device", "torch._C._cuda_setDevice(device)"),
]


def cuda_no_gpus() -> str:
    """cuInit finds no device (the control node cannot be opened): PyTorch's lazy init."""
    frames = _SET_DEVICE + [(os.path.join(TORCH, "cuda/__init__.py"), 412, "_lazy_init", "torch._C._cuda_init()")]
    return _frames(frames) + "\nRuntimeError: No CUDA GPUs are available"


def cuda_unknown_error() -> str:
    """cuInit fails with CUDA_ERROR_UNKNOWN (no usable /dev/nvidia-uvm): c10's device_count_impl."""
    frames = _SET_DEVICE + [(os.path.join(TORCH, "cuda/__init__.py"), 412, "_lazy_init", "torch._C._cuda_init()")]
    return _frames(frames) + (
        "\nRuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing "
        "env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.")


def _makedirs_frames() -> list[tuple]:
    return [("<frozen os>", 215, "makedirs", None), ("<frozen os>", 225, "makedirs", "mkdir(name, mode)")]


def _oserror(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc}"


def p2p_cache_error(exc: OSError) -> str:
    frames = _DIST_INIT + [
        ("srt/model_executor/model_runner.py", 680, "init_torch_distributed", "initialize_model_parallel("),
        ("srt/distributed/parallel_state.py", 1490, "initialize_model_parallel", "_TP = init_model_parallel_group("),
        ("srt/distributed/parallel_state.py", 1290, "init_model_parallel_group", "return GroupCoordinator("),
        ("srt/distributed/parallel_state.py", 330, "__init__", "self.ca_comm = CustomAllreduce("),
        ("srt/distributed/device_communicators/custom_all_reduce.py", 83, "__init__",
         "full_nvlink = can_use_custom_all_reduce_with_nvlink("),
        ("srt/distributed/device_communicators/custom_all_reduce_utils.py", 464,
         "can_use_custom_all_reduce_with_nvlink",
         "if not _is_hip and not can_p2p(rank, world_size):"),
        ("srt/distributed/device_communicators/custom_all_reduce_utils.py", 320, "can_p2p",
         "if not gpu_p2p_access_check(i, j):"),
        ("srt/distributed/device_communicators/custom_all_reduce_utils.py", 267, "gpu_p2p_access_check",
         "os.makedirs(os.path.dirname(path), exist_ok=True)"),
    ] + _makedirs_frames()
    return _frames(frames) + "\n" + _oserror(exc)


_TRITON = os.path.join(SITE, "triton")
_FIRST_KERNEL = _HEAD + [
    ("srt/model_executor/model_runner.py", 341, "initialize", "self.load_model()"),
    ("srt/model_executor/model_runner.py", 820, "load_model", "self.model = get_model("),
    ("srt/model_loader/__init__.py", 28, "get_model", "return loader.load_model("),
    ("srt/model_loader/loader.py", 612, "load_model", "self.load_weights_and_postprocess("),
    ("srt/model_loader/loader.py", 652, "load_weights_and_postprocess",
     "quant_method.process_weights_after_loading(module)"),
    (os.path.join(_TRITON, "runtime/jit.py"), 419, "<lambda>",
     "return lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)"),
    (os.path.join(_TRITON, "runtime/jit.py"), 733, "run", "device = driver.active.get_current_device()"),
    (os.path.join(_TRITON, "runtime/driver.py"), 28, "__getattr__", "return getattr(self._initialize_obj(), name)"),
    (os.path.join(_TRITON, "runtime/driver.py"), 24, "_initialize_obj", "self._obj = self._init_fn()"),
    (os.path.join(_TRITON, "backends/nvidia/driver.py"), 724, "__init__", "self.utils = CudaUtils()"),
    (os.path.join(_TRITON, "backends/nvidia/driver.py"), 86, "__init__",
     'mod = compile_module_from_src(src=Path(os.path.join(dirname, "driver.c")).read_text(),'),
]


def triton_cache_error(exc: OSError) -> str:
    frames = _FIRST_KERNEL + [
        (os.path.join(_TRITON, "runtime/build.py"), 88, "compile_module_from_src", "cache = get_cache_manager(key)"),
        (os.path.join(_TRITON, "runtime/cache.py"), 276, "get_cache_manager",
         "return __cache_cls(_base32(key))"),
        (os.path.join(_TRITON, "runtime/cache.py"), 71, "__init__", "os.makedirs(self.cache_dir, exist_ok=True)"),
    ] + _makedirs_frames()
    return _frames(frames) + "\n" + _oserror(exc)


def triton_no_compiler() -> str:
    frames = _FIRST_KERNEL + [
        (os.path.join(_TRITON, "runtime/build.py"), 98, "compile_module_from_src",
         "so = _build(name, src_path, tmpdir, library_dirs or [], include_dirs or [], libraries or [], ccflags or [])"),
        (os.path.join(_TRITON, "runtime/build.py"), 32, "_build", "raise RuntimeError("),
    ]
    return _frames(frames) + ("\nRuntimeError: Failed to find C compiler. Please specify via CC environment "
                              "variable or set triton.knobs.build.impl.")


def triton_compile_error(cmd: list[str], returncode: int) -> str:
    frames = _FIRST_KERNEL + [
        (os.path.join(_TRITON, "runtime/build.py"), 98, "compile_module_from_src",
         "so = _build(name, src_path, tmpdir, library_dirs or [], include_dirs or [], libraries or [], ccflags or [])"),
        (os.path.join(_TRITON, "runtime/build.py"), 51, "_build",
         "subprocess.check_call(cc_cmd, stdout=subprocess.DEVNULL)"),
        ("/usr/lib/python3.11/subprocess.py", 413, "check_call", "raise CalledProcessError(retcode, cmd)"),
    ]
    return _frames(frames) + (f"\nsubprocess.CalledProcessError: Command '{cmd!r}' returned non-zero exit status "
                              f"{returncode}.")


def flashinfer_cache_error(exc: OSError) -> str:
    fi = os.path.join(SITE, "flashinfer")
    frames = _HEAD + [
        ("srt/model_executor/model_runner.py", 370, "initialize", "self.init_attention_backend()"),
        ("srt/model_executor/model_runner.py", 1702, "init_attention_backend",
         "self.attn_backend = self._get_attention_backend()"),
        (os.path.join(fi, "jit/core.py"), 296, "build_and_load",
         "with FileLock(self.lock_path, thread_local=False):"),
        (os.path.join(SITE, "filelock/_api.py"), 376, "__enter__", "self.acquire()"),
        (os.path.join(SITE, "filelock/_api.py"), 332, "acquire", "self._acquire()"),
        (os.path.join(SITE, "filelock/_unix.py"), 42, "_acquire",
         "fd = os.open(self.lock_file, open_flags, self._context.mode)"),
    ]
    if exc.filename and not str(exc.filename).endswith(".lock"):
        frames = frames[:-3] + [(os.path.join(fi, "jit/core.py"), 290, "build_and_load",
                                 "os.makedirs(self.build_dir, exist_ok=True)")] + _makedirs_frames()
    return _frames(frames) + "\n" + _oserror(exc)


def remote_code_error(exc: OSError) -> str:
    tf = os.path.join(SITE, "transformers")
    frames = [
        (os.path.join(PKG, "launch_server.py"), 32, "<module>", "launch_server(server_args)"),
        ("srt/entrypoints/http_server.py", 1690, "launch_server", "_launch_subprocesses(server_args=server_args)"),
        ("srt/entrypoints/engine.py", 870, "_launch_subprocesses", "tokenizer_manager = TokenizerManager("),
        ("srt/managers/tokenizer_manager.py", 262, "__init__", "self.tokenizer = get_tokenizer("),
        ("srt/utils/hf_transformers_utils.py", 570, "get_tokenizer", "tokenizer = AutoTokenizer.from_pretrained("),
        (os.path.join(tf, "models/auto/tokenization_auto.py"), 1101, "from_pretrained",
         "tokenizer_class = get_class_from_dynamic_module(class_ref, pretrained_model_name_or_path, **kwargs)"),
        (os.path.join(tf, "dynamic_module_utils.py"), 570, "get_class_from_dynamic_module",
         "final_module = get_cached_module_file("),
        (os.path.join(tf, "dynamic_module_utils.py"), 360, "get_cached_module_file", "init_hf_modules()"),
        (os.path.join(tf, "dynamic_module_utils.py"), 60, "init_hf_modules",
         "os.makedirs(HF_MODULES_CACHE, exist_ok=True)"),
    ] + _makedirs_frames()
    return _frames(frames) + "\n" + _oserror(exc)


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
