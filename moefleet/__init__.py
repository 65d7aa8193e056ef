"""moefleet: serve giant MoE models with SGLang on PCIe-only Blackwell fleets."""

__version__ = "0.1.0"

# First, before any command imports the collection's logic: makes moefleet.serving importable (see collection.py).
from moefleet import collection  # noqa: E402, F401
