"""The CLI (moefleet/) imports the collection's logic from plugins/module_utils only, never a plugin: a callback,
module or filter is an entry point Ansible loads, and what the CLI shares with one lives in module_utils."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = "ansible_collections.moefleet.serving.plugins.module_utils"


def plugin_imports(source: str) -> list[str]:
    """Every module an import statement in source names under the collection's plugins/, except module_utils."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    ours = [name for name in names if name.startswith(("ansible_collections.moefleet.serving.plugins", "plugins."))]
    return sorted({name for name in ours if not name.startswith((ALLOWED, "plugins.module_utils"))})


@pytest.mark.parametrize("path", sorted((ROOT / "moefleet").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_cli_imports_no_plugin(path):
    assert plugin_imports(path.read_text(encoding="utf-8")) == [], f"{path.relative_to(ROOT)} imports a plugin"


@pytest.mark.parametrize("line", [
    "from ansible_collections.moefleet.serving.plugins.callback import moefleet_report",
    "from ansible_collections.moefleet.serving.plugins import callback",
    "import ansible_collections.moefleet.serving.plugins.modules.sglang_readiness",
    "from ansible_collections.moefleet.serving.plugins.filter.moefleet import FilterModule",
    "from plugins.filter import bench",
    "def f():\n    from ansible_collections.moefleet.serving.plugins.callback.moefleet_report import render_markdown\n",
])
def test_the_check_sees_a_plugin_import(line):
    assert plugin_imports(line)


def test_the_check_lets_module_utils_through():
    assert plugin_imports("from ansible.plugins.loader import init_plugin_loader") == []  # ansible-core's own
    assert plugin_imports(f"from {ALLOWED} import playbook_inputs\nimport {ALLOWED}.planner\n"
                          f"from {ALLOWED}.rollout_report import render_markdown\n") == []
