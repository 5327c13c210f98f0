"""The host's side of a pod's resource limits: how much RAM the host has (the default memory cap).

A pool's limit values themselves are read and checked by `broker.podtemplate` (when the catalog loads).
"""

from __future__ import annotations

from pathlib import Path


def host_memory(meminfo: str | None = None) -> int | None:
    """The host's RAM in bytes (MemTotal), None when /proc/meminfo cannot tell."""
    try:
        text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "MemTotal:" and parts[1].isdigit():
            return int(parts[1]) * 1024
    return None
