"""The shipped catalog, its schema, and the catalog logic's sentences."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import planner, profiles
from ansible_collections.moefleet.serving.plugins.module_utils.profiles import ProfileError

ROOT = Path(__file__).resolve().parents[2]
CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())
SCHEMA = json.loads((ROOT / "schemas" / "profile_catalog.schema.json").read_text())
K26 = json.loads((ROOT / "tests" / "data" / "model-configs" / "kimi-k2.6-config.json").read_text())


def test_schema_is_valid_draft_2020_12():
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_shipped_catalog_validates():
    assert profiles.schema_errors(CATALOG, SCHEMA) == []
    assert profiles.catalog_problems(CATALOG) == []
    profiles.validate_catalog(CATALOG, SCHEMA)


@pytest.mark.parametrize("name", profiles.profile_names(CATALOG))
def test_every_shipped_profile_validates_on_its_own(name):
    one = {**CATALOG, "profiles": {name: {**CATALOG["profiles"][name], "fallback": None}}}
    assert profiles.schema_errors(one, SCHEMA) == []
    assert profiles.flag_problems(name, CATALOG["profiles"][name]) == []


def test_required_profiles_ship_with_sglang_semantics():
    parallel = ("tp_size", "ep_size", "pp_size", "dp_size")
    flags = {name: {k: v for k, v in p["flags"].items() if k in parallel} for name, p in CATALOG["profiles"].items()}
    assert flags["tp8"] == {"tp_size": 8}
    assert flags["ep8"] == {"tp_size": 8, "ep_size": 8}
    assert flags["tp2ep4"] == {"tp_size": 8, "ep_size": 4}
    assert flags["tp4ep2"] == {"tp_size": 8, "ep_size": 2}
    assert flags["pp8"]["pp_size"] == 8
    assert (flags["tp4pp2"]["tp_size"], flags["tp4pp2"]["pp_size"]) == (4, 2)
    assert (flags["tp2pp4"]["tp_size"], flags["tp2pp4"]["pp_size"]) == (2, 4)
    assert CATALOG["profiles"]["ep8dpa"]["flags"]["enable_dp_attention"] is True


# nvidia-smi's memory.total of an RTX PRO 6000, from which SGLang sizes its default mem fraction.
SMI_MIB = 97887
RELEASE = "0.5.10"  # the arithmetic of the release the roles pin


def _plans(smi_memory_mib=SMI_MIB):
    layouts = {n: p["flags"] for n, p in CATALOG["profiles"].items()}
    return dict(planner.plan_many(K26, 8, 94.97, layouts, smi_memory_mib=smi_memory_mib,
                                     release=RELEASE))


def test_a_profile_sets_mem_fraction_exactly_where_sglangs_default_leaves_too_few_tokens():
    # SGLang's default for K2.6 (about 0.771, its vision tower taking 9%) holds fewer than 32,768 KV tokens
    # for every layout here; each profile then carries the fraction the planner chooses, nothing else.
    for name, profile in CATALOG["profiles"].items():
        flags = {k: v for k, v in profile["flags"].items() if k != "mem_fraction_static"}
        default = planner.plan(K26, 8, 94.97, flags, smi_memory_mib=SMI_MIB, release=RELEASE)
        assert default.sglang_default_mem_fraction_static == pytest.approx(0.771, abs=0.007), name
        assert default.verdict in ("oom", "tight"), (name, default.reason)
        if default.suggested_mem_fraction_static is None:  # nothing within SGLang's reserve holds the weights
            assert profile["flags"]["mem_fraction_static"] > default.max_mem_fraction_static, name
        else:
            assert profile["flags"]["mem_fraction_static"] == default.suggested_mem_fraction_static, name


def test_profiles_with_a_chosen_fraction_fit_and_keep_sglangs_reserve():
    for name, result in _plans().items():
        if result.layout.mem_fraction_static <= result.max_mem_fraction_static:
            assert result.verdict == "fits", (name, result.reason)
            assert "set by the profile" in result.reason and "would leave" in result.reason, name


@pytest.mark.parametrize("smi_memory_mib", [SMI_MIB, None])
def test_every_shipped_profile_fits_k26_on_eight_rtx_pro_6000(smi_memory_mib):
    for name, result in _plans(smi_memory_mib).items():
        assert result.verdict in ("fits", "tight"), (name, result.reason)
        assert result.gpus_used == CATALOG["profiles"][name]["gpus"] == 8


def test_every_ladder_ends_in_the_layout_with_the_most_headroom():
    plans = _plans()
    most = max(plans, key=lambda n: planner.headroom_bytes(plans[n]))
    for name in CATALOG["profiles"]:
        ladder = profiles.fallback_ladder(CATALOG, name)
        assert ladder[-1] == most, (name, ladder)
        # each step down the ladder never loses weight-load margin
        weights = [plans[step].weights_bytes_per_gpu for step in ladder]
        assert weights == sorted(weights, reverse=True), (name, ladder)


def test_merge_adds_and_overrides_profiles():
    extra = {"mine": {**CATALOG["profiles"]["tp8"], "description": "My own TP8 with FP8 KV cache."}}
    extra["mine"]["flags"] = {"tp_size": 8, "kv_cache_dtype": "fp8_e4m3"}
    merged = profiles.merge_catalog(CATALOG, extra)
    assert "mine" in merged["profiles"] and "tp8" in merged["profiles"]
    profiles.validate_catalog(merged, SCHEMA)
    over = profiles.merge_catalog(CATALOG, {"profiles": {"tp8": {**CATALOG["profiles"]["tp8"], "gpus": 4}}})
    assert over["profiles"]["tp8"]["gpus"] == 4
    assert CATALOG["profiles"]["tp8"]["gpus"] == 8  # the shipped data is not mutated


def test_merge_refuses_non_mapping():
    with pytest.raises(ProfileError, match="mapping of profile name"):
        profiles.merge_catalog(CATALOG, ["tp8"])


def test_unknown_profile_lists_valid_names():
    with pytest.raises(ProfileError) as err:
        profiles.resolve_profile(CATALOG, "nonsense")
    assert str(err.value) == (
        "Unknown profile 'nonsense'; valid profiles: tp8, ep8, tp2ep4, tp4ep2, pp8, tp2pp4, tp4pp2, ep8dpa."
    )


def test_mistyped_profile_says_what_a_name_is():
    with pytest.raises(ProfileError, match="must be a name"):
        profiles.resolve_profile(CATALOG, 8)


def test_schema_errors_are_path_and_message():
    bad = copy.deepcopy(CATALOG)
    bad["profiles"]["tp8"]["flags"]["tp_size"] = "8"
    bad["profiles"]["tp8"]["flags"]["tensor_parallel"] = 8
    del bad["profiles"]["ep8"]["gpus"]
    errors = profiles.schema_errors(bad, SCHEMA)
    assert "profiles/tp8/flags/tp_size: '8' is not of type 'integer'" in errors
    assert any(e.startswith("profiles/tp8/flags: Additional properties") for e in errors)
    assert "profiles/ep8: 'gpus' is a required property" in errors
    with pytest.raises(ProfileError) as err:
        profiles.validate_catalog(bad, SCHEMA)
    assert str(err.value).startswith("The profile catalog is not valid:\nprofiles/")


def test_flag_invariants_are_sentences():
    bad = copy.deepcopy(CATALOG)
    bad["profiles"]["tp8"]["flags"] = {"tp_size": 8, "ep_size": 3}
    bad["profiles"]["ep8"]["flags"] = {"tp_size": 4, "ep_size": 2}
    problems = profiles.catalog_problems(bad)
    assert any("profiles/tp8/flags: --ep-size 3 does not divide --tp-size 8" in p for p in problems)
    assert any("profiles/ep8/gpus: says 8 but --tp-size 4 --ep-size 2 starts 4 GPUs" in p for p in problems)


def test_unknown_nccl_set_and_fallback_are_named():
    bad = copy.deepcopy(CATALOG)
    bad["profiles"]["tp8"]["nccl"] = "infiniband"
    bad["profiles"]["pp8"]["fallback"] = "tp16"
    problems = profiles.catalog_problems(bad)
    assert "profiles/tp8/nccl: 'infiniband' is not an NCCL set; known sets: pcie_p2p, pcie_shm." in problems
    assert "profiles/pp8/fallback: 'tp16' is not a profile in the catalog." in problems


def test_fallback_cycle_is_a_sentence():
    bad = copy.deepcopy(CATALOG)
    bad["profiles"]["ep8"]["fallback"] = "tp8"
    with pytest.raises(ProfileError) as err:
        profiles.fallback_ladder(bad, "tp8")
    assert str(err.value) == "The fallback ladder loops: tp8 -> ep8 -> tp8; end it with fallback: null."
    assert any("loops" in p for p in profiles.catalog_problems(bad))


def test_ladders_follow_fallbacks_to_null():
    assert profiles.fallback_ladder(CATALOG, "pp8") == ["pp8", "tp2pp4", "tp4pp2", "ep8"]
    assert profiles.fallback_ladder(CATALOG, "ep8") == ["ep8"]


def test_sglang_args_come_from_profile_data_in_order():
    assert profiles.sglang_args(CATALOG["profiles"]["tp2ep4"], "0.5.10") == [
        "--tp-size", "8", "--ep-size", "4", "--mem-fraction-static", "0.79",
    ]  # fmt: skip
    assert profiles.sglang_args(CATALOG["profiles"]["ep8dpa"], "0.5.10") == [
        "--tp-size", "8", "--ep-size", "8", "--dp-size", "8", "--enable-dp-attention",
        "--mem-fraction-static", "0.92", "--cuda-graph-max-bs", "64",
    ]  # fmt: skip
    assert profiles.sglang_args({"flags": {"tp_size": 2, "enable_dp_attention": False, "x": None}}, "0.5.10") == [
        "--tp-size",
        "2",
    ]


def test_extra_var_of_wrong_type_says_how_to_pass_it():
    assert profiles.extra_var_problem("sglang_gpus", 8, int) is None
    assert profiles.extra_var_problem("sglang_gpus", "8", int) == (
        "sglang_gpus must be a whole number, not str '8'; -e sglang_gpus=... always passes a string, "
        "so pass it as JSON: -e '{\"sglang_gpus\": 8}'."
    )
    assert profiles.extra_var_problem("flag", True, int) is not None  # a bool is not a count


def test_catalog_descriptions_quote_what_the_planner_computes():
    """Every "N GiB per GPU" / "at N GiB" / "N GiB KV pool" in a description is the planner's figure for
    that profile on 8x 94.97 GiB (so a planner change that moves them makes the catalog say so)."""
    import re

    quoted = 0
    for name, prof in CATALOG["profiles"].items():
        result = planner.plan(K26, 8, 94.97, prof["flags"], catalog=CATALOG["profiles"], release=RELEASE)
        text = " ".join(prof["description"].split())
        for value in re.findall(r"([0-9.]+) GiB (?:of weights )?per GPU|at ([0-9.]+) GiB", text):
            figure = float(value[0] or value[1])
            assert figure == pytest.approx(result.weights_gib_per_gpu, abs=0.051), (name, text)
            quoted += 1
        for value in re.findall(r"([0-9.]+) GiB KV pool", text):
            assert float(value) == pytest.approx(result.kv_pool_bytes / planner.GIB, abs=0.051), (name, text)
            quoted += 1
    assert quoted >= len(CATALOG["profiles"])


@pytest.mark.parametrize("dtype", ["fp8", "float16"])
def test_a_kv_cache_dtype_sglang_rejects_is_refused_naming_the_valid_ones(dtype):
    # SGLang 0.5.10's --kv-cache-dtype choices (server_args.py): auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1.
    valid = "auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1"
    problems = profiles.flag_problems("mine", {"flags": {"tp_size": 8, "kv_cache_dtype": dtype}, "gpus": 8})
    assert problems == [
        f"profiles/mine/flags: --kv-cache-dtype {dtype!r} is not one SGLang accepts; use one of {valid}."
    ]
    extra = {"mine": {**CATALOG["profiles"]["tp8"], "flags": {"tp_size": 8, "kv_cache_dtype": dtype}}}
    with pytest.raises(ProfileError, match="fp4_e2m1"):
        profiles.validate_catalog(profiles.merge_catalog(CATALOG, extra), SCHEMA)


@pytest.mark.parametrize("dtype", ["fp8_e5m2", "fp4_e2m1", "bf16"])
def test_every_kv_cache_dtype_sglang_accepts_passes_validation(dtype):
    extra = {"mine": {**CATALOG["profiles"]["tp8"], "flags": {"tp_size": 8, "kv_cache_dtype": dtype}}}
    profiles.validate_catalog(profiles.merge_catalog(CATALOG, extra), SCHEMA)
