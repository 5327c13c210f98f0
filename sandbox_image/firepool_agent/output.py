"""An attempt's output: pipes pumped into `stdout`, `stderr` and an interleaved `combined` file.

One thread per attempt creates the files (off the launch path: the pipes buffer meanwhile), reads
both pipes as data arrives and appends to the files unbuffered, so a reader sees every byte the
moment it is written. The pump stops at EOF, or shortly after rank 0
exits when a daemonised child still holds the pipes open (its later output is not collected).
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from collections.abc import Callable
from pathlib import Path

STREAMS = ("combined", "stdout", "stderr")
EXIT_GRACE_S = 0.2
"""How long after rank 0's exit the pump keeps reading pipes that daemonised children hold open."""
_CHUNK = 1 << 16


class Output:
    """The three log files of one attempt and their sizes; `changed` is called after every write."""

    def __init__(self, directory: Path, changed: Callable[[], None]) -> None:
        self.directory = directory
        self.sizes = dict.fromkeys(STREAMS, 0)
        self._changed = changed
        self._fds: dict[str, int] = {}
        self.created = False
        """True once the files exist; before that every stream is empty."""
        self.error: str | None = None
        """Why the files could not be written (output is then discarded)."""
        self.exited_at: float | None = None
        """Monotonic time rank 0 was reaped; set by the attempt, read by the pump."""

    def pump(self, stdout_fd: int, stderr_fd: int, done: Callable[[], None]) -> threading.Thread:
        """Start the pump thread over the read ends of the two pipes; `done` runs when it stops."""
        thread = threading.Thread(target=self._pump, args=(stdout_fd, stderr_fd, done),
                                  name=f"pump-{self.directory.name}", daemon=True)
        thread.start()
        return thread

    def _create(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in STREAMS:
                self._fds[name] = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                                          0o600)
            self.created = True
        except OSError as exc:
            self.close()
            self.error = f"cannot write the attempt's logs: {exc}"

    def _pump(self, stdout_fd: int, stderr_fd: int, done: Callable[[], None]) -> None:
        self._create()
        selector = selectors.DefaultSelector()
        selector.register(stdout_fd, selectors.EVENT_READ, "stdout")
        selector.register(stderr_fd, selectors.EVENT_READ, "stderr")
        open_fds = 2
        try:
            while open_fds:
                timeout = 0.05
                if self.exited_at is not None:
                    left = self.exited_at + EXIT_GRACE_S - time.monotonic()
                    if left <= 0:
                        break
                    timeout = min(timeout, left)
                for key, _ in selector.select(timeout):
                    data = os.read(key.fd, _CHUNK)
                    if not data:
                        selector.unregister(key.fd)
                        open_fds -= 1
                        continue
                    self._append(key.data, data)
        finally:
            selector.close()
            os.close(stdout_fd)
            os.close(stderr_fd)
            self.close()
            done()

    def close(self) -> None:
        """Close the files; idempotent (the pump calls it when it stops, a failed launch directly)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def _append(self, stream: str, data: bytes) -> None:
        if not self.created:
            return  # keep draining so the job never blocks on a full pipe
        for name in (stream, "combined"):
            fd = self._fds[name]
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        # Sizes grow only after the bytes are in the files, so a reader never reads past them.
        self.sizes[stream] += len(data)
        self.sizes["combined"] += len(data)
        self._changed()

    def read(self, stream: str, offset: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` from `offset` of a stream, never past what the pump has written."""
        end = min(self.sizes[stream], offset + max_bytes)
        if not self.created:
            return b""
        fd = os.open(self.directory / stream, os.O_RDONLY | os.O_CLOEXEC)  # FileNotFoundError once reset
        try:
            return os.pread(fd, end - offset, offset) if end > offset else b""
        finally:
            os.close(fd)
