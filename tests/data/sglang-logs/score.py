"""The share of these logs the classifier labels as INDEX.tsv does; the held-out share apart.

    .venv/bin/python tests/data/sglang-logs/score.py

A log counts as right when the verdict's state gives its INDEX.tsv class (and, for an OOM with a
known phase, the same phase), read the way tests/unit/test_sglang_log.py reads it: a log labelled
`hang` is classified as silent for an hour, every other log as just written. The held-out logs are
listed in README.md; they were set aside before the classifier was changed for them.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from ansible_collections.moefleet.serving.plugins.module_utils.sglang_log import classify

HERE = Path(__file__).resolve().parent

PREFIX_OF_STATE = {"oom": "oom_", "crashed": "crash_", "hung": "hang", "ready": "ready", "starting": "starting"}


def held_out() -> set[str]:
    """The file names README.md lists under its held-out heading."""
    text = (HERE / "README.md").read_text(encoding="utf-8")
    section = text.split("## Held-out logs", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(\d\d-[^`]+\.log)`", section))


def right(row: dict) -> bool:
    label = row["class"]
    text = (HERE / row["file"]).read_text(encoding="utf-8")
    verdict = classify(text, idle_seconds=3600 if label == "hang" else None, hang_seconds=600)
    if not label.startswith(PREFIX_OF_STATE[verdict.state]):
        return False
    if label.startswith("oom_") and label != "oom_unknown_phase":
        return verdict.oom.phase == label[len("oom_") :]
    return True


def main() -> None:
    with open(HERE / "INDEX.tsv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    kept_aside = held_out()
    results = {row["file"]: right(row) for row in rows}
    for name, ok in sorted(results.items()):
        print(f"{'right' if ok else 'WRONG'}  {'held-out ' if name in kept_aside else '         '}{name}")
    held = [ok for name, ok in results.items() if name in kept_aside]
    print(f"held-out: {sum(held)}/{len(held)}; all: {sum(results.values())}/{len(results)}")


if __name__ == "__main__":
    main()
