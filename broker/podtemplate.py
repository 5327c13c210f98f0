"""A pool template's pod values that the broker reads itself, checked when the catalog loads.

    template: {memory: 4Gi, pids: 512, cpus: 2, workspace_size: 10Gi, tmp_size: 1Gi, shm_size: 1Gi,
               network: isolated, binds: [{src: /data, dst: /data, ro: true}], start_delay_s: 0}

Sizes are bytes (an integer) or a string with a binary (Ki, Mi, Gi, Ti) or decimal (K, M, G, T) suffix;
`null` lifts a limit. `cpus` defaults to the pool's own `cpus` (the unit of CPU budgets) and `memory`
to half of the host's RAM, so that no single pod can take the host down.

Pure (no I/O): `broker.pools` runs `check_template` on every pool when the catalog is read, so a value
that cannot work (`memory: 256Potatoes`) stops `firepool serve` (and a SIGHUP reload) with the pool,
the key and the value, instead of failing every pod create later while jobs wait. The local backend
reads the same values with the same functions, so nothing the catalog accepted is refused at create.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30
DEFAULT_PIDS = 4096
DEFAULT_WORKSPACE = 10 * GiB
DEFAULT_TMP = 1 * GiB
DEFAULT_SHM = 1 * GiB
MIN_DISK = 16 << 20
"""The smallest workspace image mkfs.ext4 makes without complaint."""
MIN_TMPFS = 1 << 20
"""A /tmp or /dev/shm below a MiB is a typo (`tmp_size: 64` bytes), not a choice."""
MIN_MEMORY = 32 << 20
"""Below this the agent itself (a Python process) cannot start, and every pod create fails."""
MAX_SIZE = 1 << 60
"""An exabyte: a larger size is a typo (and overflows the kernel's and mkfs's arithmetic)."""
KEYS = ("memory", "pids", "cpus", "workspace_size", "tmp_size", "shm_size")
NETWORK_MODES = ("none", "isolated", "host")
DEFAULT_NETWORK = "isolated"
RESERVED_DSTS = ("/", "/proc", "/dev", "/workspace", "/run/firepool", "/etc")
"""Where a template bind may not land: the sandbox's own mounts (broker.backends.sandboxing)."""

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
    """Bytes of the pod's disk: /workspace, /pkg, the agent's run dir (job logs), the requirements dir and
    the pool's keep and wipe paths."""
    tmp_size: int | None = DEFAULT_TMP
    """Bytes of the private /tmp tmpfs."""
    shm_size: int | None = DEFAULT_SHM
    """Bytes of the private /dev/shm tmpfs."""


@dataclass(frozen=True)
class Bind:
    src: str
    dst: str
    ro: bool = True


def parse_size(raw: Any, key: str, minimum: int = 1) -> int | None:
    """Bytes from an int or "4Gi"-style string; ValueError names the key and the value."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise ValueError(f"template.{key} must be a size such as 4Gi, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and (match := _SIZE.match(raw)):
        value = int(float(match.group(1)) * _UNITS.get(match.group(2) or "", 1))
    else:
        raise ValueError(f"template.{key} must be a size such as 4Gi, got {raw!r}")
    if value <= 0:
        raise ValueError(f"template.{key} must be positive, got {raw!r}")
    if value < minimum:
        raise ValueError(f"template.{key} must be at least {_human(minimum)}, got {raw!r}")
    if value > MAX_SIZE:
        raise ValueError(f"template.{key} must be at most 1Ei, got {raw!r}")
    return value


def _human(size: int) -> str:
    return f"{size >> 20}Mi" if size >= 1 << 20 else f"{size} bytes"


def parse_limits(template: Mapping[str, Any], pool_cpus: float | None = None,
                 default_memory: int | None = None) -> Limits:
    """The pod limits a pool's template asks for; ValueError when a value is malformed."""
    pids = template.get("pids", DEFAULT_PIDS)
    if pids is not None and (isinstance(pids, bool) or not isinstance(pids, int) or not 8 <= pids <= 1 << 22):
        raise ValueError(f"template.pids must be an integer in [8, 4194304], got {pids!r}")
    cpus = template.get("cpus", pool_cpus)
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0.01 <= cpus <= 4096):
        raise ValueError(f"template.cpus must be a number of cores in [0.01, 4096], got {cpus!r}")
    return Limits(memory=parse_size(template.get("memory", default_memory), "memory", MIN_MEMORY), pids=pids,
                  cpus=float(cpus) if cpus is not None else None,
                  workspace_size=parse_size(template.get("workspace_size", DEFAULT_WORKSPACE), "workspace_size",
                                            MIN_DISK),
                  tmp_size=parse_size(template.get("tmp_size", DEFAULT_TMP), "tmp_size", MIN_TMPFS),
                  shm_size=parse_size(template.get("shm_size", DEFAULT_SHM), "shm_size", MIN_TMPFS))


