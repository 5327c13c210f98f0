"""A pod's resource limits, read from its pool: template keys, their units and their defaults.

    template: {memory: 4Gi, pids: 512, cpus: 2, workspace_size: 10Gi, tmp_size: 1Gi, shm_size: 1Gi}

Sizes are bytes (an integer) or a string with a binary (Ki, Mi, Gi, Ti) or decimal (K, M, G, T) suffix;
`null` lifts a limit. `cpus` defaults to the pool's own `cpus` (the unit of CPU budgets) and `memory`
to half of the host's RAM, so that no single pod can take the host down.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 1 << 30
DEFAULT_PIDS = 4096
DEFAULT_WORKSPACE = 10 * GiB
DEFAULT_TMP = 1 * GiB
DEFAULT_SHM = 1 * GiB
MIN_DISK = 16 << 20
"""The smallest workspace image mkfs.ext4 makes without complaint."""
KEYS = ("memory", "pids", "cpus", "workspace_size", "tmp_size", "shm_size")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?B?\s*$")
_UNITS = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


@dataclass(frozen=True)
class Limits:
    """What one pod may use; None is unlimited."""

    memory: int | None = None
    """Bytes of RAM (and tmpfs pages) for the pod's processes, swap excluded (the template default: half of
    the host's RAM)."""
    pids: int | None = DEFAULT_PIDS
    """Processes and threads alive at once in the pod."""
    cpus: float | None = None
    """CPU time as cores (a quota per 100 ms period)."""
    workspace_size: int | None = DEFAULT_WORKSPACE
    """Bytes of the pod's disk: /workspace, /pkg, the requirements dir and the pool's wipe paths."""
    tmp_size: int | None = DEFAULT_TMP
    """Bytes of the private /tmp tmpfs."""
    shm_size: int | None = DEFAULT_SHM
    """Bytes of the private /dev/shm tmpfs."""


def parse_size(raw: Any, key: str) -> int | None:
    """Bytes from an int or "4Gi"-style string; ValueError names the key."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise ValueError(f"template {key} must be a size such as 4Gi, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and (match := _SIZE.match(raw)):
        value = int(float(match.group(1)) * _UNITS.get(match.group(2) or "", 1))
    else:
        raise ValueError(f"template {key} must be a size such as 4Gi, got {raw!r}")
    if value <= 0:
        raise ValueError(f"template {key} must be positive, got {raw!r}")
    return value


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


def parse_limits(template: Mapping[str, Any], pool_cpus: float | None = None,
                 default_memory: int | None = None) -> Limits:
    """The pod limits a pool's template asks for; ValueError when a value is malformed."""
    pids = template.get("pids", DEFAULT_PIDS)
    if pids is not None and (isinstance(pids, bool) or not isinstance(pids, int) or pids < 8):
        raise ValueError(f"template pids must be an integer >= 8, got {pids!r}")
    cpus = template.get("cpus", pool_cpus)
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0.01 <= cpus <= 4096):
        raise ValueError(f"template cpus must be a number of cores in [0.01, 4096], got {cpus!r}")
    workspace = parse_size(template.get("workspace_size", DEFAULT_WORKSPACE), "workspace_size")
    if workspace is not None and workspace < MIN_DISK:
        raise ValueError(f"template workspace_size must be at least {MIN_DISK >> 20}Mi, got {workspace}")
    return Limits(memory=parse_size(template.get("memory", default_memory), "memory"), pids=pids,
                  cpus=float(cpus) if cpus is not None else None, workspace_size=workspace,
                  tmp_size=parse_size(template.get("tmp_size", DEFAULT_TMP), "tmp_size"),
                  shm_size=parse_size(template.get("shm_size", DEFAULT_SHM), "shm_size"))
