"""Simulated SGLang for the moefleet lab (not the real SGLang). See README.md."""

SIMULATED = True


def __getattr__(name: str):
    # __version__ is the release this simulator is (its distribution's version, _sim/release.py), looked up when
    # asked so that importing the package never fails on a release it cannot be: the server says why instead.
    if name == "__version__":
        from sglang._sim.release import current
        return current()
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")
