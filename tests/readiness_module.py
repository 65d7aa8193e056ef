"""How the tests and the bench run plugins/modules/sglang_readiness.py outside Ansible: as Ansible's
module_utils loader would, making the classifier importable as ansible.module_utils.sglang_log, then
running the module as __main__ with its args file as argv[1]."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "plugins" / "modules" / "sglang_readiness.py"
CLASSIFIER = ROOT / "plugins" / "module_utils" / "sglang_log.py"

BOOT = """
import importlib.util, runpy, sys
import ansible.module_utils
spec = importlib.util.spec_from_file_location("ansible.module_utils.sglang_log", sys.argv[2])
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
ansible.module_utils.sglang_log = mod
sys.argv = [sys.argv[3], sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def module_command(args_file: Path) -> list[str]:
    """The command line that runs the module with the JSON args in args_file."""
    return [sys.executable, "-c", BOOT, str(args_file), str(CLASSIFIER), str(MODULE)]
