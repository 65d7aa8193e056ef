"""sglang.version as in SGLang: ``__version__``, the release this simulator is (_sim/release.py)."""

from sglang._sim.release import current

__version__ = current()
