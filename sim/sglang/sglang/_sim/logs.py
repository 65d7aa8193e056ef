"""SGLang's log format: `[%(asctime)s{prefix}] %(message)s`, datefmt `%Y-%m-%d %H:%M:%S`, to stderr.

Timestamps follow the simulated clock: the wall time the server started plus simulated seconds elapsed.
"""

from __future__ import annotations

import os
import sys
import time

from .clock import Clock


def emit(text: str) -> None:
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "replace")
    fd = sys.stderr.fileno()
    while data:
        n = os.write(fd, data)
        data = data[n:]


def line(clock: Clock, prefix: str, msg: str) -> None:
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock.sim_epoch()))
    emit(f"[{ts}{prefix}] {msg}")
