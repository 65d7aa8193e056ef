#!/usr/bin/env python3
"""Each role's README carries a variable table generated from its meta/argument_specs.yml.

    python tests/role_readme.py           rewrite the table in every roles/*/README.md
    python tests/role_readme.py --check   exit 1 naming each README whose table is not current (make lint)

The table sits between the two marker lines below; the prose around it is written by hand. A README
without the markers gets the table appended under a "Variables" heading.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- BEGIN VARIABLES: generated from meta/argument_specs.yml by tests/role_readme.py; do not edit -->"
END = "<!-- END VARIABLES -->"


def _cell(value: object) -> str:
    text = " ".join(str(value).split())
    text = re.sub(r"\b[OV]\(([^)]+)\)", r"`\1`", text)  # ansible-doc markup: O(option), V(value)
    return text.replace("|", "\\|")


def _default(option: dict) -> str:
    if option.get("no_log"):
        return "(secret)" if "default" not in option or option["default"] in ("", None) else "(secret, set)"
    if "default" not in option:
        return ""
    value = option["default"]
    if value == "":
        return '`""`'
    if isinstance(value, str):
        return f"`{_cell(value)}`"
    flow = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
    return f"`{_cell(flow)}`"


def _description(option: dict) -> str:
    text = option.get("description", "")
    if isinstance(text, list):
        text = " ".join(text)
    if option.get("choices"):
        text += " Choices: " + ", ".join(f"`{c}`" for c in option["choices"]) + "."
    return _cell(text)


def table(role: Path) -> str:
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    lines = [BEGIN]
    for entry, spec in specs.items():
        if len(specs) > 1:
            lines += [f"Entry point `{entry}`:", ""]
        lines += ["| Variable | Type | Default | Description |", "|---|---|---|---|"]
        for name, option in (spec.get("options") or {}).items():
            kind = option.get("type", "str")
            if option.get("elements"):
                kind += f" of {option['elements']}"
            if option.get("required"):
                kind += ", required"
            lines.append(f"| `{name}` | {kind} | {_default(option)} | {_description(option)} |")
    lines.append(END)
    return "\n".join(lines)


def rendered(role: Path) -> str:
    readme = role / "README.md"
    text = readme.read_text() if readme.exists() else f"# {role.name}\n"
    generated = table(role)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + generated + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n## Variables\n\n" + generated + "\n"


def roles() -> list[Path]:
    return sorted(p.parents[1] for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is stale")
    args = parser.parse_args()
    stale = []
    for role in roles():
        want = rendered(role)
        readme = role / "README.md"
        if readme.exists() and readme.read_text() == want:
            continue
        if args.check:
            stale.append(str(readme.relative_to(ROOT)))
        else:
            readme.write_text(want)
    if stale:
        print("Not current with meta/argument_specs.yml: " + ", ".join(stale)
              + ". Run: .venv/bin/python tests/role_readme.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
