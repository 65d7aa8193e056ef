#!/usr/bin/env python3
"""Writes plugins/module_utils/sglang_server_args.py: the pinned SGLang's server arguments as data, read from its
own parser (driver.py's ``arguments`` op, in the oracle venv). tests/oracle/test_oracle.py checks the file
against the wheel; rerun this when roles/sglang/defaults/main.yml pins another release:

    .venv/bin/python tests/oracle/server_args_data.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import env  # noqa: E402
import oracle  # noqa: E402

TARGET = env.ROOT / "plugins" / "module_utils" / "sglang_server_args.py"
WIDTH = 120  # ruff's line length (pyproject.toml); ansible-test's pep8 allows 160

HEADER = '''"""The server arguments of SGLang {version} (``ServerArgs.add_cli_args``), as data, for checking
``sglang_service_extra_flags`` on the controller before any host is contacted.

Generated from the pinned wheel's own parser by tests/oracle/server_args_data.py; tests/oracle/test_oracle.py
fails when it no longer matches the wheel. Do not edit by hand.

ARGUMENTS: each argument by its name as moefleet writes flags (its first long option without dashes,
``-`` as ``_``): ``(kind, type, choices, options)``. kind: ``switch`` (a bare flag), ``value`` (one value) or
``list`` (one or more values); type: what argparse converts the value with (``int``, ``float``, ``str``, ``json``,
or SGLang's own converters by their function name); choices: the values argparse accepts, or None;
options: every spelling SGLang's parser takes.
"""

SGLANG_VERSION = "{version}"

ARGUMENTS = {{
'''


def render(arguments: dict, version: str) -> str:
    lines = [HEADER.format(version=version)]
    for name in sorted(arguments):
        a = arguments[name]
        choices = None if a["choices"] is None else tuple(a["choices"])
        line = f"    {name!r}: ({a['kind']!r}, {a['type']!r}, {choices!r}, {tuple(a['options'])!r}),\n"
        if len(line) <= WIDTH + 1:
            lines.append(line)
            continue
        # one item a line (a long list of choices, of spellings), within the line length of make lint
        lines.append(f"    {name!r}: (\n        {a['kind']!r}, {a['type']!r},\n")
        for items in (choices, tuple(a["options"])):
            if items is None:
                lines.append("        None,\n")
                continue
            lines.append("        (\n" + "".join(f"            {item!r},\n" for item in items) + "        ),\n")
        lines.append("    ),\n")
    lines.append("}\n")
    return "".join(lines)


def current() -> str:
    """The file as the wheel's parser says it should be."""
    return render(oracle.ask([{"op": "arguments"}])[0], env.pinned_version())


def main() -> None:
    TARGET.write_text(current())
    print(f"wrote {TARGET.relative_to(env.ROOT)}")


if __name__ == "__main__":
    main()
