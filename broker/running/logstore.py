"""Attempt logs on disk under the state dir: `<root>/by-caller/<caller key>/<job-id>/<n>.<stream>.log`.

The caller key is a digest of the caller's name (names never reach paths), so retention can weigh each
caller's logs by walking one directory. A stream copied in pieces goes to `<n>.<stream>.part` and is
renamed into place whole, so a reader never sees half a copy. Logs written before logs were kept per
caller (`<root>/<job-id>/`) are still read, and removed by age.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import time
from pathlib import Path

from broker.ports.logs import StoredLogs

CALLERS = "by-caller"
"""Not a job id (those are alphanumeric), so it cannot collide with a logs directory of the old layout."""
LEGACY = "-"
"""The caller key of logs of the old layout."""
MARK = ".swept"
"""Per caller: the time of the newest log retention removed."""
COPYING_S = 600.0
"""A job whose `.part` file was written this recently is being copied: retention leaves it (a broker killed
mid-copy leaves a `.part` that ages past this and is then weighed like any log)."""


_STREAM = re.compile(r"(rank[0-9]+\.)?(combined|stdout|stderr)")
"""Rank 0's streams by name, another rank's as `rank<n>.<stream>` (broker.running.logcopy)."""


@functools.lru_cache(maxsize=4096)
def caller_key(caller: str) -> str:
    return hashlib.sha256(caller.encode()).hexdigest()[:24]


class FileLogStore:
    blocking = True

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, caller: str, attempt_id: str, stream: str, suffix: str = ".log") -> Path:
        job_id, _, n = attempt_id.partition(":")
        if not job_id.isalnum() or not n.isdigit() or not _STREAM.fullmatch(stream):
            raise ValueError(f"bad attempt id {attempt_id!r} or stream {stream!r}")
        return self.root / CALLERS / caller_key(caller) / job_id / f"{n}.{stream}{suffix}"

    def write(self, caller: str, attempt_id: str, stream: str, data: bytes) -> None:
        path = self._path(caller, attempt_id, stream)
        if not data:  # an empty log is no file (read answers b""): a quiet job costs no directory and no rename
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def append(self, caller: str, attempt_id: str, stream: str, data: bytes, *, first: bool) -> None:
        part = self._path(caller, attempt_id, stream, ".part")
        if first:
            part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "wb" if first else "ab") as f:
            f.write(data)

    def commit(self, caller: str, attempt_id: str, stream: str) -> None:
        part = self._path(caller, attempt_id, stream, ".part")
        path = part.with_suffix(".log")
        try:
            empty = part.stat().st_size == 0
        except FileNotFoundError:
            empty = True
        if empty:
            part.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
        else:
            os.replace(part, path)

    def read(self, caller: str, attempt_id: str, stream: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        path = self._path(caller, attempt_id, stream)
        legacy = self.root / path.parent.name / path.name
        for candidate in (path, legacy):
            try:
                with open(candidate, "rb") as f:
                    if offset >= os.fstat(f.fileno()).st_size:
                        return b""  # past the end; seeking there can fail (EINVAL beyond the filesystem's largest file)
                    f.seek(offset)
                    return f.read(max_bytes)
            except FileNotFoundError:
                continue
        return b""

    # ---------------------------------------------------------------- retention

    def usage(self) -> list[StoredLogs]:
        found: list[StoredLogs] = []
        callers = self.root / CALLERS
        for key in _entries(callers):
            found += _jobs(callers / key, key)
        found += _jobs(self.root, LEGACY, skip=CALLERS)
        return found

    def remove(self, logs: StoredLogs) -> None:
        job_dir = (self.root if logs.caller_key == LEGACY else self.root / CALLERS / logs.caller_key) / logs.job_id
        for name in _entries(job_dir):
            (job_dir / name).unlink(missing_ok=True)
        try:
            job_dir.rmdir()
        except OSError:
            pass  # a copy landed meanwhile: the next sweep weighs it
        if logs.caller_key != LEGACY and logs.written_at > self._mark(logs.caller_key):
            mark = self.root / CALLERS / logs.caller_key / MARK
            tmp = mark.with_suffix(".tmp")
            tmp.write_text(repr(logs.written_at))
            os.replace(tmp, mark)

    def swept_until(self, caller: str) -> float:
        return self._mark(caller_key(caller))

    def _mark(self, key: str) -> float:
        try:
            return float((self.root / CALLERS / key / MARK).read_text())
        except (OSError, ValueError):
            return 0.0


def _entries(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _jobs(directory: Path, key: str, skip: str = "") -> list[StoredLogs]:
    """Each job directory's bytes and newest write (a file removed meanwhile counts nothing)."""
    found = []
    for job_id in _entries(directory):
        if job_id == skip or not job_id.isalnum():
            continue
        size, newest, copying = 0, 0.0, False
        for name in _entries(directory / job_id):
            try:
                st = os.stat(directory / job_id / name)
            except FileNotFoundError:
                continue
            size += st.st_size
            newest = max(newest, st.st_mtime)
            copying = copying or (name.endswith(".part") and st.st_mtime > time.time() - COPYING_S)
        if newest and not copying:
            found.append(StoredLogs(key, job_id, size, newest))
    return found
