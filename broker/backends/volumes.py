"""The pool's kept and wiped paths on the local backend, as bind mounts of host directories, and the
pod's capped disk.

A `keep_paths` entry (a uv/pip cache, a model or compile cache) is a host directory private to the pod
(`pods/<name>/kept/`) that resets leave alone; its content outlives the pod in the pod's caller's own
store (`broker.backends.kept`), never in a directory another caller's pod binds. A
`wipe_paths` entry is a directory private to the pod (`pods/<name>/volumes/`), which every reset
empties. Both are writable by the sandbox uid; reset leaves mount points and kept paths alone. A path
the pool's template already binds is the operator's own volume and gets nothing more.

The pod's disk (`pods/<name>/disk`: workspace, packages, requirements and wipe paths) is a sparse
ext4 image of `workspace_size` bytes, loop-mounted by the broker (root), so a job that fills it gets
ENOSPC while the host's disk keeps the rest; it takes only the blocks written. Without root, mkfs.ext4
or loop devices the disk is a plain directory, and the broker says so once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from broker.backends.sandboxing import PodDirs
from broker.podtemplate import RESERVED_VOLUMES, Bind
from broker.pools import PoolSpec

log = logging.getLogger(__name__)

_RESERVED = RESERVED_VOLUMES


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
    for paths, root in ((pool.keep_paths, dirs.kept), (pool.wipe_paths, dirs.volumes)):
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


def disk_capping() -> str | None:
    """None when pod disks can be capped here (root, mkfs.ext4, mount); otherwise why not."""
    if os.geteuid() != 0:
        return "the broker is not root (loop mounts need it)"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (apt-get install e2fsprogs mount)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control)"
    return None


def make_disk(dirs: PodDirs, size: int | None, uid: int | None, images: Path) -> None:
    """Create the pod's disk: a mounted image of `size` bytes, or a plain directory when `size` is None.

    The first pod of a size and owner pays for mkfs into `images/`; later ones copy that sparse image
    (its few MiB of metadata), which halves the cost. mkfs without a journal and with lazy inode
    tables: the image is private to one pod and dies with it, so crash consistency buys nothing.
    """
    dirs.disk.mkdir(mode=0o700)
    if size is None:
        return
    template = images / f"ext4-{size}-{uid if uid is not None else 'root'}.img"
    if not template.exists():
        images.mkdir(mode=0o700, exist_ok=True)
        fresh = images / f".{template.name}.{os.getpid()}.{id(dirs)}"
        with open(fresh, "wb") as f:
            f.truncate(size)
        owner = f",root_owner={uid}:{uid}" if uid is not None else ""
        try:
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                  "-E", f"lazy_itable_init=1,lazy_journal_init=1,nodiscard{owner}", str(fresh)])
            os.replace(fresh, template)  # atomic: a concurrent pod copies a whole image or makes its own
        finally:
            fresh.unlink(missing_ok=True)
    _run(["cp", "--sparse=always", str(template), str(dirs.disk_image)])
    _run(["mount", "-o", "loop,nodev,nosuid,noatime", str(dirs.disk_image), str(dirs.disk)])
    lost = dirs.disk / "lost+found"
    if lost.is_dir():
        lost.rmdir()  # nothing to recover on a disk that dies with its pod; its 0700 dir only confuses jobs
    os.chmod(dirs.disk, 0o700 if uid is None else 0o755)


def unmount_disk(dirs: PodDirs) -> None:
    """Unmount the pod's disk if mounted (lazily: a dying sandbox may still hold it); the image goes with
    the pod's directory, and the loop device frees itself (mount's autoclear) when the last user is gone."""
    if os.path.ismount(dirs.disk):
        _run(["umount", "--lazy", str(dirs.disk)])


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])} failed ({result.returncode}): "
                      f"{result.stderr.decode(errors='replace').strip()[:300]}")


def tree_bytes(root: Path, max_entries: int) -> int | None:
    """Bytes of the files under `root` (at most `max_entries` entries, links not followed); None without it.

    Blocking (a directory walk): call it on a thread."""
    if not root.is_dir():
        return None
    total, seen, stack = 0, 0, [str(root)]
    while stack and seen < max_entries:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # removed or unreadable meanwhile: count what is left
    return total
