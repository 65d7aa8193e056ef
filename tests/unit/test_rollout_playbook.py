"""playbooks/rollout.yml runs serve.yml's one play (no copy of it behind routers), and its confirmation fails on
the hosts that would restart, stopping the whole run: the structure both rely on, and serve.yml's batches as
ansible-core templates its serial for deploy.yml, a rollout without routers and a rollout behind them; and a batch
size (moefleet_max_unavailable) is refused, or cut into the same batches, alike by `moefleet rollout --check`,
`moefleet rollout --yes` and the playbook."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.executor.playbook_executor import PlaybookExecutor
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play import Play
from ansible.template import Templar, trust_as_template
from ansible_collections.moefleet.serving.plugins.module_utils import playbook_inputs

from moefleet import cli, runner

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
    # the confirmation, the gateway, the gateway's switch to a rotated key after the workers
    assert [p["hosts"] for p in plays] == ["blackwell", "routers", "routers"]
    # no play of its own runs the sglang_service role (serve.yml's play does); its variables may be read
    assert not any(re.search(r"(role|name): sglang_service\b", yaml.safe_dump(p)) for p in plays)
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


def _membership(tasks: list[dict]) -> list[dict]:
    return [t for t in tasks if (t.get("ansible.builtin.include_role") or {}).get("name") == "router_membership"]


def test_the_drain_and_the_put_back_run_only_behind_routers_in_a_rollout():
    """The drain in the play's pre_tasks, the put-back in its post_tasks (after the serve: a host whose start failed
    or fell back has failed by then and stays out; after the health gate: a batch takes requests only while every
    host done so far serves), both through roles/router_membership, the last of the post_tasks."""
    play = SERVE[0]
    assert [t["vars"]["router_membership_state"] for t in _membership(play["pre_tasks"])] == ["out"]
    assert [t["vars"]["router_membership_state"] for t in _membership(play["post_tasks"])] == ["in"]
    assert _membership(play["tasks"]) == []
    member = _membership(play["pre_tasks"]) + _membership(play["post_tasks"])
    assert all("_moefleet_routed | bool" in t["when"] for t in member)
    # the tasks are one block (its always ends the host's maintenance for the alert rules)
    assert "Serve the profile" in [t["name"] for b in play["tasks"] for t in b.get("block", [b])]
    gate = [t["name"] for t in play["post_tasks"]]
    assert gate.index("Check that every host done so far still serves") < gate.index(member[1]["name"]) == len(gate) - 1
    templar = Templar(loader=DataLoader(), variables={"groups": {"routers": ["r1"]}})
    routed = trust_as_template(SERVE[0]["vars"]["_moefleet_routed"])
    assert templar.template(routed) is False  # deploy.yml
    templar = Templar(loader=DataLoader(), variables={"groups": {"routers": ["r1"]}, "moefleet_through_routers": True})
    assert templar.template(routed) is True


# --- moefleet_max_unavailable / moefleet_serial: the batches Ansible cuts, the CLI's plan and the check ----------
# The bug this guards: serial was `[moefleet_max_unavailable | int]`, and "25%" | int is 0, and serial [0] is one
# batch of every host, each drained out of the routers at once; `moefleet rollout --check` printed "0 host(s) at a
# time" (or a traceback for "25%"), and --yes skipped the check.

ROOT = PLAYBOOKS.parent
BIN = Path(sys.executable).parent


class _Inventory:
    def __init__(self, hosts):
        self.hosts = hosts

    def get_hosts(self, pattern, order=None):
        return list(self.hosts)


def ansible_cuts(variables: dict, routers: list[str], hosts: list[str]) -> tuple[list, list[list[str]]]:
    """serve.yml's play as ansible-core runs it: its serial templated and post-validated by a Play, then cut into
    batches by PlaybookExecutor._get_serialized_batches."""
    loader = DataLoader()
    play = Play.load({"hosts": "blackwell", "gather_facts": False, "serial": trust_as_template(SERVE[0]["serial"])},
                     loader=loader)
    play.post_validate(Templar(loader=loader, variables={**variables, "groups": {"routers": routers}}))
    executor = SimpleNamespace(_inventory=_Inventory(hosts))
    return play.serial, PlaybookExecutor._get_serialized_batches(executor, play)


GRID = [{}, {"moefleet_max_unavailable": 2}, {"moefleet_max_unavailable": "2"}, {"moefleet_max_unavailable": "25%"},
        {"moefleet_max_unavailable": "50%"}, {"moefleet_max_unavailable": "100%"},
        {"moefleet_serial": [1, 2, "100%"]}, {"moefleet_serial": "50%"}, {"moefleet_serial": 3},
        {"moefleet_through_routers": "false"}, {"moefleet_through_routers": "yes", "moefleet_max_unavailable": "25%"}]


@pytest.mark.parametrize("extra", GRID)
@pytest.mark.parametrize("playbook_vars", ["rollout", "deploy"])
@pytest.mark.parametrize("routers", [[], ["r1"]])
@pytest.mark.parametrize("count", [1, 4, 8])
def test_ansible_cuts_what_play_serial_and_batches_say(extra, playbook_vars, routers, count):
    """The serial and batches the CLI's plan and the report compute (playbook_inputs.play_serial, .batches) are
    the ones ansible-core makes of serve.yml's own expression, -e over the playbook's vars."""
    variables = {**(_import_vars() if playbook_vars == "rollout" else {}), **extra}
    hosts = [f"gpu-{i}" for i in range(1, count + 1)]
    serial, cut = ansible_cuts(variables, routers, hosts)
    assert serial == playbook_inputs.play_serial(variables, bool(routers))
    assert cut == playbook_inputs.batches(hosts, serial)
    assert sum(cut, []) == hosts


@pytest.mark.parametrize(("value", "count", "largest"), [("25%", 4, 1), ("25%", 8, 2), ("50%", 4, 2), ("50%", 8, 4),
                                                         (1, 8, 1), ("2", 8, 2)])
def test_behind_routers_no_batch_is_larger_than_moefleet_max_unavailable(value, count, largest):
    hosts = [f"gpu-{i}" for i in range(1, count + 1)]
    serial, cut = ansible_cuts({**_import_vars(), "moefleet_max_unavailable": value}, ["r1"], hosts)
    assert serial == [value]  # passed through unchanged: Ansible itself reads the percentage
    assert max(len(batch) for batch in cut) == largest and len(cut) == -(-count // largest)


class FakeFleet:
    """runner.run_adhoc and runner.run_playbook for `moefleet rollout`: hosts behind one router, all serving ep8."""

    def __init__(self, count: int):
        self.hosts = [f"gpu-{i}" for i in range(1, count + 1)]
        self.playbooks: list[dict] = []
        self.adhoc: list[str] = []

    def run_adhoc(self, module, module_args, inventory, pattern, limit=None, extravars=None, vault=None):
        self.adhoc.append(module)
        if module.endswith("debug"):
            msg = {"asked": "ep8", "order": self.hosts, "routers": ["r1"], "inputs": {}}
            return runner.AdhocResult({h: {"msg": msg} for h in self.hosts}, {}, {}, "successful", 0)
        local = {"ansible_facts": {"ansible_local": {"moefleet": {"serving_profile": "ep8"}}}}
        return runner.AdhocResult({h: local for h in self.hosts}, {}, {}, "successful", 0)

    def run_playbook(self, name, inventory, extravars=None, on_event=None, notice=print, limit=None, vault=None,
                     skip_tags=None):
        if name == "validate.yml":  # `moefleet rollout`'s check of the inputs before its plan: they pass
            return runner.RunResult("successful", 0)
        self.playbooks.append(dict(extravars))
        base = Path(extravars["moefleet_report_path"])
        base.with_name(base.name + ".json").write_text(json.dumps({"result": "complete", "hosts": []}))
        base.with_name(base.name + ".md").write_text("report\n")
        return runner.RunResult("successful", 0)


@functools.cache
def validate_playbook(*extra: str) -> subprocess.CompletedProcess:
    """playbooks/validate.yml, the first play of rollout.yml, run by ansible-playbook on the controller only (it
    contacts no host; the batch sizes are checked there whatever the host count)."""
    with tempfile.TemporaryDirectory(prefix="moefleet-validate-") as tmp:
        inventory = Path(tmp) / "hosts.yml"
        inventory.write_text("blackwell:\n  hosts:\n    gpu-1:\n    gpu-2:\n  vars:\n    sglang_profile: tp8\n"
                             "    sglang_model_source: prestaged\nrouters:\n  hosts:\n    r1:\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
        return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / "validate.yml"),
                               *(w for e in extra for w in ("-e", e))], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)


@pytest.mark.parametrize("count", [4, 8])
@pytest.mark.parametrize("value", ["0", "-1", "banana", "25%", "50%"])
def test_check_yes_and_the_playbook_agree(value, count, tmp_path, monkeypatch, capsys):
    """-e moefleet_max_unavailable=VALUE behind routers: refused with the same sentence by `moefleet rollout
    --check`, by `moefleet rollout --yes` (before anything runs) and by the playbook (validate.yml, before any host
    is contacted); or the same batches, of at most the allowed hosts, in --check's plan and in Ansible's cut."""
    fleet = FakeFleet(count)
    monkeypatch.setattr(runner, "run_adhoc", fleet.run_adhoc)
    monkeypatch.setattr(runner, "run_playbook", fleet.run_playbook)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all: {}\n")
    args = ["rollout", "-i", str(inventory), "-e", "profile=ep8", "-e", f"moefleet_max_unavailable={value}"]
    sentence = playbook_inputs.value_problem("moefleet_max_unavailable", value)

    check = cli.main([*args, "--check", "--json"])
    check_out = capsys.readouterr()
    yes = cli.main([*args, "--yes", "--report", str(tmp_path / "report")])
    yes_out = capsys.readouterr()
    playbook = validate_playbook("profile=tp8", f"moefleet_max_unavailable={value}")
    hosts = fleet.hosts
    if sentence is not None:
        assert sentence.startswith(f"moefleet_max_unavailable is {value!r}, ")
        assert (check, yes) == (2, 2)
        assert check_out.err == f"moefleet rollout: {sentence}\n" and check_out.out == ""
        assert yes_out.err == f"moefleet rollout: {sentence}\n"
        assert fleet.adhoc == [] and fleet.playbooks == []  # nothing ran: not even the read-only look
        assert playbook.returncode == 2
        assert sentence in " ".join(playbook.stdout.split())
        assert "Traceback" not in playbook.stdout + playbook.stderr
        return
    allowed = playbook_inputs.pct_to_int(value, count)
    plan = json.loads(check_out.out)
    assert check == 0 and plan["serial"] == [value] and plan["behind_routers"] is True
    planned = [[row["host"] for row in plan["hosts"] if row["batch"] == n] for n in range(1, plan["batches"] + 1)]
    _, ansible = ansible_cuts({**_import_vars(), "profile": "ep8", "moefleet_max_unavailable": value}, ["r1"], hosts)
    assert planned == ansible
    assert max(len(batch) for batch in planned) == allowed == count * int(value.rstrip("%")) // 100
    assert yes == 0 and fleet.playbooks[0]["moefleet_max_unavailable"] == value  # to the playbook unchanged
    assert playbook.returncode == 0, playbook.stdout


def test_rollout_ymls_own_values_pass_the_check_operators_values_get():
    assert playbook_inputs.problems(_import_vars()) == []
    assert set(_import_vars()) >= {"moefleet_serial", "moefleet_max_fail_percentage", "moefleet_any_errors_fatal",
                                   "moefleet_health_gate", "moefleet_through_routers"}
