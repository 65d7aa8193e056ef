"""What real SGLang does to its host at every start, done for real on the simulated host.

Each function touches the same paths real SGLang 0.5.10 (and the libraries it drives) touches and raises
`HostDenied` with the traceback text real SGLang prints when the host denies it, so a service sandbox
that would break a real start breaks the simulated one the same way:

- CUDA init (`torch.cuda.set_device` in `init_torch_distributed`): the driver opens /dev/nvidiactl,
  /dev/nvidia-uvm and /dev/nvidiaN. The lab's kernel has no NVIDIA driver behind these nodes, so an
  open that reaches the kernel's driver lookup (ENXIO) counts as opened: the sandbox let it through.
- NCCL (communicator init): a segment in /dev/shm (`nccl-XXXXXX`), unlinked once mapped.
- custom all-reduce on a 2-GPU TP group (custom_all_reduce_utils.gpu_p2p_access_check):
  `~/.cache/sglang/gpu_p2p_access_cache_for_<CUDA_VISIBLE_DEVICES>.json`.
- Triton's first kernel: its cache manager makes `$TRITON_CACHE_DIR/<key>` (default ~/.triton/cache), and
  its CUDA helper module is built once per cache with the C compiler against the venv's Python.h.
- FlashInfer's JIT: `$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>/cached_ops/<module>`
  (base: ~) and the module's lock file there, at every start.
- `--trust-remote-code` (transformers, main process): `$HF_MODULES_CACHE` (default `$HF_HOME/modules`,
  HF_HOME default ~/.cache/huggingface) with the model directory's code copied under transformers_modules.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile

from . import gpu as G
from . import release as R
from . import tracebacks as TB

# The FlashInfer each release pins (its METADATA: flashinfer_python==0.6.7.post2; flashinfer_python[cu13]==0.7.2),
# whose version names its JIT cache directory: a new release builds its kernels again. The layout of 0.7.2's cache
# is taken to be 0.6.7's (its wheel is not at hand).
FLASHINFER_VERSIONS = {"0.5.10": "0.6.7.post2", "0.5.23": "0.7.2"}
CUDA_ARCH = "120a"  # RTX PRO 6000 Blackwell: compute capability 12.0


class HostDenied(Exception):
    """A start step the host refused; str() is the text real SGLang prints after its log prefix."""


def dev_dir() -> str:
    return os.environ.get("SIM_GPU_DEV_DIR", "/dev")


def home() -> str:
    return os.path.expanduser("~")


# --------------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------------

def _node_opens(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISCHR(st.st_mode):
        return False  # the driver's ioctls fail on anything but its character device
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        return exc.errno == errno.ENXIO
    return True


def cuda_init(gpu_index: int, visible: list[int]) -> None:
    """cuInit + device enumeration for one process, as libcuda does it: the control and UVM nodes
    first (without them CUDA finds no device, or fails with its unknown error), then one node per GPU;
    a GPU whose node cannot be opened is not enumerated, so later indices shift and run out."""
    d = dev_dir()
    if not _node_opens(os.path.join(d, "nvidiactl")):
        raise HostDenied(TB.cuda_no_gpus())
    if not _node_opens(os.path.join(d, "nvidia-uvm")):
        raise HostDenied(TB.cuda_unknown_error())
    if G.lost_gpus() & set(visible):  # a GPU that fell off the bus fails cuInit until the host reboots
        raise HostDenied(TB.cuda_unknown_error())
    usable = [g for g in visible if _node_opens(os.path.join(d, f"nvidia{g}"))]
    if not usable:
        raise HostDenied(TB.cuda_no_gpus())
    if gpu_index >= len(usable):
        raise HostDenied(TB.invalid_ordinal())


# --------------------------------------------------------------------------------------------
# NCCL and custom all-reduce
# --------------------------------------------------------------------------------------------

def nccl_segment(size: int = 9637888) -> None:
    """ncclShmOpen: create /dev/shm/nccl-XXXXXX, size it, map it; unlinked once the peers have it."""
    name = "nccl-" + os.urandom(4).hex()[:6]
    path = os.path.join("/dev/shm", name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise HostDenied(TB.nccl_error(path, size, exc.errno)) from None
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        raise HostDenied(TB.nccl_error(path, size, exc.errno)) from None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


def p2p_access_cache(visible: list[int], writer: bool) -> None:
    """~/.cache/sglang: every rank of a 2-GPU TP group makes the directory, local rank 0 writes the file."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(str(g) for g in visible)
    path = os.path.join(home(), ".cache", "sglang", f"gpu_p2p_access_cache_for_{cvd}.json")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if writer and not os.path.exists(path):
            pairs = {f"{a}->{b}": True for a in range(len(visible)) for b in range(len(visible))}
            _atomic_write(path, json.dumps(pairs, indent=4).encode())
    except OSError as exc:
        raise HostDenied(TB.p2p_cache_error(exc)) from None


