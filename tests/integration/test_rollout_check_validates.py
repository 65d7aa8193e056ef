"""`moefleet rollout --check` and `moefleet deploy --check`, run for real (the CLI, ansible-runner, ansible-playbook)
on inventories whose hosts are never contacted: every input playbooks/validate.yml refuses is refused by --check too,
with exit 2 and the very sentence the real run (`moefleet rollout --yes`, rollout.yml importing validate.yml) prints,
before any host's facts are read; a valid input gets past those checks to the plan, which then finds the hosts
unreachable (exit 3). About 25 s: each command is one validate.yml run of 1.5-2 s and a Python start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from moefleet.commands.rollout import EXIT_BAD_INPUT, EXIT_UNREACHABLE

ROOT = Path(__file__).resolve().parents[2]
MOEFLEET = Path(sys.executable).parent / "moefleet"
EXAMPLE = ROOT / "inventory" / "example"


def closed_port() -> int:
    """A loopback port nothing listens on (the kernel's pick, closed again): ssh to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def loopback_inventory(path: Path, routers: bool = False) -> Path:
    port = closed_port()
    host = {"ansible_host": "127.0.0.1", "ansible_port": port, "sglang_profile": "tp8",
            "sglang_model_source": "prestaged"}
    groups = {"blackwell": {"hosts": {"loop-1": host, "loop-2": host}}}
    if routers:
        groups["routers"] = {"hosts": {"loop-router": {"ansible_host": "127.0.0.1", "ansible_port": port}}}
    path.write_text(json.dumps({"all": {"children": groups}}))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def loopback(tmp_path_factory) -> Path:
    return loopback_inventory(tmp_path_factory.mktemp("loopback") / "hosts.yml")


@pytest.fixture(scope="module")
def routed(tmp_path_factory) -> Path:
    return loopback_inventory(tmp_path_factory.mktemp("routed") / "hosts.yml", routers=True)


def moefleet(*args: str | Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(MOEFLEET), *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def refused_as_the_real_run_refuses(command: str, inventory: Path, extra: list[str], report: Path) -> str:
    """--check's refusal (exit 2, one sentence on stderr, no plan), checked against the real run's; the sentence."""
    check = moefleet(command, "--check", "-i", inventory, *extra)
    assert check.returncode == EXIT_BAD_INPUT, check.stdout + check.stderr
    assert check.stdout == ""  # no plan: refused before the hosts' facts were read
    real = moefleet(command, "--yes", "-i", inventory, "--report", report, *extra)
    assert real.returncode == EXIT_BAD_INPUT, real.stdout + real.stderr
    assert check.stderr == real.stderr
    return " ".join(check.stderr.split())


@pytest.mark.parametrize(("extra", "sentence"), [
    (["-e", "profile=ep9"], "moefleet rollout: -e profile: Unknown profile 'ep9'; valid profiles: tp8, ep8,"),
    (["-e", '{"sglang_service_extra_flags": {"tp_size": 4}}'],
     "moefleet rollout: loop-1: sglang_service_extra_flags/tp_size: tp_size changes the GPU layout, which the "
     "profile decides"),
    (["-e", "sglang_service_port=99999"],
     "moefleet rollout: sglang_service_port is '99999' for loop-1; set it to a whole number from 1 to 65535."),
], ids=["unknown profile", "refused extra flag", "port 99999"])
def test_check_refuses_what_validate_refuses_with_the_real_runs_sentence(loopback, tmp_path, extra, sentence):
    said = refused_as_the_real_run_refuses("rollout", loopback, extra, tmp_path / "report")
    assert said.startswith(sentence), said


def test_check_refuses_the_example_inventorys_placeholder_revision(tmp_path):
    said = refused_as_the_real_run_refuses("rollout", EXAMPLE, [], tmp_path / "report")
    assert said.startswith(
        "moefleet rollout: sglang_model_revision is 'set-me-to-a-commit-hash' for gpu-node-01; set it to the 40-hex "
        "commit hash of moonshotai/Kimi-K2.6 to serve"), said


def test_deploy_check_validates_for_deploy_yml(routed, tmp_path):
    """validate.yml's outage check reads the playbook it validates for (moefleet_serving_playbook): deploy.yml does
    not drain, so behind routers it is refused, naming the drained way."""
    said = refused_as_the_real_run_refuses("deploy", routed, ["-e", "profile=tp8"], tmp_path / "report")
    assert said.startswith("moefleet deploy: deploy.yml would restart 2 of the 2 workers behind the routers "
                           "(loop-router) without taking them out of the routers first"), said


def test_a_valid_input_gets_past_the_checks_to_the_plan(loopback):
    check = moefleet("rollout", "--check", "-i", loopback, "-e", "profile=tp8")
    assert check.returncode == EXIT_UNREACHABLE, check.stdout + check.stderr
    assert check.stdout.startswith('Rollout plan (serial [1, "25%", "100%"]; nothing was changed):')
    assert "loop-1  unreachable now (" in check.stdout and "Connection refused" in check.stdout
    assert check.stderr == ("moefleet rollout: loop-1, loop-2 could not be reached (or their facts read): the plan "
                            "cannot say what would change there.\n")
