"""The controller's checks of each host's inputs, profile names, flag bounds and where catalog errors were
written (plugins/module_utils/profiles.py), as the resolve_profiles module runs them."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import profiles
from ansible_collections.moefleet.serving.plugins.module_utils.profiles import ProfileError

ROOT = Path(__file__).resolve().parents[2]
CATALOG_TEXT = (ROOT / "profiles" / "catalog.yml").read_text()
CATALOG = yaml.safe_load(CATALOG_TEXT)
SCHEMA = json.loads((ROOT / "schemas" / "profile_catalog.schema.json").read_text())
MINE = {"description": "An operator profile for this test.", "gpus": 8, "nccl": "pcie_p2p", "fallback": None}
SPEC = {"sglang_package_spec": "sglang[all]==0.5.10"}  # validate.yml passes the fleet's (roles/moefleet_defaults)
PRESTAGED = {"sglang_model_source": "prestaged", "sglang_model_path": "/srv/models/Kimi-K2.6", **SPEC}
REVISION = "0123456789abcdef0123456789abcdef01234567"
HUB = {"sglang_model_source": "huggingface", "sglang_model_path": "/srv/models/Kimi-K2.6",
       "sglang_model_repo": "moonshotai/Kimi-K2.6", "sglang_model_revision": REVISION, **SPEC}


def with_extra(extra):
    return profiles.merge_catalog(CATALOG, extra)


def test_a_profile_name_with_a_trailing_newline_is_refused():
    # The schema's pattern ends in "$", which Python's re also matches before a final newline.
    catalog = with_extra({"mine\n": dict(MINE, flags={"tp_size": 8})})
    assert profiles.schema_errors(catalog, SCHEMA) == []
    with pytest.raises(ProfileError) as err:
        profiles.validate_catalog(catalog, SCHEMA)
    assert "profiles/mine\\n: 'mine\\n' is not a usable name; rename it" in str(err.value)


@pytest.mark.parametrize("name", ["My Profile", "tp8;rm", "tp8\tx", "x" * 41])
def test_odd_profile_names_are_refused(name):
    assert profiles.name_problem("profiles", name) is not None
    assert profiles.name_problem("profiles", "tp2ep4") is None


@pytest.mark.parametrize(
    ("flag", "value", "sentence"),
    [
        ("context_length", 10**20, "profiles/mine/flags/context_length: 100000000000000000000 is out of range; "
                                   "give a whole number from 1 to 10485760."),
        ("cuda_graph_max_bs", 2**40, "give a whole number from 1 to 4096"),
        ("tp_size", 8.0, "profiles/mine/flags/tp_size: write a whole number from 1 to 64, not 8.0."),
        ("mem_fraction_static", math.nan, "profiles/mine/flags/mem_fraction_static: nan is not a number SGLang "
                                          "can take; give a finite value."),
    ],
)
def test_flag_bounds_are_sentences(flag, value, sentence):
    flags = {"tp_size": 8, flag: value}
    with pytest.raises(ProfileError, match="catalog is not valid") as err:
        profiles.validate_catalog(with_extra({"mine": dict(MINE, flags=flags)}), SCHEMA)
    assert sentence in str(err.value)


def _host(inputs, profile="tp8", catalog=CATALOG):
    return profiles.host_problems("gpu-1", {**PRESTAGED, **inputs}, catalog, profile)


def test_a_well_formed_host_has_no_problem():
    assert _host({"sglang_service_rollback": "yes", "nvidia_driver_expected_gpu_count": "8"}) == []
    assert profiles.host_problems("gpu-1", HUB, CATALOG, "pp8") == []


def test_the_honest_seed_profile_is_refused_against_the_hosts_gpus():
    catalog = with_extra({"tp4ep2": dict(MINE, gpus=4, flags={"tp_size": 4, "ep_size": 2})})
    profiles.validate_catalog(catalog, SCHEMA)  # consistent in itself: gpus says what the flags start
    assert _host({}, "tp4ep2", catalog) == [
        "Profile tp4ep2 starts 4 GPUs (--tp-size 4 --ep-size 2) but the inventory declares 8 for gpu-1 "
        "(nvidia_driver_expected_gpu_count): use --tp-size 8 --ep-size 2 to spread it over all 8, or set "
        "moefleet_allow_unfit=true to start it."
    ]
    assert _host({"moefleet_allow_unfit": "true"}, "tp4ep2", catalog) == []
    # read as the role specs' type: bool reads it (on, as | bool); no boolean allows nothing (the spec refuses it)
    assert _host({"moefleet_allow_unfit": "on"}, "tp4ep2", catalog) == []
    assert len(_host({"moefleet_allow_unfit": "sure"}, "tp4ep2", catalog)) == 1
    assert len(_host({"moefleet_allow_unfit": ["true"]}, "tp4ep2", catalog)) == 1


def test_every_profile_on_the_ladder_is_checked_and_more_gpus_than_declared_is_refused():
    problems = _host({"nvidia_driver_expected_gpu_count": 4}, "tp2ep4")
    assert problems[0].startswith("Profile tp2ep4 starts 8 GPUs (--tp-size 8 --ep-size 4) but the inventory "
                                  "declares 4 for gpu-1 (nvidia_driver_expected_gpu_count): pick a profile")
    assert problems[1].startswith("Profile ep8 (on tp2ep4's fallback ladder) starts 8 GPUs")
    assert _host({"nvidia_driver_expected_gpu_count": 4, "moefleet_allow_unfit": True}, "tp2ep4") == problems


@pytest.mark.parametrize("count", ["eight", 0, 10**20, True])
def test_a_gpu_count_that_is_no_count_is_named(count):
    assert _host({"nvidia_driver_expected_gpu_count": count}) == [
        f"nvidia_driver_expected_gpu_count is {count!r} for gpu-1; set it to a whole number from 1 to 64."
    ]


def test_types_and_booleans_are_left_to_the_argument_specs():
    # validate.yml's second play refuses them (tests/unit/test_role_input_specs.py): one home per check.
    assert _host({"sglang_service_rollback": "maybe", "sglang_model_source": "s3"}) == []


def test_huge_extra_flags_are_refused_naming_the_host():
    assert _host({"sglang_service_extra_flags": {"max_total_tokens": 10**20, "trust_remote_code": True}}) == [
        "gpu-1: sglang_service_extra_flags/max_total_tokens: 100000000000000000000 is out of range; "
        "give max_total_tokens a whole number from -1 to 2147483647."
    ]
    assert "must be a mapping" in _host({"sglang_service_extra_flags": "trust_remote_code"})[0]


@pytest.mark.parametrize(
    ("inputs", "sentence"),
    [
        ({"sglang_model_revision": ""}, "sglang_model_revision is '' for gpu-1; set it to the 40-hex commit hash"),
        ({"sglang_model_revision": "main"}, "sglang_model_revision is 'main' for gpu-1"),
        ({"sglang_model_revision": REVISION.upper()}, "40-hex commit hash of moonshotai/Kimi-K2.6"),
        ({"sglang_model_repo": "Kimi-K2.6"}, "sglang_model_repo is 'Kimi-K2.6' for gpu-1; set it to the Hugging"),
        ({"sglang_model_gated": "yes"}, "moonshotai/Kimi-K2.6 is gated (sglang_model_gated) but "
                                        "sglang_model_hf_token is empty for gpu-1"),
        ({"sglang_model_gated": "On"}, "moonshotai/Kimi-K2.6 is gated (sglang_model_gated) but "
                                       "sglang_model_hf_token is empty for gpu-1"),
        ({"sglang_model_path": "models/k2"}, "sglang_model_path is 'models/k2' for gpu-1; set it to the absolute"),
    ],
)
def test_model_source_inconsistencies_are_refused(inputs, sentence):
    problems = profiles.model_source_problems("gpu-1", {**HUB, **inputs})
    assert len(problems) == 1 and sentence in problems[0], problems


def test_a_gated_model_with_a_token_and_a_prestaged_copy_pass():
    assert profiles.model_source_problems("gpu-1", {**HUB, "sglang_model_gated": True,
                                                    "sglang_model_hf_token_set": True}) == []
    assert profiles.model_source_problems("gpu-1", {**PRESTAGED, "sglang_model_revision": ""}) == []
    assert profiles.model_source_problems("gpu-1", {"sglang_model_source": "prestaged", "sglang_model_path": ""})


def test_broken_yaml_names_the_file_and_line():
    with pytest.raises(ProfileError) as err:
        profiles.load_yaml_lines("schema_version: 1\nprofiles: [\n  tp8: {}\n", "profiles/catalog.yml")
    assert str(err.value).startswith("profiles/catalog.yml, line 4, column 1: not valid YAML")
    assert "<unicode string>" not in str(err.value)


def test_schema_errors_name_the_line_in_the_catalog_file():
    text = CATALOG_TEXT.replace("      tp_size: 8\n      mem_fraction_static: 0.80\n",
                                "      tp_size: eight\n      mem_fraction_static: 0.80\n", 1)
    data, origins = profiles.load_yaml_lines(text, "profiles/catalog.yml")
    line = text.splitlines().index("      tp_size: eight") + 1
    with pytest.raises(ProfileError) as err:
        profiles.validate_catalog(data, SCHEMA, profiles.catalog_origins(origins, None, None))
    assert f"profiles/catalog.yml, line {line}: profiles/tp8/flags/tp_size: 'eight' is not of type" in str(err.value)


@pytest.mark.parametrize("shaped", [False, True])
def test_extra_profile_errors_name_where_the_operator_wrote_them(shaped):
    extra = {"mine": dict(MINE, flags={"tp_size": 8, "ep_size": 3})}
    where = {"mine": "inv/group_vars/blackwell/main.yml, line 12", "mine/flags": "inv/.../main.yml, line 14"}
    if shaped:
        extra = {"profiles": extra}
        where = {f"profiles/{k}": v for k, v in where.items()}
    _, shipped = profiles.load_yaml_lines(CATALOG_TEXT, "profiles/catalog.yml")
    with pytest.raises(ProfileError) as err:
        profiles.validate_catalog(with_extra(extra), SCHEMA, profiles.catalog_origins(shipped, extra, where))
    assert "inv/.../main.yml, line 14: profiles/mine/flags: --ep-size 3 does not divide" in str(err.value)


def test_an_overridden_profile_is_not_reported_at_the_shipped_line():
    extra = {"tp8": dict(copy.deepcopy(MINE), flags={"tp_size": 8, "ep_size": 3})}
    _, shipped = profiles.load_yaml_lines(CATALOG_TEXT, "profiles/catalog.yml")
    with pytest.raises(ProfileError) as err:
        profiles.validate_catalog(with_extra(extra), SCHEMA, profiles.catalog_origins(shipped, extra, {}))
    assert "\nprofiles/tp8/flags: --ep-size 3" in str(err.value)  # no origin known, none invented
