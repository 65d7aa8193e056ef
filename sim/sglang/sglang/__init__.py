"""Simulated SGLang for the moefleet lab (not the real SGLang). See README.md."""

__version__ = "0.5.10"
SIMULATED = True
