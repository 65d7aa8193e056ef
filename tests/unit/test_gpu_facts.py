"""nvidia-smi CSV parsing."""

from __future__ import annotations

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils.gpu_facts import GpuFactsError, parse_gpu_csv, summarize

EIGHT = "".join(
    f"{i}, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, {3 if i else 512}, 580.95.05, 12.0\n"
    for i in range(8)
)


def test_eight_rtx_pro_6000():
    facts = summarize(parse_gpu_csv(EIGHT))
    assert facts["count"] == 8
    assert facts["memory_total_mib"] == 97887
    assert facts["memory_used_mib_max"] == 512
    assert (facts["driver_branch"], facts["compute_cap"], facts["uniform"]) == (580, "12.0", True)


def test_units_are_accepted():
    (gpu,) = parse_gpu_csv("0, NVIDIA H100, 81559 MiB, 0 MiB, 570.1, 9.0\n")
    assert gpu["memory_total_mib"] == 81559


def test_wrong_shape_is_a_sentence():
    with pytest.raises(GpuFactsError, match="line 1 has 3 fields, expected 6"):
        parse_gpu_csv("0, NVIDIA, 97887\n")
    with pytest.raises(GpuFactsError, match="no GPUs"):
        summarize(parse_gpu_csv("\n"))
