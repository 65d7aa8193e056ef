"""Known GPUs: nvidia-smi's memory.total (MiB) and PyTorch's total capacity (GiB) for each, and the one
conversion between the two that the CLI (``moefleet plan --gpu``/``--gpu-memory-mib``) and the preflight
(the ``moefleet.serving.plan`` filter, fed nvidia-smi's figure) both use.

The two figures differ by what the driver reserves on the board (nvidia-smi's ``memory.reserved``), which
is a measured property of each GPU and driver, not a ratio: 97,887 MiB on an RTX PRO 6000 is 95.59 GiB,
PyTorch reports 94.97 GiB (docs/facts.md §5; the simulator models it the same way, sim/gpu/README.md:
``memory.reserved`` = total − PyTorch's figure, 638 MiB). So each GPU's pair is data here, with its source,
and a memory.total this table does not know is refused rather than guessed (``UnknownGpu``).

Sources (public logs; PyTorch's figure is the "GPU N has a total capacity of X GiB" of its OOM message,
nvidia-smi's the ``used / total`` column of its table):

- RTX PRO 6000 Blackwell: docs/facts.md §5 (97,887 MiB; 94.97 GiB), measured on the field host of §1.
  Public nvidia-smi output prints 97,887 MiB for the Server Edition and the Max-Q Workstation Edition by name
  (and for truncated "RTX PRO 6000 Blac..." rows at 300 W and 600 W); public OOM messages on these boards print
  94.97 GiB but none we found names the edition, so the Workstation Edition's PyTorch figure is the Server
  Edition's, taken as equal because memory.total is.
- H100 80GB HBM3 (SXM): nvidia-smi 81,559 MiB (public nvidia-smi tables, "NVIDIA H100 80GB HBM3"); PyTorch
  79.21 GiB (a public multi-model benchmark report's OOM messages on 8xH100 HBM3; the same report shows
  79.18 GiB on a 1xH100 machine, another driver: the figure moves by a few hundredths with the driver).
- H200 (SXM, 141 GB): nvidia-smi 143,771 MiB (public nvidia-smi tables, "NVIDIA H200"); PyTorch 139.80 GiB
  (the same benchmark report on 8xH200; other public logs agree).
- B200: nvidia-smi 183,359 MiB (public nvidia-smi tables, "NVIDIA B200"); PyTorch 178.35 GiB (public OOM
  logs on B200 nodes; the benchmark report above shows 178.36 on its driver).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

MIB_PER_GIB = 1024


class UnknownGpu(ValueError):
    """A GPU name or memory.total this table does not know; the message says what to give instead."""


@dataclass(frozen=True)
class KnownGpu:
    name: str  # as nvidia-smi's name column prints it, without the "NVIDIA " prefix
    aliases: tuple[str, ...]  # what operators call it
    smi_total_mib: int  # nvidia-smi --query-gpu=memory.total
    torch_total_gib: float  # torch.cuda.get_device_properties(i).total_memory / 2**30, two decimals

    @property
    def reserved_mib(self) -> float:
        """What the driver keeps out of PyTorch's reach (nvidia-smi's memory.reserved)."""
        return round(self.smi_total_mib - self.torch_total_gib * MIB_PER_GIB, 1)


KNOWN_GPUS: tuple[KnownGpu, ...] = (
    KnownGpu("RTX PRO 6000 Blackwell Server Edition", ("RTX PRO 6000", "RTX PRO 6000 Server"), 97887, 94.97),
    KnownGpu(
        "RTX PRO 6000 Blackwell Workstation Edition",
        ("RTX PRO 6000 Workstation", "RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX PRO 6000 Max-Q"),
        97887,
        94.97,
    ),
    KnownGpu("H100 80GB HBM3", ("H100", "H100 80GB", "H100 SXM"), 81559, 79.21),
    KnownGpu("H200", ("H200 SXM", "H200 141GB"), 143771, 139.80),
    KnownGpu("B200", ("B200 180GB",), 183359, 178.35),
)


def _key(text: str) -> str:
    text = re.sub(r"^\s*nvidia\s+", "", str(text), flags=re.IGNORECASE)
    return re.sub(r"[\s_-]+", " ", text).strip().lower()


def names() -> list[str]:
    """Every name and alias the table answers to."""
    return [n for gpu in KNOWN_GPUS for n in (gpu.name, *gpu.aliases)]


def find_gpu(name: str) -> KnownGpu:
    """The known GPU called ``name`` (nvidia-smi's name, with or without "NVIDIA ", or an alias; case and
    spacing ignored); an unknown name raises UnknownGpu naming the closest ones."""
    wanted = _key(name)
    for gpu in KNOWN_GPUS:
        if wanted in {_key(n) for n in (gpu.name, *gpu.aliases)}:
            return gpu
    close = difflib.get_close_matches(wanted, [_key(n) for n in names()], n=3, cutoff=0.8)
    by_key = {_key(n): n for n in names()}
    hint = f"Did you mean {' or '.join(repr(by_key[c]) for c in close)}? " if close else ""
    raise UnknownGpu(
        f"Unknown GPU {name!r}. {hint}Known: {', '.join(repr(g.name) for g in KNOWN_GPUS)}; for another GPU "
        "give nvidia-smi's memory.total and PyTorch's capacity yourself (--gpu-memory-mib and --gpu-memory-gib)."
    )


def gpu_for_smi_total(smi_total_mib: float) -> KnownGpu | None:
    """The first known GPU whose nvidia-smi memory.total is ``smi_total_mib`` (None when none is)."""
    return next((g for g in KNOWN_GPUS if g.smi_total_mib == int(round(float(smi_total_mib)))), None)


def torch_capacity_gib(smi_total_mib: float) -> float:
    """PyTorch's total capacity (GiB) of a GPU whose nvidia-smi memory.total is ``smi_total_mib``: the
    table's measured figure. A memory.total the table does not know raises UnknownGpu: the driver's
    reservation cannot be computed from it."""
    gpu = gpu_for_smi_total(smi_total_mib)
    if gpu is None:
        known = ", ".join(f"{g.smi_total_mib} ({g.name})" for g in KNOWN_GPUS)
        raise UnknownGpu(
            f"nvidia-smi's memory.total {float(smi_total_mib):g} MiB is not a GPU this table knows ({known}): "
            "PyTorch's capacity is memory.total less what the driver reserves, which differs per GPU; give "
            "PyTorch's figure too (python3 -c 'import torch; print(torch.cuda.get_device_properties(0)"
            ".total_memory / 2**30)'), or add the GPU to plugins/module_utils/gpu_memory.py."
        )
    return gpu.torch_total_gib
