"""How the fault scenario (molecule/rollback: its recovery and rollback tests) deploys to its lab host and reads it
back: ansible-playbook deploy.yml against the scenario's inventory with `sim_faults` given by -e, then testinfra for
what the unit runs, what serves, and the moefleet local facts (held to their schema at every read)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import jsonschema
from playbook import ROOT, SERVE_ONLY, run_playbook

FACTS_SCHEMA = json.loads((ROOT / "schemas" / "local_facts.schema.json").read_text())


def deploy(*extra_vars: str, install: bool = False) -> tuple[int, str, dict]:
    """deploy.yml on the scenario's inventory ($MOEFLEET_LAB_INVENTORY): (exit code, output, the lab host's recap).
    The scenario's converge ran the whole path; these deploys change what serves as an operator does on an installed
    host, with --skip-tags install (`moefleet deploy --serve-only`; about half a deploy's time), unless install."""
    options = () if install else SERVE_ONLY
    run = run_playbook(Path(os.environ["MOEFLEET_LAB_INVENTORY"]), "deploy.yml", *extra_vars, options=options)
    # The lab host's recap line (not localhost's, which validates on the controller).
    recap = re.search(r"^(?!localhost)\S+\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                      run.stdout, re.M)
    keys = ("ok", "changed", "unreachable", "failed")
    stats = dict(zip(keys, map(int, recap.groups()), strict=True)) if recap else {}
    return run.returncode, run.stdout + run.stderr, stats


def faults(*entries: tuple[str, str]) -> str:
    """The -e value that makes the simulator fail these (fault, profile) starts."""
    return json.dumps({"sim_faults": [{"fault": f, "profile": p} for f, p in entries]})


def facts(host) -> dict:
    """The host's local facts, held to their documented schema each time a test reads them."""
    found = json.loads(host.file("/etc/ansible/facts.d/moefleet.fact").content_string)
    jsonschema.validate(found, FACTS_SCHEMA)
    return found


def serving_args(host) -> dict:
    return json.loads(host.check_output("curl -sf http://127.0.0.1:30000/server_info"))


def invocation(host) -> str:
    return host.check_output("systemctl show -p InvocationID --value sglang.service")
