"""moefleet: serve giant MoE models with SGLang on PCIe-only Blackwell fleets."""

__version__ = "0.1.0"
