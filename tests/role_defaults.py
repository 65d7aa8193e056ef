"""A role's defaults as Ansible gives them to the role's tasks: the fleet's shared settings (roles/moefleet_defaults,
a dependency of every role that reads one) under the role's own defaults/main.yml. For tests that read a role's
defaults without running Ansible."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HOME = "moefleet_defaults"
HOME_FILE = ROOT / "roles" / HOME / "defaults" / "main.yml"


def own(role: str) -> dict:
    """What roles/ROLE/defaults/main.yml itself declares ({} for a role without one)."""
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def home() -> dict:
    """The fleet's shared settings, roles/moefleet_defaults/defaults/main.yml."""
    return yaml.safe_load(HOME_FILE.read_text()) or {}


def role_defaults(role: str) -> dict:
    """The shared settings with the role's own defaults over them, as the role's tasks see them."""
    return {**home(), **own(role)}
