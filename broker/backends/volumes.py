"""The pool's kept and wiped paths on the local backend, as bind mounts of host directories.

A `keep_paths` entry (a uv/pip cache, a model or compile cache) is a host directory private to the pod
(`pods/<name>/kept/`) that resets leave alone; its content outlives the pod in the pod's caller's own
store (`broker.backends.kept`), never in a directory another caller's pod binds. A
`wipe_paths` entry is a directory private to the pod (`pods/<name>/volumes/`), which every reset
empties. Both are writable by the sandbox uid; reset leaves mount points and kept paths alone. A path
the pool's template already binds is the operator's own volume and gets nothing more.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from broker.backends.kept import KEPT_DIR
from broker.backends.sandboxing import (
    SANDBOX_DEPS,
    SANDBOX_PKG,
    SANDBOX_RUN,
    SANDBOX_WORKSPACE,
    Bind,
    PodDirs,
)
from broker.pools import PoolSpec

_RESERVED = ("/", "/proc", "/dev", "/usr", "/etc", "/tmp", "/dev/shm", SANDBOX_WORKSPACE, SANDBOX_PKG,
             SANDBOX_RUN, SANDBOX_DEPS)


def kept_slugs(pool: PoolSpec) -> list[str]:
    """The host directory names of the pool's kept paths (under a pod's and a caller's cache root)."""
    return [_slug(os.path.normpath(p)) for p in pool.keep_paths]


def _slug(path: str) -> str:
    readable = path.strip("/").replace("/", "_")[:40] or "root"
    return f"{readable}.{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def shared_dir(state_dir: Path, pool: str, path: str) -> Path:
    """The host directory of a pool's `shared_paths` entry: filled by the operator, read-only in every pod."""
    return state_dir / "caches" / pool / "shared" / _slug(os.path.normpath(path))


def volume_binds(state_dir: Path, pool: PoolSpec, dirs: PodDirs, template: tuple[Bind, ...] = ()) -> tuple[Bind, ...]:
    """Binds for the pool's keep, wipe (writable) and shared (read-only) paths; ValueError for a path a pod
    cannot own or one listed twice."""
    binds = []
    bound = [b.dst for b in template]
    listed = [os.path.normpath(p) for p in (*pool.keep_paths, *pool.wipe_paths, *pool.shared_paths)]
    if len(set(listed)) < len(listed):
        raise ValueError("a path is listed twice among keep_paths, wipe_paths and shared_paths")
    for paths, root in ((pool.keep_paths, dirs.root / KEPT_DIR), (pool.wipe_paths, dirs.volumes)):
        for raw in paths:
            path = os.path.normpath(raw)
            if path in _RESERVED:
                raise ValueError(f"{raw} is reserved and cannot be a kept or wiped volume")
            if any(path == dst or path.startswith(dst.rstrip("/") + "/") for dst in bound):
                continue
            binds.append(Bind(str(root / _slug(path)), path, ro=False))
    for raw in pool.shared_paths:
        path = os.path.normpath(raw)
        if path in _RESERVED:
            raise ValueError(f"{raw} is reserved and cannot be a shared cache")
        if not any(path == dst or path.startswith(dst.rstrip("/") + "/") for dst in bound):
            binds.append(Bind(str(shared_dir(state_dir, pool.name, path)), path, ro=True))
    return tuple(binds)


def make_volume_dirs(binds: tuple[Bind, ...], uid: int | None) -> None:
    """Create the host side of each volume (owned by the sandbox uid); kept ones may exist already."""
    for bind in binds:
        src = Path(bind.src)
        src.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not src.exists() and bind.ro:
            src.mkdir(mode=0o755)  # a shared cache: the broker's, filled by the operator, read by every pod
        elif not src.exists():
            src.mkdir(mode=0o700)
            if uid is not None:
                os.chown(src, uid, uid)
