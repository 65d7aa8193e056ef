"""How the tests, the molecule scenarios' testinfra tests and the bench run a playbook: the repository's
ansible-playbook and ansible.cfg, from the repository root, output captured without colour (molecule
exports ANSIBLE_FORCE_COLOR=true, which wins over ANSIBLE_NOCOLOR, so it is turned off explicitly)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_playbook(inventory: str | Path, playbook: str, *extra_vars: str, options: tuple[str, ...] = (),
                 timeout: float | None = None) -> subprocess.CompletedProcess:
    """``ansible-playbook -i INVENTORY ROOT/PLAYBOOK -e V ... OPTIONS``; text output captured."""
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(ROOT / playbook)]
    for value in extra_vars:
        cmd += ["-e", value]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run([*cmd, *options], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
