"""The served model's flags (plugins/module_utils/serving_model.py) from the sglang_service role's own table, and the
controller's refusal of a model or parser SGLang would not take, before any host changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import profiles, serving_model
from role_defaults import role_defaults

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = role_defaults("sglang_service")
MODELS = DEFAULTS["sglang_service_models"]


def role_flags(**overrides):
    v = {**DEFAULTS, **overrides}
    return serving_model.model_flags(v["sglang_service_models"], v["sglang_service_model"],
                                     v["sglang_service_tool_call_parser"], v["sglang_service_reasoning_parser"],
                                     v["sglang_service_sampling_defaults"], v["sglang_service_context_length"])


def test_the_role_defaults_serve_kimi_k2_6_with_its_parsers_and_the_models_sampling_defaults():
    assert role_flags() == {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2", "sampling_defaults": "model"}


def test_the_second_model_is_text_only_with_its_own_tool_parser():
    assert role_flags(sglang_service_model="deepseek-v3") == {"tool_call_parser": "deepseekv3",
                                                              "sampling_defaults": "model"}


def test_a_variable_overrides_the_entry_and_empty_leaves_the_flag_out():
    assert role_flags(sglang_service_reasoning_parser="", sglang_service_tool_call_parser="qwen",
                      sglang_service_sampling_defaults="", sglang_service_context_length=131072) == {
        "tool_call_parser": "qwen", "context_length": 131072}


def test_a_model_without_an_entry_is_a_sentence_naming_the_known_ones():
    with pytest.raises(serving_model.ServingModelError, match=r"'kimi-k3' has no entry in sglang_service_models "
                       r"\(known: deepseek-v3, kimi-k2.6\)"):
        role_flags(sglang_service_model="kimi-k3")


def _host(**inputs):
    prestaged = {"sglang_model_source": "prestaged", "sglang_model_path": "/srv/models/Kimi-K2.6"}
    return profiles.served_model_problems("gpu-1", {**DEFAULTS, **prestaged, **inputs}, "0.5.10")


def test_the_controller_refuses_a_parser_sglang_does_not_take_naming_the_variable():
    assert _host() == []
    found = _host(sglang_service_tool_call_parser="kimi-k2")
    assert len(found) == 1, found
    assert found[0].startswith("gpu-1: sglang_service_tool_call_parser (from sglang_service_tool_call_parser): "
                               "'kimi-k2' is not one SGLang"), found
    found = _host(sglang_service_models={**MODELS, "mine": {"tool_call_parser": "kimi_k2", "reasoning_parser": "k2"}},
                  sglang_service_model="mine")
    assert len(found) == 1 and "sglang_service_reasoning_parser (from the entry 'mine' of sglang_service_models)" \
        in found[0], found
    assert "has no entry" in _host(sglang_service_model="nope")[0]


CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())


@pytest.mark.parametrize("name", sorted(CATALOG["profiles"]))
def test_metrics_are_on_by_default_and_reported_by_every_scheduler_where_dp_attention_splits_them(name):
    flags = CATALOG["profiles"][name]["flags"]
    got = serving_model.metrics_flags(DEFAULTS["sglang_service_metrics"], flags)
    assert got["enable_metrics"] is True
    assert ("enable_metrics_for_all_schedulers" in got) == bool(flags.get("enable_dp_attention"))


def test_a_dp_attention_profile_exists_in_the_catalog_so_the_case_above_is_exercised():
    assert any(p["flags"].get("enable_dp_attention") for p in CATALOG["profiles"].values())


def test_metrics_off_passes_no_flag():
    assert serving_model.metrics_flags(False, {"enable_dp_attention": True}) == {}
