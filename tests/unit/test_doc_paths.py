"""Every repository path that a document or comment names exists: a pointer such as `playbooks/tasks/preflight.yml`
left behind by a rename (or a test file that was merged away) fails here rather than sending a reader to nothing.

What is read: each text file of the repository (Markdown, YAML, Python, Jinja templates, the Makefile, ...), except
CHANGELOG.md, whose entries name the old paths of renames on purpose (and this file, which names stale ones). What
counts as a path: text that starts with one of the repository's top-level directories and ends in a file name with
an extension (`tests/unit/test_x.py`, `roles/sglang/defaults/main.yml`, `docs/bench.md`), and every relative
Markdown link. A path is found when it exists from the repository root, or from the mentioning file's directory or
one above it (`meta/argument_specs.yml` in a role's file, `tests/test_install.py` in a molecule scenario), or when
.gitignore names it (what a command writes, such as inventory/sim/hosts.yml). Placeholders (`roles/ROLE/...`) are
no path. The whole scan takes a fraction of a second.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = {".md", ".yml", ".yaml", ".py", ".j2", ".cfg", ".toml", ".txt", ".sh", ".json"}
NAMES = {"Makefile", "run"}  # .ci/run
# CHANGELOG.md names the old paths of renames on purpose, and this file stale ones to test the scan.
SKIP_FILES = {"CHANGELOG.md", "test_doc_paths.py"}
# Directories that are not the repository's (tools' caches, the lab's state) or that hold data, not prose.
SKIP_DIRS = {".git", ".venv", ".lab", ".ansible", ".pytest_cache", ".ruff_cache", "__pycache__", "reports",
             "moefleet.egg-info", "data"}
# Top-level directories a path may start with. meta/ is left out: a role has a meta/ of its own, and "its role's
# meta/argument_specs.yml" is no path of the collection's meta/ (which holds runtime.yml only).
TOPS = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in SKIP_DIRS
              and p.name != "meta") + [".ci"]
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, TOPS)) + r")/[\w.+-]+(?:/[\w.+-]+)*"
                  r"\.(?:py|yml|yaml|md|j2|json|sh|cfg|toml|txt|service|timer|example))(?![\w/])")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Paths that are named on purpose and are not the repository's, each with why.
ELSEWHERE = {
    "inventory/prod/": "the operator's own copy of inventory/example, which the README's commands create",
    "tests/library/ca_test_common.py": "ceph-ansible's, named as the model of tests/readiness_module.py",
    "roles/checked/tasks/main.yml": "a role tests/unit/test_task_trace.py writes for itself",
}


def _ignored_patterns() -> list[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


IGNORED = _ignored_patterns()


def is_ignored(path: str) -> bool:
    """Whether .gitignore names the path or a directory above it."""
    parts = path.split("/")
    for pattern in IGNORED:
        for end in range(1, len(parts) + 1):
            head = "/".join(parts[:end]) + ("/" if end < len(parts) else "")
            if fnmatch.fnmatch(head, pattern) or fnmatch.fnmatch(head.rstrip("/"), pattern.rstrip("/")):
                return True
    return False


def text_files() -> list[Path]:
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not (d.startswith(".") and d != ".ci")]
        for name in files:
            path = Path(top) / name
            if name not in SKIP_FILES and (path.suffix in SUFFIXES or name in NAMES):
                found.append(path)
    return sorted(found)


def is_found(path: str, mentioned_in: Path) -> bool:
    if any(path.startswith(prefix) for prefix in ELSEWHERE) or is_ignored(path):
        return True
    if any(part.isupper() for part in path.split("/")):  # roles/ROLE/..., a placeholder
        return True
    here = mentioned_in.parent
    while True:
        if (here / path).exists():
            return True
        if here == ROOT or ROOT not in here.parents:
            return False
        here = here.parent


def missing_paths(text: str, mentioned_in: Path) -> list[tuple[int, str]]:
    """(line, path) for each path the text names that is not found."""
    out = []
    for match in PATH.finditer(text):
        if not is_found(match.group(1), mentioned_in):
            out.append((text.count("\n", 0, match.start()) + 1, match.group(1)))
    if mentioned_in.suffix == ".md":
        for match in LINK.finditer(text):
            target = match.group(1)
            found = (text.count("\n", 0, match.start()) + 1, target)
            if not re.match(r"[a-z]+:", target) and not (mentioned_in.parent / target).exists() and found not in out:
                out.append(found)
    return out


def test_every_path_a_document_or_comment_names_exists():
    stale = []
    for file in text_files():
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        stale += [f"{file.relative_to(ROOT)}:{line}: {path}" for line, path in missing_paths(text, file)]
    assert stale == [], "point these at the file that exists now, or drop the pointer:\n" + "\n".join(stale)


@pytest.mark.parametrize(("text", "missing"), [
    ("the fit is checked in playbooks/tasks/preflight.yml first", ["playbooks/tasks/preflight.yml"]),
    ("see [the sweep](docs/no-such-page.md#top)", ["docs/no-such-page.md"]),
    ("(tests/unit/test_doc_paths.py, docs/bench.md and roles/sglang/defaults/main.yml)", []),
    ("each roles/ROLE/meta/argument_specs.yml; a run writes inventory/sim/hosts.yml", []),
    ("https://example.org/playbooks/gone.yml and /etc/playbooks/gone.yml are not the repository's", []),
])
def test_the_scan_finds_a_stale_pointer_and_only_that(text, missing):
    assert [path for _, path in missing_paths(text, ROOT / "README.md")] == missing


def test_a_path_relative_to_its_role_or_scenario_is_found():
    assert missing_paths("its meta/argument_specs.yml", ROOT / "roles" / "sglang" / "tasks" / "main.yml") == []
    assert missing_paths("(tests/test_install.py)", ROOT / "molecule" / "install" / "molecule.yml") == []
    assert missing_paths("(tests/test_gone.py)", ROOT / "molecule" / "install" / "molecule.yml") == [
        (1, "tests/test_gone.py")]
