"""The simulator does to its host what real SGLang does at every start, and fails where the host denies it.

Denials are made the way a service sandbox makes them: a read-only bind mount in a private mount
namespace (what ProtectSystem=strict does to a path outside ReadWritePaths=), a device node that cannot be
opened, a header that is not there. Those need root (unshare -m, mknod); the lab fixture skips without it.
"""

from __future__ import annotations

import shutil
import signal
import sysconfig
from pathlib import Path

import pytest

# A layout that fits whatever default --mem-fraction-static the simulator computes.
TP8 = ("--tp-size", "8", "--mem-fraction-static", "0.85")
PARENT_DIES = "Received sigquit from a child process. It usually means the child failed."


def read_only(*paths: Path | str) -> tuple[str, ...]:
    """Run the server in a private mount namespace where each path is a read-only bind of itself."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed to make a read-only mount")
    binds = " && ".join(f"mount --bind '{p}' '{p}' && mount -o remount,bind,ro '{p}'" for p in paths)
    return ("unshare", "-m", "--propagation", "private", "sh", "-c", binds + ' && exec "$@"', "sh")


def hidden(path: str, empty: Path) -> tuple[str, ...]:
    """Run the server where `path` shows an empty directory (the file is really absent there)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed to hide a directory")
    return ("unshare", "-m", "--propagation", "private", "sh", "-c",
            f"mount --bind '{empty}' '{path}' && exec \"$@\"", "sh")


def test_a_start_writes_the_caches_real_sglang_writes(lab):
    (lab.model / "tokenization_kimi.py").write_text("# the model's remote code\n")
    srv = lab.start("--tp-size", "2", "--pp-size", "4", "--mem-fraction-static", "0.86", "--trust-remote-code")
    srv.wait_ready(40)
    home = lab.home
    assert list((home / ".triton" / "cache").glob("*/cuda_utils*.so")), "Triton's built helper module"
    assert (home / ".cache/flashinfer/0.6.7.post2/120a/cached_ops/sampling/sampling.lock").is_file()
    assert (home / ".cache" / "sglang" / "gpu_p2p_access_cache_for_0,1,2,3,4,5,6,7.json").is_file()
    modules = home / ".cache" / "huggingface" / "modules"
    assert (modules / "__init__.py").is_file()
    assert (modules / "transformers_modules" / "Kimi-K2.6" / "tokenization_kimi.py").read_text() == \
        "# the model's remote code\n"


def test_tp8_writes_no_p2p_cache(lab):
    srv = lab.start(*TP8)
    srv.wait_ready(40)
    assert not (lab.home / ".cache" / "sglang").exists()  # custom all-reduce is off beyond 2 PCIe GPUs


def test_read_only_triton_cache_fails_the_start_with_tritons_oserror(lab):
    cache = lab.home / "triton"
    srv = lab.start(*TP8, env={"TRITON_CACHE_DIR": str(cache)}, wrap=read_only(lab.home))
    assert srv.wait_exit(40) == -signal.SIGKILL
    log = srv.log
    assert f"OSError: [Errno 30] Read-only file system: '{cache}'" in log
    assert "triton/runtime/cache.py" in log and "Scheduler hit an exception: Traceback" in log
    assert PARENT_DIES in log and "Uvicorn running" not in log


def test_read_only_home_fails_flashinfer_or_triton_without_triton_cache_dir(lab):
    srv = lab.start(*TP8, wrap=read_only(lab.home))
    assert srv.wait_exit(40) == -signal.SIGKILL
    assert f"OSError: [Errno 30] Read-only file system: '{lab.home / '.triton'}'" in srv.log


def test_warm_caches_still_need_a_writable_home_for_flashinfers_lock(lab):
    first = lab.start(*TP8)
    first.wait_ready(40)
    first.stop()
    srv = lab.start(*TP8, wrap=read_only(lab.home))
    assert srv.wait_exit(40) == -signal.SIGKILL
    lock = lab.home / ".cache/flashinfer/0.6.7.post2/120a/cached_ops/sampling/sampling.lock"
    assert f"OSError: [Errno 30] Read-only file system: '{lock}'" in srv.log
    assert "filelock/_unix.py" in srv.log


def test_read_only_hf_home_fails_remote_code_in_the_main_process(lab):
    srv = lab.start(*TP8, "--trust-remote-code", wrap=read_only(lab.home))
    assert srv.wait_exit(40) == 1
    log = srv.log
    assert f"OSError: [Errno 30] Read-only file system: '{lab.home / '.cache'}'" in log
    assert "transformers/dynamic_module_utils.py" in log and "init_hf_modules" in log


def test_read_only_dev_shm_fails_nccls_segment(lab):
    srv = lab.start(*TP8, wrap=read_only("/dev/shm"))
    assert srv.wait_exit(40) == -signal.SIGKILL
    log = srv.log
    assert "Error while creating shared memory segment /dev/shm/nccl-" in log
    assert "error: Read-only file system (30)" in log and "torch.distributed.DistBackendError" in log


@pytest.mark.parametrize("node,text", [
    ("nvidiactl", "RuntimeError: No CUDA GPUs are available"),
    ("nvidia-uvm", "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment"),
    ("nvidia7", "torch.AcceleratorError: CUDA error: invalid device ordinal"),
])
def test_a_gpu_node_that_cannot_be_opened_fails_cuda_init(lab, node, text):
    (lab.dev / node).unlink()
    srv = lab.start(*TP8)
    assert srv.wait_exit(40) == -signal.SIGKILL
    assert text in srv.log and PARENT_DIES in srv.log


def test_a_regular_file_is_no_device_node(lab):
    (lab.dev / "nvidiactl").unlink()
    (lab.dev / "nvidiactl").write_text("")
    srv = lab.start(*TP8)
    assert srv.wait_exit(40) == -signal.SIGKILL
    assert "RuntimeError: No CUDA GPUs are available" in srv.log


def test_fewer_ranks_than_nodes_do_not_need_the_missing_one(lab):
    (lab.dev / "nvidia7").unlink()
    srv = lab.start("--tp-size", "4", "--pp-size", "2", "--mem-fraction-static", "0.85",
                    env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6"})
    assert srv.wait_exit(40) == -signal.SIGKILL  # 8 ranks on 7 GPUs: the 8th has no device
    assert "invalid device ordinal" in srv.log


def test_missing_python_h_fails_tritons_first_compile_like_gcc(lab, tmp_path):
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        pytest.skip("this machine's Python.h is absent already")
    empty = tmp_path / "empty"
    empty.mkdir()
    srv = lab.start(*TP8, wrap=hidden(include, empty))
    assert srv.wait_exit(40) == -signal.SIGKILL
    log = srv.log
    assert "fatal error: Python.h: No such file or directory" in log  # gcc's own words
    assert "subprocess.CalledProcessError: Command '[" in log and "returned non-zero exit status 1." in log


def test_a_built_helper_in_the_cache_needs_no_compiler(lab, tmp_path):
    first = lab.start(*TP8)
    first.wait_ready(40)
    first.stop()
    include = sysconfig.get_paths()["include"]
    empty = tmp_path / "empty"
    empty.mkdir()
    srv = lab.start(*TP8, wrap=hidden(include, empty))
    srv.wait_ready(40)  # Triton reuses cuda_utils from its cache, as real Triton does


def test_no_c_compiler_fails_like_triton(lab):
    srv = lab.start(*TP8, env={"PATH": "/nonexistent"})
    assert srv.wait_exit(40) == -signal.SIGKILL
    assert "RuntimeError: Failed to find C compiler. Please specify via CC environment variable" in srv.log
