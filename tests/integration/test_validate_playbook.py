"""deploy.yml's first play refuses bad input on the controller, with a sentence, before any host is touched.

The inventory's only host is unreachable (TEST-NET-1, RFC 5737): had any task run on it, the play would
report it unreachable after an SSH timeout instead of failing on localhost at once.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from playbook import run_playbook

ROOT = Path(__file__).resolve().parents[2]
MINE = {"description": "An operator profile for this test.", "gpus": 8, "nccl": "pcie_p2p", "fallback": None}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inv") / "hosts.yml"
    path.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        unreachable-1:\n"
                    "          ansible_host: 192.0.2.1\n          sglang_profile: tp8\n")
    return path


def deploy(inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_playbook(inventory, "deploy.yml", *extra, timeout=60)


def refused(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0
    assert "unreachable-1" not in run.stdout.split("PLAY RECAP")[-1], "a host was contacted"
    return " ".join(run.stdout.split())


def test_unknown_profile_lists_the_valid_names(inventory):
    out = refused(deploy(inventory, "profile=nonsense"))
    assert "Unknown profile 'nonsense'; valid profiles: tp8, ep8, tp2ep4, tp4ep2, pp8" in out


def test_profile_of_the_wrong_type_says_how_to_pass_it(inventory):
    out = refused(deploy(inventory, json.dumps({"profile": 8})))
    assert "-e '{\"profile\": \"tp8\"}'" in out


def test_extra_profiles_passed_as_a_string_say_how_to_pass_them(inventory):
    out = refused(deploy(inventory, "moefleet_extra_profiles=tp16"))
    assert "moefleet_extra_profiles must be a mapping" in out and "as JSON" in out


def test_extra_profile_breaking_the_schema_names_its_path(inventory):
    bad = {"moefleet_extra_profiles": {"mine": {**MINE, "flags": {"tp_size": "eight"}}}}
    out = refused(deploy(inventory, json.dumps(bad), "profile=mine"))
    assert "profiles/mine/flags/tp_size" in out


def test_extra_profile_breaking_tp_ep_invariant_is_refused(inventory):
    bad = {"moefleet_extra_profiles": {"mine": {**MINE, "flags": {"tp_size": 8, "ep_size": 3}}}}
    out = refused(deploy(inventory, json.dumps(bad), "profile=mine"))
    assert "profiles/mine/flags: --ep-size 3 does not divide --tp-size 8" in out


def test_host_profile_from_inventory_is_validated_too(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    blackwell:\n      hosts:\n        unreachable-1:\n"
                   "          ansible_host: 192.0.2.1\n          sglang_profile: tp3\n")
    out = refused(deploy(inv))
    assert "sglang_profile of unreachable-1: Unknown profile 'tp3'" in out
