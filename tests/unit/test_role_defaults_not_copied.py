"""No playbook restates a role's default: `NAME | default(<literal>)` for a variable some role defines in its
defaults/main.yml puts the playbook out of step with the role the day the default changes. Playbooks read the
roles' defaults instead (the play's own roles, or roles/moefleet_defaults, the fleet's shared settings, listed first);
a role does not restate another role's default, nor one of the shared settings, either. Read textually, so that it
sees every Jinja expression (YAML values, folded scalars, templates)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parents[1] for p in ROOT.glob("roles/*/defaults/main.yml"))
DEFINED = {name: role.name for role in ROLES
           for name in (yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {})}
# NAME | default(  where NAME may be reached through hostvars[...]., hv. or any other mapping
USE = re.compile(r"\b(?P<name>[a-z_][a-z0-9_]*)\s*\|\s*default\(")
JINJA_CONSTANTS = {"true": "True", "false": "False", "none": "None", "True": "True", "False": "False", "None": "None"}


def _argument(text: str, start: int) -> str:
    """The text of default(...)'s first argument, from just after its opening parenthesis."""
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return text[start:i]
            depth -= 1
        elif c == "," and depth == 0:
            return text[start:i]
        i += 1
    return text[start:]


def is_literal(argument: str) -> bool:
    """Whether a Jinja expression is a constant (a string, number, list, dict, true/false/none), as
    default('/etc/sglang'), default(30000) or default({}) are; default(other_var) or default('a' ~ b) are not."""
    expression = re.sub(r"\b(true|false|none|True|False|None)\b", lambda m: JINJA_CONSTANTS[m.group(1)],
                        argument.strip())
    try:
        ast.literal_eval(expression)
    except (ValueError, SyntaxError, TypeError):
        return False
    return True


def copies(path: Path, own_role: str | None = None) -> list[str]:
    return copies_in(path.read_text(), str(path.relative_to(ROOT)), own_role)


def copies_in(text: str, where: str, own_role: str | None = None) -> list[str]:
    found = []
    for match in USE.finditer(text):
        name = match.group("name")
        role = DEFINED.get(name)
        if role is None or role == own_role:
            continue
        argument = _argument(text, match.end())
        if is_literal(argument):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{where}:{line}: {name} | default({argument.strip()})"
                         f" (roles/{role}/defaults/main.yml)")
    return found


def _playbook_files() -> list[Path]:
    return sorted([ROOT / "deploy.yml", *ROOT.glob("playbooks/**/*.yml")])


def _role_files() -> list[tuple[Path, str]]:
    return sorted((p, p.relative_to(ROOT / "roles").parts[0]) for p in ROOT.glob("roles/*/**/*")
                  if p.is_file() and p.suffix in {".yml", ".j2"}
                  and "defaults" not in p.relative_to(ROOT / "roles").parts[1:2])


def test_no_playbook_restates_a_roles_default():
    found = [c for path in _playbook_files() for c in copies(path)]
    assert found == [], "read the role's default instead:\n" + "\n".join(found)


def test_no_role_restates_another_roles_default():
    found = [c for path, role in _role_files() for c in copies(path, own_role=role)]
    assert found == [], "read the other role's default instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{{ sglang_service_port | default(30000) }}", 1),
        ("{{ hostvars[item].sglang_router_port | default(30000) }}/workers", 1),
        ("{%- set addr = hv.sglang_service_host | default('127.0.0.1') %}", 1),
        ("{{ sglang_service_extra_flags | default({}) }}", 1),
        ("{{ sglang_service_api_key | default('') | length > 0 }}", 1),
        ("{{ sglang_service_port | default(__defaults_sglang_service.sglang_service_port) }}", 0),
        ("{{ cuda_toolkit_package | default('cuda-toolkit-' ~ (v | replace('.', '-'))) }}", 0),
        ("{{ moefleet_serial | default([0]) }}", 0),  # not a role's variable
        ("{{ sglang_service_outcome.serving_profile | default('?') }}", 0),  # not a role's variable
    ],
)
def test_it_sees_a_copy(text, expected):
    assert len(copies_in(text, "probe.yml")) == expected
