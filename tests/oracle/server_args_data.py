#!/usr/bin/env python3
"""Writes plugins/module_utils/sglang_args_<release>.py (0.5.23's as sglang_args_0_5_23.py) for every release
plugins/module_utils/sglang_releases.py supports: that SGLang's server arguments as data, read from its own parser
(driver.py's ``arguments`` op, in that release's oracle venv). tests/oracle/test_oracle.py checks each file against
its wheel; rerun this when a release is added to SUPPORTED (``make oracle-env`` first builds its venv):

    .venv/bin/python tests/oracle/server_args_data.py [VERSION]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import env  # noqa: E402
import oracle  # noqa: E402

MODULE_UTILS = env.ROOT / "plugins" / "module_utils"
WIDTH = 120  # ruff's line length (pyproject.toml); ansible-test's pep8 allows 160

HEADER = '''"""The server arguments of SGLang {version} (``ServerArgs.add_cli_args``), as data, for checking
``sglang_service_extra_flags`` on the controller before any host is contacted.

Generated from the sglang=={version} wheel's own parser by tests/oracle/server_args_data.py (rerun it:
``.venv/bin/python tests/oracle/server_args_data.py {version}``); tests/oracle/test_oracle.py fails when it no longer
matches the wheel. Do not edit by hand.

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


def target(version: str) -> Path:
    """The release's data file: sglang_args_0_5_23.py for 0.5.23."""
    return MODULE_UTILS / f"sglang_args_{version.replace('.', '_')}.py"


def current(version: str) -> str:
    """The release's file as its wheel's parser says it should be."""
    return render(oracle.ask([{"op": "arguments"}], version)[0], version)


def main(argv: list[str]) -> None:
    releases = env.supported()
    for version in argv or releases:
        if version not in releases:
            raise SystemExit(f"SGLang {version} is not a supported release; "
                             f"{env.RELEASES_FILE.relative_to(env.ROOT)} names {', '.join(releases)}.")
        target(version).write_text(current(version))
        print(f"wrote {target(version).relative_to(env.ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
