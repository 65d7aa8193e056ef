"""The repository is the collection moefleet.serving: its logic is imported one way and its plugins are
called by their FQCN.

Python files import module_utils only as ``ansible_collections.moefleet.serving.plugins.module_utils.<name>``
(the modules, the filters, the CLI, the tests, the simulator): never ``ansible.module_utils.<ours>``, a bare
``import planner`` after a ``sys.path`` edit, ``plugins.module_utils`` from the repository root, or the old
``moefleet.logic`` package. Task files, playbooks and molecule scenarios call the collection's modules and
filters as ``moefleet.serving.<name>``.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import yaml

import moefleet

ROOT = Path(__file__).resolve().parents[2]
# Installed or generated trees, and the link back to this directory under .ansible/.
SKIPPED_DIRS = {".git", ".venv", ".lab", ".ansible", ".cache", ".pytest_cache", ".ruff_cache", "reports",
                "__pycache__", "context"}
THIS_FILE = Path(__file__).resolve()

UTILS = sorted(p.stem for p in (ROOT / "plugins" / "module_utils").glob("*.py") if p.stem != "__init__")
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))
FILTERS = sorted(
    name
    for path in (ROOT / "plugins" / "filter").glob("*.py")
    for name in importlib.import_module(f"ansible_collections.moefleet.serving.plugins.filter.{path.stem}")
    .FilterModule().filters()
)

_UTIL_NAMES = "|".join(UTILS)
OLD_PYTHON_FORMS = {
    "ansible.module_utils.<ours>": re.compile(rf"\bansible\.module_utils\.({_UTIL_NAMES})\b"),
    "a bare import of a module_utils file": re.compile(rf"^\s*(from|import)\s+({_UTIL_NAMES})\b", re.M),
    "plugins.module_utils from the repository root": re.compile(r"^\s*(from|import)\s+plugins\.", re.M),
    "the moefleet.logic package": re.compile(r"\bmoefleet\.logic\b"),
    "a sys.path edit aimed at plugins/": re.compile(r"sys\.path\.(insert|append)\(.*plugins", re.M),
    "a hand-built loader of ansible.module_utils": re.compile(r"spec_from_file_location\([\"']ansible\.module_utils"),
}

UNQUALIFIED_MODULE = re.compile(rf"^\s*(- )?({'|'.join(MODULES)}):", re.M)
UNQUALIFIED_FILTER = re.compile(rf"\|\s*(moefleet_)?({'|'.join(FILTERS)})\b(?!\.)")


def files(suffixes: tuple[str, ...], under: list[str] | None = None) -> list[Path]:
    """Files with these suffixes under ROOT (or the given paths), outside installed and generated trees."""
    found = []
    for start in [ROOT / u for u in (under or ["."])]:
        if start.is_file():
            found.append(start)
            continue
        # os.walk, pruned before descending: the suite runs this while a lab job builds a root filesystem
        # under .lab/, whose /proc entries come and go mid-scan.
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
            found.extend(Path(dirpath) / name for name in filenames if Path(name).suffix in suffixes)
    return sorted(set(found))


def test_the_scans_see_the_utils_modules_and_the_repositorys_files():
    assert {"planner", "profiles", "rollback", "sglang_log", "gpu_facts", "model_files"} <= set(UTILS)
    assert "sglang_readiness" in MODULES and "resolve_profiles" in MODULES
    assert {"plan", "next_step", "origins"} <= set(FILTERS)
    assert len(files((".py",))) > 50
    assert not any(".ansible" in p.parts for p in files((".py", ".yml")))


def test_python_imports_module_utils_one_way():
    found = []
    for path in files((".py",)):
        if path == THIS_FILE:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for what, pattern in OLD_PYTHON_FORMS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not found, "import as ansible_collections.moefleet.serving.plugins.module_utils.<name>:\n" + "\n".join(found)


def test_tasks_and_playbooks_call_the_collections_plugins_by_fqcn():
    found = []
    for path in files((".yml", ".yaml", ".j2"), ["roles", "playbooks", "deploy.yml", "molecule"]):
        rel = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        for pattern, kind in ((UNQUALIFIED_MODULE, "module"), (UNQUALIFIED_FILTER, "filter")):
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{rel}:{line}: {kind} {match.group(2)} without moefleet.serving.")
    assert not found, "call the collection's plugins by FQCN:\n" + "\n".join(found)


def test_the_fqcn_scan_catches_the_old_names():
    assert UNQUALIFIED_MODULE.search("- name: x\n  sglang_readiness:\n    unit: sglang.service\n")
    assert UNQUALIFIED_FILTER.search("{{ a | moefleet_next_step(b) }}")
    assert UNQUALIFIED_FILTER.search("{{ a | plan(8) }}")
    assert not UNQUALIFIED_MODULE.search("  moefleet.serving.sglang_readiness:\n")
    assert not UNQUALIFIED_FILTER.search("{{ a | moefleet.serving.next_step(b) | moefleet.serving.plan(8) }}")
    assert not UNQUALIFIED_FILTER.search("{{ x | history_len }}")


def test_galaxy_yml_names_the_collection_at_the_clis_version():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("moefleet", "serving")
    assert galaxy["version"] == moefleet.__version__
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=2.19.0"


def test_the_cli_finds_the_collection_it_imports():
    from moefleet import collection

    assert collection.ROOT == ROOT
    assert collection.CATALOG.is_file() and collection.SCHEMA.is_file()
    assert (collection.PLAYBOOKS / "rollout.yml").is_file()
