"""Simulated GPUs: the per-host spec, the live per-process usage files, and PyTorch's caching allocator.

The spec file (default /etc/sim-gpu/gpus.json, env SIM_GPU_SPEC) and the state directory (default
/dev/shm/sim-gpu/procs, env SIM_GPU_STATE_DIR) are shared with the nvidia-smi stand-in (sim/gpu/nvidia-smi),
which reads the same files with its own copy of this small logic.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field

MiB = 1 << 20
GiB = 1 << 30

DEFAULT_SPEC = {
    "count": 8,
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "memory_total_mib": 97887,
    "torch_total_gib": 94.97,
    "driver_version": "580.95.05",
    "cuda_version": "13.0",
    "compute_cap": "12.0",
    "pcie_only": True,
}

# Memory a process holds outside PyTorch's allocator (documented in README.md).
CUDA_CONTEXT_BYTES = 500 * MiB  # CUDA context + cuBLAS/cuDNN handles, created at set_device
NCCL_COMM_BYTES = 128 * MiB  # buffers of one NCCL communicator on a PCIe box (P2P/SHM channels)


def spec_path() -> str:
    return os.environ.get("SIM_GPU_SPEC", "/etc/sim-gpu/gpus.json")


def state_dir() -> str:
    return os.environ.get("SIM_GPU_STATE_DIR", "/dev/shm/sim-gpu/procs")


def run_dir() -> str:
    """The GPUs' runtime state that a reboot clears (tmpfs /run): which GPUs fell off the bus, whether NCCL hangs.
    Written by the lab's fault injection (sim/lab/lab.py fault), read by nvidia-smi and the simulated server."""
    return os.environ.get("SIM_GPU_RUN_DIR", "/run/sim-gpu")


def lost_gpus() -> set[int]:
    """Indices of the GPUs that fell off the bus (Xid 79) since the host booted."""
    try:
        with open(os.path.join(run_dir(), "lost.json"), encoding="utf-8") as fh:
            return {int(i) for i in json.load(fh)}
    except (OSError, ValueError, TypeError):
        return set()


def nccl_hung() -> bool:
    """Every collective hangs (what P2P routed through the IOMMU does): ranks stop advancing, no error."""
    return os.path.exists(os.path.join(run_dir(), "nccl-hang"))


def load_spec() -> dict:
    spec = dict(DEFAULT_SPEC)
    try:
        with open(spec_path(), encoding="utf-8") as fh:
            spec.update(json.load(fh))
    except FileNotFoundError:
        pass
    return spec


def torch_total_bytes(spec: dict) -> int:
    """What torch.cuda.mem_get_info reports as total (94.97 GiB for the RTX PRO 6000)."""
    return int(round(spec["torch_total_gib"] * GiB / MiB)) * MiB


def proc_start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            data = fh.read()
        return data[data.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int, start: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None:
        now = proc_start_ticks(pid)
        if now is not None and now != start:
            return False  # pid reused by an unrelated process
    try:  # a zombie holds no GPU memory
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            data = fh.read()
        if data[data.rindex(")") + 2:].split()[0] == "Z":
            return False
    except (OSError, ValueError):
        pass
    return True


def live_processes() -> list[dict]:
    out = []
    d = state_dir()
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return out
    for name in sorted(names):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(d, name), encoding="utf-8") as fh:
                rec = json.load(fh)
            pid = int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(pid, rec.get("start_ticks")):
            out.append(rec)
    return out


def used_by_others_bytes(gpu: int, exclude_pids: set[int]) -> int:
    total = 0
    for rec in live_processes():
        if int(rec["pid"]) in exclude_pids:
            continue
        total += int(rec.get("used_mib", {}).get(str(gpu), 0)) * MiB
    return total


def others_on_gpu(gpu: int, exclude_pids: set[int]) -> list[tuple[int, int]]:
    out = []
    for rec in live_processes():
        pid = int(rec["pid"])
        mib = int(rec.get("used_mib", {}).get(str(gpu), 0))
        if pid not in exclude_pids and mib > 0:
            out.append((pid, mib * MiB))
    return sorted(out)


