"""validate.yml, run for real on a loopback-free inventory whose hosts are never contacted (TEST-NET addresses, RFC
5737): behind routers, deploy.yml (which does not drain) and a rollout that would drain every worker at once are
refused before any host is contacted, naming the drained way and the maintenance window; with
-e moefleet_maintenance_window=true the run announces the outage and goes on; the inputs that used to reach hosts
unchecked are refused, each with its fix, in one run. tests/unit/test_input_table.py checks every input's bad value
against the same code without a run each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playbook import no_host_contacted, run_playbook

ROUTED = ("all:\n  children:\n    blackwell:\n      hosts:\n"
          "        unreachable-1:\n          ansible_host: 192.0.2.1\n          sglang_profile: tp8\n"
          "          sglang_model_source: prestaged\n"
          "        unreachable-2:\n          ansible_host: 192.0.2.3\n          sglang_profile: tp8\n"
          "          sglang_model_source: prestaged\n"
          "    routers:\n      hosts:\n        router-1:\n          ansible_host: 192.0.2.2\n")


@pytest.fixture(scope="module")
def routed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("routed") / "hosts.yml"
    path.write_text(ROUTED)
    return path


def test_deploy_behind_routers_is_refused_before_any_host_naming_both_ways(routed):
    run = run_playbook(routed, "deploy.yml", "profile=ep8", timeout=60)
    out = no_host_contacted(run, "Install, check and serve")
    assert run.returncode != 0
    assert ("deploy.yml would restart 2 of the 2 workers behind the routers (router-1) without taking them out of the "
            "routers first (moefleet_through_routers is off), leaving 0 serving") in out
    assert "moefleet rollout -e profile=ep8 (or ansible-playbook playbooks/rollout.yml -e profile=ep8)" in out
    assert "pass -e moefleet_maintenance_window=true to restart them at once, an outage the run announces" in out


def test_a_maintenance_window_is_announced_as_an_outage(routed):
    run = run_playbook(routed, "playbooks/validate.yml", "profile=ep8", "moefleet_serving_playbook=deploy.yml",
                       "moefleet_maintenance_window=true", timeout=60)
    out = no_host_contacted(run, "Install, check and serve")
    assert run.returncode == 0, out[-3000:]
    assert "Maintenance window (moefleet_maintenance_window=true): 2 of the 2 workers behind the routers (router-1) " \
           "restart without being taken out of the routers first, 0 left serving" in out


def test_a_rollout_that_drains_every_worker_at_once_is_refused(routed):
    run = run_playbook(routed, "playbooks/rollout.yml", "profile=ep8", "moefleet_max_unavailable=100%", timeout=60)
    out = no_host_contacted(run, "Install, check and serve")
    assert run.returncode != 0
    assert ("moefleet_max_unavailable=100% would take 2 of the 2 workers of this run out of the routers (router-1) at "
            "once, leaving 0 of the 2 workers behind them serving") in out


def test_inputs_that_reached_hosts_unchecked_are_refused_each_with_its_fix(routed):
    bad = {"sglang_service_nccl_set": "pcie_p2pp", "sglang_service_extra_env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                                                               "NCCL_ALGO": "Tree"},
           "sglang_service_host": "not an address", "sglang_service_stop_timeout": 0,
           "sglang_service_ready_timeout": -5, "sglang_service_context_length": -1}
    run = run_playbook(routed, "playbooks/validate.yml", "profile=tp8", json.dumps(bad), timeout=60)
    out = no_host_contacted(run, "Install, check and serve")
    assert run.returncode != 0 and "unreachable-1: " in out
    for sentence in (
        "sglang_service_nccl_set is 'pcie_p2pp', which is no NCCL set of the catalog; set it to one "
        "of: pcie_p2p, pcie_shm",
        "sglang_service_extra_env sets CUDA_VISIBLE_DEVICES, which this unit owns",
        "sglang_service_extra_env sets NCCL_ALGO, which the NCCL set pcie_p2p defines",
        "sglang_service_host is 'not an address'; set it to an IP address or a host name",
        "sglang_service_stop_timeout is 0; set it to a whole number from 1 to 86400.",
        "sglang_service_ready_timeout is -5; set it to a whole number from 1 to 604800.",
        "sglang_service_context_length is -1; set it to a whole number from 0 to 10485760",
    ):
        assert sentence in out, sentence


def test_the_routers_inputs_are_checked_before_any_host(routed):
    run = run_playbook(routed, "playbooks/validate.yml", "profile=tp8", "sglang_router_port=0",
                       "sglang_router_policy=fastest", timeout=60)
    out = no_host_contacted(run, "Install, check and serve")
    assert run.returncode != 0
    assert "router-1: " in out and "sglang_router_port is '0'; set it to a whole number from 1 to 65535" \
        in out
    assert "value of sglang_router_policy must be one of" in out
