"""A leftover scheduler process holding GPU memory (sgl-project/sglang#23627).

Double-forks into its own session, ignores SIGTERM/SIGHUP/SIGINT (only SIGKILL ends it), names itself
`sglang::scheduler_TP0` and holds `mib` MiB on each of `gpus` until killed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from . import gpu as G
from .rank import set_title


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    title = "sglang::scheduler_TP0"
    set_title(title)
    G.write_state(os.getpid(), title, {int(g): int(cfg["mib"]) * G.MiB for g in cfg["gpus"]}, {"stale": True})
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
