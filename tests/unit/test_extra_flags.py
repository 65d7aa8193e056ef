"""sglang_service_extra_flags judged on the controller by the target SGLang release's own parser data
(plugins/module_utils/extra_flags.py over sglang_args_<release>.py, which the oracle checks against each wheel): the
cases below on 0.5.10 (the release the roles pin), then the flags one supported release has and the other has not,
refused for the other, and the catalog's flags spelled for each."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import profiles
from ansible_collections.moefleet.serving.plugins.module_utils.extra_flags import extra_flag_problems, typed

ROOT = Path(__file__).resolve().parents[2]
CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())
PRESTAGED = {"sglang_model_source": "prestaged", "sglang_model_path": "/srv/models/Kimi-K2.6",
             "sglang_package_spec": "sglang[all]==0.5.10"}
EXAMPLE = yaml.safe_load((ROOT / "inventory" / "example" / "group_vars" / "blackwell" / "main.yml").read_text())


def problems(flags: dict, release: str = "0.5.10") -> list[str]:
    return extra_flag_problems("sglang_service_extra_flags", flags, release)


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
                  "kv_cache_dtype": "fp8_e4m3", "unknown_thing": "7"}, "0.5.10") == {
        "mem_fraction_static": 0.85, "context_length": 128000, "max_total_tokens": 1048576,
        "kv_cache_dtype": "fp8_e4m3", "unknown_thing": "7"}


def test_lists_and_mappings_are_written_as_sglang_reads_them():
    assert profiles.sglang_args({"flags": {"cuda_graph_bs": [1, 2, 4],
                                           "json_model_override_args": {"rope_scaling": {"factor": 2}}}},
                              "0.5.10") == [
        "--cuda-graph-bs", "1", "2", "4", "--json-model-override-args", '{"rope_scaling":{"factor":2}}']


# A flag one supported release has and the other has not: 0.5.23 split the CUDA graph settings by phase
# (arg_groups/fields/exec_.py) and dropped --enable-nan-detection; 0.5.10 has neither --cuda-graph-max-bs-decode nor
# --attn-dp-size.
@pytest.mark.parametrize(("flags", "refused_on", "sentence"), [
    ({"cuda_graph_max_bs_prefill": 64}, "0.5.10", "not a server argument of SGLang 0.5.10"),
    ({"cuda_graph_max_bs_decode": 64}, "0.5.10", "cuda_graph_max_bs_decode is not a server argument of SGLang 0.5.10"),
    ({"cuda_graph_backend_prefill": "disabled"}, "0.5.10", "not a server argument of SGLang 0.5.10"),
    ({"enable_nan_detection": True}, "0.5.23", "enable_nan_detection is not a server argument of SGLang 0.5.23"),
    ({"disable_piecewise_cuda_graph": True}, "0.5.23", "is not a server argument of SGLang 0.5.23"),
])
def test_a_flag_of_one_release_is_refused_for_the_other(flags, refused_on, sentence):
    other = {"0.5.10": "0.5.23", "0.5.23": "0.5.10"}[refused_on]
    assert problems(flags, other) == [], problems(flags, other)
    found = problems(flags, refused_on)
    assert len(found) == 1 and sentence in found[0], found
    assert f"It is one of SGLang {other}'s." in found[0], found[0]


def test_a_layout_flag_is_refused_by_any_of_its_spellings_in_either_release():
    for release, flags in (("0.5.10", {"tensor_parallel_size": 4}), ("0.5.23", {"tp_size": 4}),
                           ("0.5.23", {"attn_dp_size": 8}), ("0.5.23", {"ep": 8})):
        found = problems(flags, release)
        assert len(found) == 1 and "changes the GPU layout" in found[0], (release, found)


def test_the_host_check_judges_by_the_release_its_spec_pins():
    flags = {"sglang_service_extra_flags": {"cuda_graph_max_bs_decode": 32}}
    on_0510 = profiles.host_problems("gpu-1", PRESTAGED | flags, CATALOG, "tp8")
    assert len(on_0510) == 1 and "not a server argument of SGLang 0.5.10" in on_0510[0], on_0510
    assert profiles.host_problems("gpu-1", PRESTAGED | flags | {"sglang_package_spec": "sglang==0.5.23"},
                                  CATALOG, "tp8") == []


@pytest.mark.parametrize(("spec", "sentence"), [
    ("sglang[all]==0.5.9", "sglang_package_spec pins SGLang 0.5.9 for gpu-1, which moefleet has no data for (it "
                           "supports 0.5.10, 0.5.23); pin sglang[all]==0.5.10 or sglang[all]==0.5.23, or add it to "
                           "SUPPORTED in plugins/module_utils/sglang_releases.py and run `make oracle-env`"),
    ("sglang[all]>=0.5.10", "sglang_package_spec is 'sglang[all]>=0.5.10' for gpu-1, which pins no one SGLang "
                            "release"),
])
def test_a_release_without_data_is_refused_naming_the_supported_ones_and_how_to_add_one(spec, sentence):
    found = profiles.host_problems("gpu-1", PRESTAGED | {"sglang_package_spec": spec,
                                                        "sglang_service_extra_flags": {"kv_cache_dtype": "fp8"}},
                                   CATALOG, "tp8")
    assert len(found) == 1 and sentence in found[0], found  # the flags are not judged against a guess


def test_the_catalogs_flags_are_spelled_for_the_target_release():
    ep8dpa = CATALOG["profiles"]["ep8dpa"]
    assert "--cuda-graph-max-bs" in profiles.sglang_args(ep8dpa, "0.5.10")
    on_0523 = profiles.sglang_args(ep8dpa, "0.5.23")
    assert "--cuda-graph-max-bs-decode" in on_0523 and "--cuda-graph-max-bs" not in on_0523, on_0523
    assert on_0523[on_0523.index("--cuda-graph-max-bs-decode") + 1] == str(ep8dpa["flags"]["cuda_graph_max_bs"])


def test_dp_attention_is_written_as_0_5_23_sizes_it():
    """0.5.23 rewrites --dp-size N --enable-dp-attention to attn_dp_size=N, dp_size=1 (with a deprecation warning);
    moefleet writes --attn-dp-size there, and 0.5.10's form on 0.5.10."""
    flags = CATALOG["profiles"]["ep8dpa"]["flags"]
    assert flags["enable_dp_attention"] is True and flags["dp_size"] == 8
    on_0510 = profiles.sglang_args({"flags": flags}, "0.5.10")
    on_0523 = profiles.sglang_args({"flags": flags}, "0.5.23")
    assert {"--dp-size", "--enable-dp-attention"} <= set(on_0510), on_0510
    assert "--attn-dp-size" not in on_0510
    assert not {"--dp-size", "--enable-dp-attention"} & set(on_0523), on_0523
    assert on_0523[on_0523.index("--attn-dp-size") + 1] == "8", on_0523
    plain = profiles.sglang_args({"flags": {"tp_size": 8, "dp_size": 2, "enable_dp_attention": False}}, "0.5.23")
    assert plain == ["--tp-size", "8", "--dp-size", "2"], plain  # replicas, not attention DP


