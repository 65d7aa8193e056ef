"""sglang_service_extra_flags judged on the controller by SGLang 0.5.10's own parser data
(plugins/module_utils/extra_flags.py over sglang_server_args.py, which the oracle checks against the wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import profiles
from ansible_collections.moefleet.serving.plugins.module_utils.extra_flags import extra_flag_problems, typed

ROOT = Path(__file__).resolve().parents[2]
CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())
PRESTAGED = {"sglang_model_source": "prestaged", "sglang_model_path": "/srv/models/Kimi-K2.6"}
EXAMPLE = yaml.safe_load((ROOT / "inventory" / "example" / "group_vars" / "blackwell" / "main.yml").read_text())


def problems(flags: dict) -> list[str]:
    return extra_flag_problems("sglang_service_extra_flags", flags)


# The issue's operators' spellings: each passed validate.yml and failed hours later at SGLang's start.
@pytest.mark.parametrize(("flags", "sentence"), [
    ({"mem_fraction_static": 1.7}, "mem_fraction_static: 1.7 is not a fraction; give mem_fraction_static a number "
                                   "between 0 and 1 (exclusive)"),
    ({"mem_fraction_static": 0}, "0 is not a fraction"),
    ({"mem_fraction_static": "lots"}, "'lots' is not a number"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype: 'fp8' is not one SGLang 0.5.10 takes for kv_cache_dtype (it would "
                                "fail at start with 'invalid choice'); pick one of: auto, bf16, bfloat16, fp4_e2m1, "
                                "fp8_e4m3, fp8_e5m2."),
    ({"tp_size": "eight"}, "tp_size: tp_size changes the GPU layout, which the profile decides"),
    ({"tp_size": 4}, "tp_size changes the GPU layout"),
    ({"pp_size": 4}, "pp_size changes the GPU layout"),
    ({"tensor_parallel_size": 8}, "tensor_parallel_size changes the GPU layout"),
    ({"ep": 8}, "ep changes the GPU layout"),  # SGLang's shortest spelling of --expert-parallel-size
    ({"enable_dp_attention": True}, "enable_dp_attention changes the GPU layout"),
    ({"nnodes": 2}, "nnodes changes the GPU layout"),
    ({"api_key": "sk-secret"}, "api_key is set by the role; set sglang_service_api_key (in Ansible Vault"),
    ({"port": 31000}, "port is set by the role; set sglang_service_port instead."),
    ({"mem_fraction": 0.8}, "mem_fraction: write the whole name (mem_fraction_static)"),
    ({"mem_fraction_statc": 0.8}, "mem_fraction_statc is not a server argument of SGLang 0.5.10 (it would fail at "
                                  "start with 'unrecognized arguments'). Did you mean mem_fraction_static?"),
    ({"enable-metrics": True}, "is not a server argument of SGLang 0.5.10"),
    ({"enable_mixed_chunk": "yes"}, "enable_mixed_chunk: 'yes' is not true or false; enable_mixed_chunk is a switch"),
    ({"enable_metrics": True}, "enable_metrics is set by the role; set sglang_service_metrics instead."),
    ({"enable_metrics_for_all_schedulers": True}, "enable_metrics_for_all_schedulers is set by the role; set "
                                                  "sglang_service_metrics (it adds this flag with DP attention)"),
    ({"max_running_requests": 0}, "0 is out of range; give max_running_requests a whole number from 1 to 65536."),
    ({"max_running_requests": 1.5}, "1.5 is not a whole number"),
    ({"max_running_requests": True}, "max_running_requests takes a whole number, not true."),
    ({"max_prefill_tokens": "128x"}, "'128x' is not a whole number"),
    ({"cuda_graph_bs": [1, "two"]}, "'two' is not a whole number"),
    ({"tool_call_parser": "kimi_k2"}, "tool_call_parser is set by the role; set sglang_service_tool_call_parser"),
    ({"context_length": 131072}, "context_length is set by the role; set sglang_service_context_length instead."),
    ({"watchdog_timeout": float("inf")}, "is not a number SGLang can take"),
])
def test_a_flag_sglang_would_refuse_or_that_breaks_the_layout_is_refused(flags, sentence):
    found = problems(flags)
    assert len(found) == 1 and found[0].startswith(f"sglang_service_extra_flags/{next(iter(flags))}: "), found
    assert sentence in found[0], found[0]


@pytest.mark.parametrize("flags", [
    EXAMPLE["sglang_service_extra_flags"],  # the example inventory's: trust_remote_code
    {"mem_fraction_static": 0.85, "max_prefill_tokens": 16384, "kv_cache_dtype": "fp8_e4m3"},
    {"max_prefill_tokens": "16k", "max_total_tokens": "1Mi"},  # SGLang's human_readable_int
    {"cuda_graph_bs": [1, 2, 4, 8], "enable_mixed_chunk": True, "disable_radix_cache": False},
    {"json_model_override_args": {"rope_scaling": {"factor": 2}}, "chunked_prefill_size": -1},
    {"disable_cuda_graph": None, "attention_backend": "flashinfer", "watchdog_timeout": 600},
])
def test_flags_sglang_takes_pass(flags):
    assert problems(flags) == []


def test_the_host_check_refuses_a_bad_flag_and_a_bad_port_naming_the_host():
    inputs = PRESTAGED | {"sglang_service_extra_flags": {"kv_cache_dtype": "fp8"}, "sglang_service_port": 99999}
    found = profiles.host_problems("gpu-1", inputs, CATALOG, "tp8")
    assert found[0].startswith("gpu-1: sglang_service_extra_flags/kv_cache_dtype: 'fp8' is not one SGLang")
    assert found[1] == "sglang_service_port is 99999 for gpu-1; set it to a whole number from 1 to 65535."
    assert profiles.host_problems("gpu-1", PRESTAGED | {"sglang_service_port": "8080"}, CATALOG, "tp8") == []


def test_numbers_written_as_text_reach_the_planner_as_numbers():
    assert typed({"mem_fraction_static": "0.85", "context_length": "128k", "max_total_tokens": "1Mi",
                  "kv_cache_dtype": "fp8_e4m3", "unknown_thing": "7"}) == {
        "mem_fraction_static": 0.85, "context_length": 128000, "max_total_tokens": 1048576,
        "kv_cache_dtype": "fp8_e4m3", "unknown_thing": "7"}


def test_lists_and_mappings_are_written_as_sglang_reads_them():
    assert profiles.sglang_args({"flags": {"cuda_graph_bs": [1, 2, 4],
                                           "json_model_override_args": {"rope_scaling": {"factor": 2}}}}) == [
        "--cuda-graph-bs", "1", "2", "4", "--json-model-override-args", '{"rope_scaling":{"factor":2}}']
