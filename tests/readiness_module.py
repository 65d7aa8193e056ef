"""How the tests and the bench run the collection's sglang_readiness module outside Ansible: as the Python
module ansible_collections.moefleet.serving.plugins.modules.sglang_readiness (its module_utils import as
they do under Ansible), with its JSON args file as argv[1]."""

from __future__ import annotations

import sys
from pathlib import Path

MODULE = "ansible_collections.moefleet.serving.plugins.modules.sglang_readiness"


def module_command(args_file: Path) -> list[str]:
    """The command line that runs the module with the JSON args in args_file."""
    return [sys.executable, "-m", MODULE, str(args_file)]
