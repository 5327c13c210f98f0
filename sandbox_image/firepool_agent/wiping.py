"""Emptying directories fast and without following links, then proving they are empty.

Every step works relative to an open directory fd with O_NOFOLLOW, so a job that swaps a directory
for a symlink mid-wipe cannot steer the agent outside the directory it was asked to empty. Paths
listed in `keep` (and the directories leading to them) survive, and so does every mount point inside
the wiped directory (the sandbox's own binds, e.g. a venv that lives under /tmp on the host): they are
the pod's, not the job's. A job may have made its directories read-only or unreadable; they are ours,
so the wipe opens them up instead of giving up.
"""

from __future__ import annotations

import errno
import os
import select
import threading

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PERMISSION = (errno.EACCES, errno.EPERM)


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


class _MountTable:
    """This mount namespace's mount points, read again only when the kernel says the table changed: an open
    /proc/self/mountinfo polls POLLPRI after any mount or unmount (proc(5)), and polling clears it. A reset asks
    for every directory it wipes; each question costs one poll(2), not a read and parse of the whole table."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._poll = select.poll()
        self._points: tuple[str, ...] = ()
        self._under: dict[str, tuple[str, ...]] = {}
        """`under`'s answers for this reading of the table (a reset asks the same few directories each time)."""

    def under(self, path: str) -> tuple[str, ...]:
        """Mount points strictly inside `path`."""
        with self._lock:
            if self._fd is None:
                try:
                    self._fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return ()
                self._poll.register(self._fd, select.POLLPRI)
                self._reread(self._fd)
            elif self._poll.poll(0):
                self._reread(self._fd)
            found = self._under.get(path)
            if found is None:
                found = self._under[path] = tuple(m for m in self._points if m != path and _under(m, path))
            return found

    def _reread(self, fd: int) -> None:
        self._points = self._read(fd)
        self._under = {}

    @staticmethod
    def _read(fd: int) -> tuple[str, ...]:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        text = b"".join(chunks).decode(errors="surrogateescape")
        return tuple(_unescape(line.split(" ", 5)[4]) for line in text.splitlines())


_mounts = _MountTable()


def mounts_under(path: str) -> tuple[str, ...]:
    """Mount points strictly inside `path`, from /proc/self/mountinfo (jobs cannot mount: no caps)."""
    return _mounts.under(path)


def empty_dir(path: str, keep: tuple[str, ...] = ()) -> list[str]:
    """Remove everything inside `path` except `keep` paths and mount points; returns problems (empty when it worked)."""
    path = os.path.normpath(path)
    keep = keep + mounts_under(path)
    if any(_under(path, k) for k in keep):
        return []
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"{path}: cannot open: {exc.strerror}"]
    problems: list[str] = []
    try:
        _empty(fd, path, tuple(k for k in keep if _under(k, path)), problems)
    finally:
        os.close(fd)
    return problems


def _empty(fd: int, path: str, keep: tuple[str, ...], problems: list[str]) -> None:
    try:
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    except OSError as exc:
        problems.append(f"{path}: cannot list: {exc.strerror}")
        return
    opened_up = False
    for name, is_dir in entries:
        child = f"{path}/{name}"
        inner_keep: tuple[str, ...] = ()
        if keep:
            if any(_under(child, k) for k in keep):
                continue
            inner_keep = tuple(k for k in keep if _under(k, child))
        try:
            try:
                _remove(fd, name, child, is_dir, inner_keep, problems)
            except OSError as exc:
                if exc.errno not in _PERMISSION or opened_up:
                    raise
                os.fchmod(fd, 0o700)  # the directory was made read-only: writable again, then retry
                opened_up = True
                _remove(fd, name, child, is_dir, inner_keep, problems)
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"{child}: {exc.strerror}")


def _remove(parent_fd: int, name: str, path: str, is_dir: bool, keep: tuple[str, ...],
            problems: list[str]) -> None:
    if not is_dir:
        try:
            os.unlink(name, dir_fd=parent_fd)
            return
        except IsADirectoryError:
            pass  # replaced by a directory since the listing
    try:
        fd = _open_dir(parent_fd, name)
    except (NotADirectoryError, OSError) as exc:
        if isinstance(exc, NotADirectoryError) or exc.errno == errno.ELOOP:
            os.unlink(name, dir_fd=parent_fd)  # replaced by a file or symlink: remove the link itself
            return
        raise
    try:
        _empty(fd, path, keep, problems)
    finally:
        os.close(fd)
    if not keep:
        os.rmdir(name, dir_fd=parent_fd)


def _open_dir(parent_fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        # Unreadable (mode 000) but ours: chmod through an O_PATH handle, which cannot be a symlink.
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        finally:
            os.close(handle)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def leftovers(path: str, keep: tuple[str, ...] = (), limit: int = 5) -> list[str]:
    """Entries still inside `path` (outside `keep`), the proof of a wipe; at most `limit` of them."""
    found: list[str] = []
    path = os.path.normpath(path)
    keep = keep + mounts_under(path)
    if any(_under(path, k) for k in keep):
        return found
    try:
        with os.scandir(path) as it:
            for entry in it:
                child = f"{path}/{entry.name}"
                if any(_under(child, k) for k in keep):
                    continue
                if any(_under(k, child) for k in keep) and entry.is_dir(follow_symlinks=False):
                    found.extend(leftovers(child, keep, limit - len(found)))
                else:
                    found.append(child)
                if len(found) >= limit:
                    break
    except FileNotFoundError:
        pass
    except OSError as exc:
        found.append(f"{path} ({exc.strerror})")
    return found
