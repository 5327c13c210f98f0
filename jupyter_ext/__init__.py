"""Jupyter kernel provisioner: a notebook kernel in a warm Firepool sandbox."""
