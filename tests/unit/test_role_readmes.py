"""Each role's README variable table is current with its argument specs, and the specs' defaults are the
role's defaults, its own or the fleet's shared settings it reads (roles/moefleet_defaults); ansible-core validates a
role's variables against its specs but never compares defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from role_defaults import own, role_defaults

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parents[1] for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def test_every_readme_table_is_current():
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "role_readme.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_spec_defaults_are_the_roles_defaults(role):
    options = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = role_defaults(role.name)
    for name, option in options.items():
        if option.get("required"):
            continue
        assert name in defaults, (f"{role.name}: {name} has a spec but no default in defaults/main.yml"
                                  " (nor in roles/moefleet_defaults)")
        if "default" in option:
            assert option["default"] == defaults[name], f"{role.name}: {name}"
    undocumented = sorted(set(own(role.name)) - set(options))
    assert not undocumented, f"{role.name}: defaults without an argument spec: {undocumented}"
