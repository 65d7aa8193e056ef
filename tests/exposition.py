"""A small reader of Prometheus's text exposition format, for the tests of the simulator's /metrics (tests/sim) and
of its comparison with SGLang's own collectors (tests/oracle): prometheus_client is not in the dev venv."""

from __future__ import annotations

import re

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def parse(text: str) -> dict[str, dict]:
    """{family: {"type", "help", "samples": [(name, {label: value}, float)]}}; fails on a line it cannot read, and on
    a TYPE line before its family's HELP (prometheus_client writes HELP first)."""
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            current = families.setdefault(name, {"type": None, "help": None, "samples": []})
            current["help"] = help_.replace("\\n", "\n").replace("\\\\", "\\")
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name in families, f"TYPE before HELP: {line}"
            families[name]["type"] = kind
        elif line == "# EOF":
            continue
        else:
            match = SAMPLE.match(line)
            assert match and current is not None, f"not a sample line: {line!r}"
            name, labels, value = match.groups()
            pairs = LABEL.findall(labels or "")
            assert ",".join(f'{k}="{v}"' for k, v in pairs) == (labels or ""), f"bad labels: {line!r}"
            current["samples"].append((name, dict(pairs), float(value)))
    return families
