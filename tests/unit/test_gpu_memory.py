"""The known-GPU table (plugins/module_utils/gpu_memory.py): names resolve, figures are consistent, and nvidia-smi's
memory.total converts to PyTorch's capacity only where the table knows the GPU."""

from __future__ import annotations

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import gpu_memory


def test_every_name_and_alias_resolves_to_one_gpu():
    keys = [gpu_memory._key(name) for name in gpu_memory.names()]
    assert len(keys) == len(set(keys)), "a name or alias appears twice"
    for gpu in gpu_memory.KNOWN_GPUS:
        for name in (gpu.name, *gpu.aliases, "NVIDIA " + gpu.name, gpu.name.upper()):
            assert gpu_memory.find_gpu(name) is gpu


def test_the_driver_reserves_less_than_a_gib_and_more_than_nothing():
    # nvidia-smi's memory.total less PyTorch's capacity: 638 MiB on an RTX PRO 6000 (sim/gpu/README.md)
    assert gpu_memory.find_gpu("RTX PRO 6000").reserved_mib == pytest.approx(638, abs=0.5)
    for gpu in gpu_memory.KNOWN_GPUS:
        assert 0 < gpu.reserved_mib < 1024, gpu.name


def test_memory_total_converts_through_the_table():
    assert gpu_memory.torch_capacity_gib(97887) == 94.97
    assert gpu_memory.torch_capacity_gib("143771") == 139.80
    with pytest.raises(gpu_memory.UnknownGpu, match="97888 MiB is not a GPU this table knows"):
        gpu_memory.torch_capacity_gib(97888)


def test_an_unknown_name_gets_the_close_ones_only():
    with pytest.raises(gpu_memory.UnknownGpu, match=r"Did you mean 'H200'"):
        gpu_memory.find_gpu("H2000")
    with pytest.raises(gpu_memory.UnknownGpu) as exc:
        gpu_memory.find_gpu("A100")
    assert "Did you mean" not in str(exc.value) and "'H100 80GB HBM3'" in str(exc.value)
