"""Process helpers for the tests and the bench that start the simulator (sim/sglang) as a local subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """Stop a simulator started with ``start_new_session=True``: SIGTERM, then SIGKILL for what is left of
    its process group (ranks die with the main process through PDEATHSIG; a straggler goes too)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(5)
