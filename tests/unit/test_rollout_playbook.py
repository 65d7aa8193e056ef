"""playbooks/rollout.yml runs serve.yml's one play (no copy of it behind routers), and its confirmation fails on
the hosts that would restart, stopping the whole run: the structure both rely on, and serve.yml's batches as
ansible-core templates its serial for deploy.yml, a rollout without routers and a rollout behind them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
ROLLOUT = yaml.safe_load((PLAYBOOKS / "rollout.yml").read_text())
SERVE = yaml.safe_load((PLAYBOOKS / "serve.yml").read_text())


def _import_vars() -> dict:
    imports = [p for p in ROLLOUT if p.get("ansible.builtin.import_playbook") == "serve.yml"]
    assert len(imports) == 1, "rollout.yml imports serve.yml once, with or without routers"
    assert "when" not in imports[0]
    return imports[0]["vars"]


def test_rollout_has_no_play_of_its_own_that_installs_or_serves():
    plays = [p for p in ROLLOUT if "hosts" in p]
    assert [p["hosts"] for p in plays] == ["blackwell", "routers"]  # the confirmation, the gateway
    assert all("sglang_service" not in yaml.safe_dump(p) for p in plays)
    assert _import_vars()["moefleet_through_routers"] is True


def test_the_confirmation_fails_on_each_host_that_would_restart_and_stops_the_run():
    play = ROLLOUT[1]
    assert play["any_errors_fatal"] is True
    task = next(t for t in play["tasks"] if "ansible.builtin.assert" in t)
    assert "run_once" not in task and "delegate_to" not in task
    assert "moefleet_serves_other" in task["ansible.builtin.assert"]["that"]
    assert task["ansible.builtin.assert"]["fail_msg"].startswith("These hosts serve another profile")


def _serial(variables: dict, routers: list[str]) -> object:
    templar = Templar(loader=DataLoader(), variables={**variables, "groups": {"routers": routers}})
    return templar.template(trust_as_template(SERVE[0]["serial"]))


@pytest.mark.parametrize(
    ("variables", "routers", "expected"),
    [
        ({}, [], [0]),  # deploy.yml: every host at once
        ({}, ["r1"], [0]),  # deploy.yml with routers: no drain, every host at once
        ("rollout", [], [1, "25%", "100%"]),
        ("rollout", ["r1"], [1]),
        ("rollout+2", ["r1"], [2]),
    ],
)
def test_serve_batches(variables, routers, expected):
    if isinstance(variables, str):
        extra = {"moefleet_max_unavailable": 2} if variables.endswith("+2") else {}
        variables = {**_import_vars(), **extra}
    assert _serial(variables, routers) == expected


def test_the_drain_and_the_put_back_run_only_behind_routers_in_a_rollout():
    tasks = SERVE[0]["pre_tasks"] + SERVE[0]["tasks"]
    member = [t for t in tasks if t.get("ansible.builtin.include_tasks") == "tasks/router_member.yml"]
    assert [t["vars"]["moefleet_router_action"] for t in member] == ["out", "in"]
    assert all("_moefleet_routed | bool" in t["when"] for t in member)
    names = [t["name"] for t in tasks]
    assert names.index("Serve the profile") < names.index(member[1]["name"])
    templar = Templar(loader=DataLoader(), variables={"groups": {"routers": ["r1"]}})
    routed = trust_as_template(SERVE[0]["vars"]["_moefleet_routed"])
    assert templar.template(routed) is False  # deploy.yml
    templar = Templar(loader=DataLoader(), variables={"groups": {"routers": ["r1"]}, "moefleet_through_routers": True})
    assert templar.template(routed) is True