@pytest.mark.parametrize(("inputs", "sentences"), [
    ({"sglang_package_spec": "sglang==0.5.23", "cuda_toolkit_version": "12.9", "nvidia_driver_branch": 580},
     ["SGLang 0.5.23 is built for CUDA 13 (cuda-python>=13.0, torch 2.14.1 and cu13 kernels) but gpu-1 sets "
      "cuda_toolkit_version '12.9': leave cuda_toolkit_version unset (it follows the pinned release: 13.0) or set it "
      "to a CUDA 13 release, or pin sglang[all]==0.5.10, which this host's stack runs."]),
    ({"sglang_package_spec": "sglang==0.5.23", "cuda_toolkit_version": "13.0", "nvidia_driver_branch": 575},
     ["SGLang 0.5.23 needs CUDA 13, which needs NVIDIA driver branch 580 or newer, but gpu-1 sets "
      "nvidia_driver_branch 575: set it to 580 or newer."]),
    ({"sglang_package_spec": "sglang==0.5.10", "cuda_toolkit_version": "13.0", "nvidia_driver_branch": 580},
     ["SGLang 0.5.10 is built for CUDA 12 (cuda-python==12.9 and torch 2.9.1) but gpu-1 sets cuda_toolkit_version "
      "'13.0': leave cuda_toolkit_version unset (it follows the pinned release: 12.9) or set it to a CUDA 12 release, "
      "or pin sglang[all]==0.5.23, which this host's stack runs."]),
    ({"sglang_package_spec": "sglang==0.5.23", "cuda_toolkit_version": "13.0", "nvidia_driver_branch": 580}, []),
    ({"sglang_package_spec": "sglang==0.5.10", "cuda_toolkit_version": "12.9", "nvidia_driver_branch": 580}, []),
])
def test_the_release_is_paired_with_the_hosts_cuda_and_driver_on_the_controller(inputs, sentences):
    assert profiles.host_problems("gpu-1", PRESTAGED | inputs, CATALOG, "tp8") == sentences


def test_a_flag_0_5_23_renamed_is_taken_under_moefleets_name_and_written_under_the_new_one():
    """An operator's cuda_graph_max_bs (moefleet's vocabulary, 0.5.10's name) keeps working on 0.5.23: it is judged
    as cuda_graph_max_bs_decode and written so (the start of two of 0.5.23's flags, it would be ambiguous as it is).
    A prefix that is not such a name stays refused as ambiguous."""
    assert problems({"cuda_graph_max_bs": 64}, "0.5.23") == []
    assert problems({"cuda_graph_max_bs": "many"}, "0.5.23")[0].endswith(
        "'many' is not a whole number; give cuda_graph_max_bs_decode a whole number from 1 to 4096.")
    assert profiles.sglang_args({"flags": {"cuda_graph_bs": [1, 2, 4]}}, "0.5.23") == [
        "--cuda-graph-bs-decode", "1", "2", "4"]
    found = problems({"cuda_graph_max": 64}, "0.5.23")
    assert len(found) == 1 and "but the start of 3 (cuda_graph_max_bs_decode, cuda_graph_max_bs_prefill" in found[0]
