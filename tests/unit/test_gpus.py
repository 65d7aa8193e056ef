"""The known-GPU table (plugins/module_utils/gpus.py): names resolve, figures are consistent, and nvidia-smi's
memory.total converts to PyTorch's capacity only where the table knows the GPU."""

from __future__ import annotations

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import gpus


def test_every_name_and_alias_resolves_to_one_gpu():
    keys = [gpus._key(name) for name in gpus.names()]
    assert len(keys) == len(set(keys)), "a name or alias appears twice"
    for gpu in gpus.KNOWN_GPUS:
        for name in (gpu.name, *gpu.aliases, "NVIDIA " + gpu.name, gpu.name.upper()):
            assert gpus.find_gpu(name) is gpu


def test_the_driver_reserves_less_than_a_gib_and_more_than_nothing():
    # nvidia-smi's memory.total less PyTorch's capacity: 638 MiB on an RTX PRO 6000 (sim/gpu/README.md)
    assert gpus.find_gpu("RTX PRO 6000").reserved_mib == pytest.approx(638, abs=0.5)
    for gpu in gpus.KNOWN_GPUS:
        assert 0 < gpu.reserved_mib < 1024, gpu.name


def test_memory_total_converts_through_the_table():
    assert gpus.torch_capacity_gib(97887) == 94.97
    assert gpus.torch_capacity_gib("143771") == 139.80
    with pytest.raises(gpus.UnknownGpu, match="97888 MiB is not a GPU this table knows"):
        gpus.torch_capacity_gib(97888)


def test_an_unknown_name_gets_the_close_ones_only():
    with pytest.raises(gpus.UnknownGpu, match=r"Did you mean 'H200'"):
        gpus.find_gpu("H2000")
    with pytest.raises(gpus.UnknownGpu) as exc:
        gpus.find_gpu("A100")
    assert "Did you mean" not in str(exc.value) and "'H100 80GB HBM3'" in str(exc.value)
