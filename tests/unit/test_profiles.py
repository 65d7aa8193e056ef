"""The shipped catalog, its schema, and the catalog logic's sentences."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from moefleet.logic import planner, profiles
from moefleet.logic.profiles import ProfileError

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
    flags = {name: p["flags"] for name, p in CATALOG["profiles"].items()}
    assert flags["tp8"] == {"tp_size": 8}
    assert flags["ep8"] == {"tp_size": 8, "ep_size": 8}
    assert flags["tp2ep4"] == {"tp_size": 8, "ep_size": 4}
    assert flags["tp4ep2"] == {"tp_size": 8, "ep_size": 2}
    assert flags["pp8"]["pp_size"] == 8
    assert (flags["tp4pp2"]["tp_size"], flags["tp4pp2"]["pp_size"]) == (4, 2)
    assert (flags["tp2pp4"]["tp_size"], flags["tp2pp4"]["pp_size"]) == (2, 4)
    assert flags["ep8dpa"]["enable_dp_attention"] is True


def _plans():
    return dict(planner.plan_many(K26, 8, 94.97, {n: p["flags"] for n, p in CATALOG["profiles"].items()}))


def test_every_shipped_profile_fits_k26_on_eight_rtx_pro_6000():
    for name, result in _plans().items():
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
    assert profiles.sglang_args(CATALOG["profiles"]["tp2ep4"]) == ["--tp-size", "8", "--ep-size", "4"]
    assert profiles.sglang_args(CATALOG["profiles"]["ep8dpa"]) == [
        "--tp-size", "8", "--ep-size", "8", "--dp-size", "8", "--enable-dp-attention",
        "--mem-fraction-static", "0.92", "--cuda-graph-max-bs", "64",
    ]  # fmt: skip
    assert profiles.sglang_args({"flags": {"tp_size": 2, "enable_dp_attention": False, "x": None}}) == [
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
        result = planner.plan(K26, 8, 94.97, prof["flags"], catalog=CATALOG["profiles"])
        text = " ".join(prof["description"].split())
        for value in re.findall(r"([0-9.]+) GiB (?:of weights )?per GPU|at ([0-9.]+) GiB", text):
            figure = float(value[0] or value[1])
            assert figure == pytest.approx(result.weights_gib_per_gpu, abs=0.051), (name, text)
            quoted += 1
        for value in re.findall(r"([0-9.]+) GiB KV pool", text):
            assert float(value) == pytest.approx(result.kv_pool_bytes / planner.GIB, abs=0.051), (name, text)
            quoted += 1
    assert quoted >= len(CATALOG["profiles"])