# --------------------------------------------------------------------------------------------
# Triton and FlashInfer JIT caches
# --------------------------------------------------------------------------------------------

def triton_cache_dir() -> str:
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(home(), ".triton", "cache")


def triton_first_kernel() -> None:
    """triton.runtime.build.compile_module_from_src("cuda_utils"): the cache manager makes its key's
    directory, and when the cache lacks the built module the C compiler builds it against Python.h."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha256(f"cuda_utils:{sys.version}:{suffix}".encode()).hexdigest()
    cache = os.path.join(triton_cache_dir(), key)
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError as exc:
        raise HostDenied(TB.triton_cache_error(exc)) from None
    target = os.path.join(cache, f"cuda_utils{suffix}")
    if os.path.exists(target):
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "cuda_utils.c")
        with open(src, "w", encoding="ascii") as fh:
            fh.write("#include <Python.h>\n")
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            raise HostDenied(TB.triton_no_compiler())
        scheme = sysconfig.get_default_scheme()
        include = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]
        so = os.path.join(tmp, f"cuda_utils{suffix}")
        # What Triton runs ...
        shown = [cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, "-lcuda",
                 f"-L{os.path.join(TB.SITE, 'triton', 'backends', 'nvidia', 'lib')}",
                 f"-I{os.path.join(TB.SITE, 'triton', 'backends', 'nvidia', 'include')}", f"-I{tmp}", f"-I{include}"]
        # ... and what the stand-in runs: the same compiler and include path, without libcuda to link.
        done = subprocess.run([cc, src, "-fsyntax-only", f"-I{tmp}", f"-I{include}"], stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            raise HostDenied(TB.triton_compile_error(shown, done.returncode))
        try:
            _atomic_write(target, b"moefleet-sim stand-in for Triton's cuda_utils module\n")
        except OSError as exc:
            raise HostDenied(TB.triton_cache_error(exc)) from None


def flashinfer_jit(module: str = "sampling") -> None:
    """FlashInfer's JitSpec.build_and_load: the module's build directory, then its file lock, taken at
    every load whether or not the module is built already (so a read-only cache fails every start)."""
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or home()
    path = os.path.join(base, ".cache", "flashinfer", FLASHINFER_VERSIONS[R.current()], CUDA_ARCH, "cached_ops",
                        module)
    try:
        os.makedirs(path, exist_ok=True)
        os.close(os.open(os.path.join(path, f"{module}.lock"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
    except OSError as exc:
        raise HostDenied(TB.flashinfer_cache_error(exc)) from None


# --------------------------------------------------------------------------------------------
# transformers' remote code (main process)
# --------------------------------------------------------------------------------------------

def hf_modules_cache() -> str:
    hf_home = os.environ.get("HF_HOME") or os.path.join(home(), ".cache", "huggingface")
    return os.environ.get("HF_MODULES_CACHE") or os.path.join(hf_home, "modules")


def copy_remote_code(model_path: str) -> None:
    """init_hf_modules + the copy of the model's own code (dynamic_module_utils.get_cached_module_file)."""
    modules = hf_modules_cache()
    target = os.path.join(modules, "transformers_modules", os.path.basename(os.path.normpath(model_path)))
    try:
        os.makedirs(modules, exist_ok=True)
        init = os.path.join(modules, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()
        os.makedirs(target, exist_ok=True)
        for parent in (os.path.dirname(target), target):
            if not os.path.exists(os.path.join(parent, "__init__.py")):
                open(os.path.join(parent, "__init__.py"), "w").close()
        for src in sorted(glob.glob(os.path.join(model_path, "*.py"))):
            shutil.copy(src, os.path.join(target, os.path.basename(src)))
    except OSError as exc:
        raise HostDenied(TB.remote_code_error(exc)) from None


def _atomic_write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