def write_state(pid: int, process_name: str, used_bytes: dict[int, int], extra: dict | None = None) -> None:
    d = state_dir()
    os.makedirs(d, exist_ok=True)
    rec = {
        "pid": pid,
        "process_name": process_name,
        "start_ticks": proc_start_ticks(pid),
        "used_mib": {str(g): int(-(-b // MiB)) for g, b in used_bytes.items() if b > 0},
    }
    if extra:
        rec.update(extra)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(rec, fh)
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(d, f"{pid}.json"))


def remove_state(pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(state_dir(), f"{pid}.json"))


# --------------------------------------------------------------------------------------------
# PyTorch's CUDA caching allocator, reduced to what decides an OOM
# --------------------------------------------------------------------------------------------

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MiB  # requests up to this go to the small pool
K_SMALL_BUFFER = 2 * MiB  # small-pool segment
K_LARGE_BUFFER = 20 * MiB  # segment for requests between 1 and 10 MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB


def format_size(size: int) -> str:
    """c10::CachingAllocator format_size."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


class OutOfMemory(Exception):
    def __init__(self, message: str, alloc_size: int):
        super().__init__(message)
        self.alloc_size = alloc_size


@dataclass
class Segment:
    size: int
    used: int = 0
    pool: str = "large"  # small | large | private


@dataclass
class CachingAllocator:
    """One process's allocator on one device. `free_fn()` returns the device's free bytes
    (cudaMemGetInfo) excluding what this allocator and `non_pytorch` already hold."""

    device: int
    total: int
    pid: int
    others: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes) of other processes
    hidden: int = 0  # memory taken by something this process cannot see (other containers, driver)
    non_pytorch: int = 0
    segments: list[Segment] = field(default_factory=list)
    allocated: int = 0
    allocated_private: int = 0

    @property
    def reserved(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def process_bytes(self) -> int:
        return self.non_pytorch + self.reserved

    def device_free(self) -> int:
        return max(0, self.total - sum(b for _, b in self.others) - self.hidden - self.process_bytes)

    def malloc(self, nbytes: int, private: bool = False) -> None:
        size = max(K_MIN_BLOCK, -(-nbytes // K_MIN_BLOCK) * K_MIN_BLOCK)
        pool = "private" if private else ("small" if size <= K_SMALL_SIZE else "large")
        for seg in self.segments:
            if seg.pool == pool and seg.size - seg.used >= size and (pool != "large" or seg.size == K_LARGE_BUFFER
                                                                      or size >= K_MIN_LARGE_ALLOC):
                seg.used += size
                self._count(size, private)
                return
        if pool == "small":
            alloc = K_SMALL_BUFFER
        elif size < K_MIN_LARGE_ALLOC:
            alloc = K_LARGE_BUFFER
        else:
            alloc = -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
        if alloc > self.device_free():
            raise OutOfMemory(self.oom_message(alloc), alloc)
        self.segments.append(Segment(alloc, size, pool))
        self._count(size, private)

    def _count(self, size: int, private: bool) -> None:
        if private:
            self.allocated_private += size
        else:
            self.allocated += size

    def oom_message(self, alloc: int) -> str:
        proc_info = ""
        for pid, b in self.others:
            proc_info += f"Process {pid} has {format_size(b)} memory in use. "
        proc_info += (f"Including non-PyTorch memory, this process has {format_size(self.process_bytes)} "
                      "memory in use. ")
        private_msg = ""
        if self.allocated_private:
            private_msg = (f"with {format_size(self.allocated_private)} allocated in private pools "
                           "(e.g., CUDA Graphs), ")
        unalloc = self.reserved - self.allocated - self.allocated_private
        return (
            f"CUDA out of memory. Tried to allocate {format_size(alloc)}. GPU {self.device} has a total "
            f"capacity of {format_size(self.total)} of which {format_size(self.device_free())} is free. "
            f"{proc_info}Of the allocated memory {format_size(self.allocated + self.allocated_private)} is "
            f"allocated by PyTorch, {private_msg}and {format_size(unalloc)} is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )
