"""Firepool's control plane: a broker of warm, isolated GPU sandboxes."""

__version__ = "0.1.0"