def parse_network(raw: Any) -> str:
    """`template.network`: "isolated" (the default), "none" or "host"; ValueError otherwise."""
    if raw is None:
        return DEFAULT_NETWORK
    if raw not in NETWORK_MODES:
        raise ValueError(f'template.network must be one of {", ".join(NETWORK_MODES)}, got {raw!r}')
    return str(raw)


def parse_binds(raw: Any) -> tuple[Bind, ...]:
    """`template.binds`: a list of {"src", "dst", "ro"}; raises ValueError when malformed."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("template.binds must be a list of {src, dst, ro}")
    binds = []
    for entry in raw:
        if not isinstance(entry, Mapping) or set(entry) - {"src", "dst", "ro"}:
            raise ValueError(f"template.binds: {entry!r} must have exactly src, dst and optionally ro")
        src, dst, ro = entry.get("src"), entry.get("dst"), entry.get("ro", True)
        if not (isinstance(src, str) and isinstance(dst, str) and src.startswith("/") and dst.startswith("/")):
            raise ValueError(f"template.binds: {entry!r}: src and dst must be absolute paths")
        if "\0" in src or "\0" in dst:
            raise ValueError(f"template.binds: {entry!r}: a path cannot hold NUL")
        if not isinstance(ro, bool):
            raise ValueError(f"template.binds: {entry!r}: ro must be a boolean")
        if os.path.normpath(dst) in RESERVED_DSTS:
            raise ValueError(f"template.binds: {entry!r}: {dst} is reserved")
        binds.append(Bind(os.path.normpath(src), os.path.normpath(dst), ro))
    return tuple(binds)


RESERVED_VOLUMES = ("/", "/proc", "/dev", "/usr", "/etc", "/tmp", "/dev/shm", "/workspace", "/pkg", "/run/firepool",
                    "/opt/firepool/deps")
"""Paths a pool's keep, wipe or shared path may not be: the sandbox's own mounts (broker.backends.volumes)."""


def check_volumes(keep: tuple[str, ...], wipe: tuple[str, ...], shared: tuple[str, ...]) -> None:
    """A pool's keep_paths, wipe_paths and shared_paths: none reserved, none listed twice; ValueError otherwise."""
    listed = [os.path.normpath(p) for p in (*keep, *wipe, *shared)]
    for raw, path in zip((*keep, *wipe, *shared), listed, strict=True):
        if path in RESERVED_VOLUMES:
            raise ValueError(f"{raw} is reserved and cannot be a kept, wiped or shared path")
    twice = sorted({p for p in listed if listed.count(p) > 1})
    if twice:
        raise ValueError(f"{twice[0]} is listed twice among keep_paths, wipe_paths and shared_paths")


def _seconds(template: Mapping[str, Any], key: str) -> None:
    value = template.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                              or not math.isfinite(value) or value < 0):
        raise ValueError(f"template.{key} must be a non-negative number of seconds, got {value!r}")


def _image(template: Mapping[str, Any]) -> None:
    image = template.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image)):
        raise ValueError(f"template.image must be an image reference without spaces, got {image!r}")


def check_template(template: Mapping[str, Any], pool_cpus: float | None = None) -> None:
    """Every value of `template` the broker reads, checked once; ValueError names the key and the value.

    Keys a backend reads on its own (the Kubernetes backend's `resources`, `volumes`, ...) are that
    backend's to check; a key written here is held to one meaning for every backend.
    """
    parse_limits(template, pool_cpus)
    parse_network(template.get("network"))
    parse_binds(template.get("binds"))
    for key in ("start_delay_s", "start_timeout_s"):
        _seconds(template, key)
    _image(template)
