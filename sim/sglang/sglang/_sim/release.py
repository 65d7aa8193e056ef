"""Which SGLang release this simulator stands in for.

The lab's package index serves the same source as two distributions, ``sglang-0.5.10+moefleetsim`` and
``sglang-0.5.23+moefleetsim`` (sim/mirrors/build.py): an installed simulator is the release its own distribution
metadata names (``importlib.metadata``, the local label left out), as real SGLang's ``__version__`` is. Run from the
source tree (the tests: ``PYTHONPATH=sim/sglang``) there is no distribution to ask: it is the release
sim/sglang/pyproject.toml names, or the one the sim-only variable ``SGLANG_SIM_RELEASE`` names. The variable is
ignored by an installed simulator, whose release only pip changes, as on a real host.

Where the two releases' code differs (flags, defaults, log lines, /server_info, /v1/loads), the simulator follows
the release it is; README.md ("Releases") lists what differs.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from pathlib import Path

# The releases the simulator can be, oldest first; sim/sglang/pyproject.toml's [tool.moefleet-sim] releases, which
# the mirror build makes a wheel of each, must name the same (tests/sim/test_releases.py).
RELEASES = ("0.5.10", "0.5.23")
ENV = "SGLANG_SIM_RELEASE"
# sim/sglang when run from the source tree; an installed package's site-packages/.. holds no pyproject.toml
_SOURCE_TREE = Path(__file__).resolve().parents[2]


class UnknownRelease(RuntimeError):
    """The simulator was asked to be a release it has no behaviour for."""


def _source_tree_version() -> str | None:
    """The version sim/sglang/pyproject.toml names, when this package runs from that tree; else None."""
    try:
        text = (_SOURCE_TREE / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    if not re.search(r'^name\s*=\s*"sglang"\s*$', text, re.M):
        return None
    match = re.search(r'^version\s*=\s*"([^"]+)"\s*$', text, re.M)
    return match.group(1) if match else None


@functools.cache
def current() -> str:
    """This simulator's release, e.g. "0.5.23"; UnknownRelease (with a sentence) for one it cannot be."""
    version = _source_tree_version()
    if version is not None:
        where = f"{ENV} ({os.environ[ENV]!r})" if os.environ.get(ENV) else f"{_SOURCE_TREE / 'pyproject.toml'}"
        version = os.environ.get(ENV) or version
    else:
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            raise UnknownRelease("the simulated sglang package is neither installed (no sglang distribution "
                                 "metadata) nor run from its source tree (sim/sglang with its pyproject.toml); "
                                 "install a wheel the lab's mirror build made, or put sim/sglang on PYTHONPATH."
                                 ) from None
        where = "the installed sglang distribution"
    release = version.split("+", 1)[0].strip()
    if release not in RELEASES:
        raise UnknownRelease(f"{where} names SGLang {release}, which the simulator cannot be; it simulates "
                             f"{', '.join(RELEASES)}.")
    return release


def at_least(release: str) -> bool:
    """Whether this simulator is ``release`` or a later one."""
    return RELEASES.index(current()) >= RELEASES.index(release)
