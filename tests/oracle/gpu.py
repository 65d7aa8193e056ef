"""GPU probing for the oracle: what SGLang 0.5.10 reads from an 8 x RTX PRO 6000 Blackwell host.

The only stand-in for hardware in the oracle. SGLang asks PyTorch (``torch.cuda.*``, ``torch.version.cuda``)
whether it runs on CUDA and what the GPUs are, and ``nvidia-smi --query-gpu=memory.total`` how big they are
(utils/common.py ``get_nvgpu_memory_capacity``, which ``ServerArgs.__post_init__`` reaches through
``get_device_memory_capacity``). ``install()`` answers those questions with the host's figures; SGLang's own
code does the rest. Figures: nvidia-smi reports 97,887 MiB per card, PyTorch 94.97 GiB (``total_memory``),
compute capability 12.0 (sm_120), 188 SMs.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from types import SimpleNamespace

GPU_COUNT = 8
NVIDIA_SMI_MIB = 97887
TORCH_TOTAL_BYTES = int(94.97 * (1 << 30))
CAPABILITY = (12, 0)
NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
CUDA_VERSION = "12.8"  # the product installs PyTorch from the cu128 index

# Answers exactly the query SGLang makes; anything else fails like an unknown option does, so an
# unexpected probe shows up as SGLang's own fallback warning instead of a silent made-up figure.
_NVIDIA_SMI = f"""#!/bin/sh
if [ "$*" = "--query-gpu=memory.total --format=csv,noheader,nounits" ]; then
  i=0; while [ $i -lt {GPU_COUNT} ]; do echo {NVIDIA_SMI_MIB}; i=$((i+1)); done; exit 0
fi
echo "oracle nvidia-smi: only --query-gpu=memory.total --format=csv,noheader,nounits is known, not: $*" >&2
exit 2
"""


def install() -> None:
    """Put the host's answers in place, and forget what SGLang's probes remembered from before."""
    import torch

    bin_dir = Path(tempfile.mkdtemp(prefix="oracle-gpu-"))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(_NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"

    props = SimpleNamespace(name=NAME, major=CAPABILITY[0], minor=CAPABILITY[1], total_memory=TORCH_TOTAL_BYTES,
                            multi_processor_count=188, is_integrated=False, uuid="GPU-oracle")
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: GPU_COUNT
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: CAPABILITY
    cuda.get_device_name = lambda device=None: NAME
    cuda.get_device_properties = lambda device=None: props
    cuda.mem_get_info = lambda device=None: (TORCH_TOTAL_BYTES, TORCH_TOTAL_BYTES)
    torch.version.cuda = CUDA_VERSION
    # SGLang caches its probes (is_cuda, is_sm100_supported, ...: functools.lru_cache in utils/common.py).
    from sglang.srt.utils import common

    for value in vars(common).values():
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()
