"""Where the embedded broker keeps its state and listens by default."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8321


def default_state_dir() -> Path:
    """`$XDG_DATA_HOME/firepool` (default `~/.local/share/firepool`)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "firepool"
