"""The lab's stand-in for torch.distributed + NCCL under p2p-allreduce-check (roles/sglang_service/files): a backend
file for its --backend option, answering as this host's simulated PCIe state says real hardware would.

The lab's SGLang venv has no torch, so the check cannot run its own torch backend there; the lab's inventory gives the
preflight this file instead (installed on lab hosts as /usr/local/lib/moefleet-sim/p2p_backend.py by sim/lab/lab.py,
beside pcie_sim.py, which it reads). The check script, its waits, timeouts, data check bookkeeping and bus bandwidth
arithmetic are the real ones (its process per rank is not: below); only the collective is modelled (pcie_sim.plan):

- transport per GPU pair from NCCL_P2P_DISABLE / NCCL_P2P_LEVEL (default SYS on the lab's AMD host) and the pair's
  link in the simulated PCI tree;
- the all-reduce hangs (no error, no progress, as NCCL does) when a pair that uses P2P has a bridge with ACS
  ReqRedir/CmpltRedir on its path while the IOMMU translates; with "after_hang" busy or unresponsive the GPUs stay
  stuck after its processes are killed (RUN/p2p-stuck.json) until the host reboots;
- it hangs as well where the lab's `fault HOST hang` says every collective hangs, and in the GPUs a hang left busy;
  a GPU that fell off the bus (xid79) or that a hang left unresponsive fails at CUDA init with an error;
- otherwise each timed all-reduce takes size * 2(n-1)/n / busbw, busbw the slowest pair's figure (pcie_sim's
  P2P_BUSBW, SHM_BUSBW, REDIRECTED_BUSBW, with their sources): the backend sleeps that long and reports that time
  (not the sleep's, which a loaded machine stretches), so the script computes the model's bus bandwidth.
It prints NCCL's INFO lines (version, each rank's ring step "via P2P/CUMEM" or "via SHM/direct/direct", Init
COMPLETE) when NCCL_DEBUG=INFO, in NCCL's format, for the preflight to read the transports as it would from NCCL.

Its ranks run as threads of the check's own process (RANKS = "threads"): a model has no CUDA state that needs a
process per rank, and eight interpreters per run were most of the lab preflight's CPU (measured: 0.65 CPU-s a run with
a process per rank, 8 GPUs; the lab's suite runs on 2 cores). A hung rank's thread waits, as a process would, until
the check gives up at its timeout and exits. A test that wants the check's process handling runs this file through a
backend file of its own without RANKS (tests/sim/test_p2p_sim.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pcie_sim  # noqa: E402


def _lost() -> set[int]:
    """The GPUs that fell off the bus this boot (lab.py fault HOST xid79). Path.read_text: this module's own open()
    is the backend's entry point."""
    try:
        return {int(i) for i in json.loads(Path(pcie_sim.run_dir(), "lost.json").read_text(encoding="utf-8"))}
    except (OSError, ValueError, TypeError):
        return set()


def _hang_forever() -> None:
    while True:  # what a rank in a hung NCCL collective does: wait, without an error
        time.sleep(3600)


def _rendezvous(rank: int, world: int, port: int, timeout_s: float) -> None:
    """Every rank waits for all the others, as torch's init_process_group does over its TCP store on 127.0.0.1:port
    (rank 0 listens): a rank cannot reach the all-reduce while another is still starting."""
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            peers = [server.accept()[0] for _ in range(world - 1)]
            for peer in peers:
                peer.sendall(b"go")
                peer.close()
        return
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=max(0.1, deadline - time.monotonic())) as conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                if conn.recv(2) == b"go":
                    return
        except OSError:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the process group did not form within {timeout_s:g} s") from None
            time.sleep(0.05)


# The check runs this backend's ranks as threads (roles/sglang_service/files/p2p-allreduce-check).
RANKS = "threads"


class SimComm:
    def __init__(self, rank: int, world: int, port: int, timeout_s: float, emit=None) -> None:
        self.emit = emit or (lambda text: print(text, flush=True))
        visible = [int(g) for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        if len(visible) < world:
            raise RuntimeError(f"CUDA error: invalid device ordinal (CUDA_VISIBLE_DEVICES has {len(visible)} GPU(s) "
                               f"for {world} ranks)")
        self.rank, self.world, self.gpus, self.gpu = rank, world, visible[:world], visible[rank]
        if self.gpu in _lost():
            raise RuntimeError("CUDA error: unknown error (the simulated GPU fell off the bus)")
        stuck = pcie_sim.stuck_gpus()
        if stuck.get(self.gpu) == "unresponsive":
            raise RuntimeError("CUDA error: unknown error (the simulated GPU stopped answering after a hung "
                               "all-reduce)")
        _rendezvous(rank, world, port, timeout_s)
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        self.plan = pcie_sim.plan(self.gpus, env)
        self.busy = bool(set(self.gpus) & {g for g, mode in stuck.items() if mode == "busy"})
        self.nccl_version = pcie_sim.NCCL_VERSION
        self.device_name = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        if os.environ.get("NCCL_DEBUG", "").upper() == "INFO":
            self._nccl_lines()

    def _nccl_lines(self) -> None:
        host, pid, tid = socket.gethostname(), os.getpid(), threading.get_native_id()  # NCCL's host:pid:tid
        prefix = f"{host}:{pid}:{tid} [{self.rank}] NCCL INFO"
        lines = [f"{prefix} NCCL version {self.nccl_version}+cuda12.9"] if self.rank == 0 else []
        for variable, value in sorted((k, v) for k, v in os.environ.items() if k.startswith("NCCL_")):
            if variable != "NCCL_DEBUG":
                lines.append(f"{prefix} {variable} set by environment to {value}")
        peer = (self.rank + 1) % self.world
        pair = next(p for p in self.plan["pairs"] if {p["a"], p["b"]} == {self.gpus[self.rank], self.gpus[peer]})
        via = "P2P/CUMEM" if pair["transport"] == "P2P" else "SHM/direct/direct"
        for channel in range(2):
            lines.append(f"{prefix} Channel {channel:02d}/0 : {self.rank}[{self.rank}] -> {peer}[{peer}] via {via}")
        lines.append(f"{prefix} comm 0x{pid:x} rank {self.rank} nranks {self.world} cudaDev {self.rank} "
                     f"nvmlDev {self.gpu} busId {0x1000 + 0x20000 * self.gpu:x} - Init COMPLETE")
        self.emit("\n".join(lines))

    def _collective(self) -> None:
        if self.plan["hangs"]:
            if self.plan["after_hang"] != "recover":
                pcie_sim.mark_stuck(self.gpus, self.plan["after_hang"])
            _hang_forever()
        if self.busy or os.path.exists(os.path.join(pcie_sim.run_dir(), "nccl-hang")):
            _hang_forever()

    def _seconds(self, count: int) -> float:
        size = count * 4
        return size * 2 * (self.world - 1) / self.world / (self.plan["busbw_gbps"] * 1e9)

    def check(self, count: int) -> bool:
        self._collective()
        time.sleep(self._seconds(count))
        return True

    def timed(self, count: int, warmup: int, iters: int) -> float:
        """Takes the modelled time, and reports it: what this machine's scheduler adds to a sleep is not the GPUs'."""
        self._collective()
        time.sleep(self._seconds(count) * (warmup + iters))
        return self._seconds(count) * iters

    def close(self) -> None:
        pass


def open(rank: int, world: int, port: int, timeout_s: float, emit=None) -> SimComm:  # noqa: A001 - the check's API
    return SimComm(rank, world, port, timeout_s, emit)
