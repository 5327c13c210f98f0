"""Attempt logs on disk under the state dir: `<root>/<job-id>/<n>.<stream>.log`."""

from __future__ import annotations

import os
from pathlib import Path


class FileLogStore:
    blocking = True

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, attempt_id: str, stream: str) -> Path:
        job_id, _, n = attempt_id.partition(":")
        if not job_id.isalnum() or not n.isdigit():
            raise ValueError(f"bad attempt id {attempt_id!r}")
        return self.root / job_id / f"{n}.{stream}.log"

    def write(self, attempt_id: str, stream: str, data: bytes) -> None:
        path = self._path(attempt_id, stream)
        if not data:  # an empty log is no file (read answers b""): a quiet job costs no directory and no rename
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def read(self, attempt_id: str, stream: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        try:
            with open(self._path(attempt_id, stream), "rb") as f:
                if offset >= os.fstat(f.fileno()).st_size:
                    return b""  # past the end; seeking there can fail (EINVAL beyond the filesystem's largest file)
                f.seek(offset)
                return f.read(max_bytes)
        except FileNotFoundError:
            return b""
