"""An attempt's output: pipes pumped into `stdout`, `stderr` and an interleaved `combined` file.

The pump creates the files at the first byte, reads both pipes as data arrives and appends to the files
unbuffered, so a reader sees every byte the moment it is written. It stops at EOF, or shortly after rank 0
exits when a daemonised child still holds the pipes open (its later output is not collected). It runs in a
thread of its own; or, for a launch that waits for its attempt, first in that request's thread (`pump_for`),
which hands it to a thread only if the attempt outlives the wait: a short job starts no thread.

Each file holds at most `max_bytes` (the pool's `max_output_bytes`): a stream that reaches it ends with a
marker line and the rest of its output is read and dropped, so the job goes on, its pipes never fill,
and neither the pod's disk nor the broker's log store gets more than the cap (docs/security.md).
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
STREAMS = ("combined", "stdout", "stderr")
EXIT_GRACE_S = 0.2
"""How long after rank 0's exit the pump keeps reading pipes that daemonised children hold open."""
_CHUNK = 1 << 16
DEFAULT_MAX_BYTES = 64 << 20
"""Per stream, when the launch names no `max_output_bytes` (a broker older than the cap)."""
MIN_MAX_BYTES = 4096
"""The smallest cap: room for the marker line and some output."""
MAX_MAX_BYTES = 1 << 40


def marker(cap: int) -> bytes:
    """The line that ends a stream cut at `cap` bytes (the broker writes the same one)."""
    return (f"\n[firepool: output truncated at {cap} bytes (the pool's max_output_bytes); "
            "the rest of this stream was discarded]\n").encode()


def cap_of(extra: Mapping[str, Any]) -> int:
    """The launch's per-stream cap (`extra.max_output_bytes`); ValueError when it is not a sane integer."""
    cap = extra.get("max_output_bytes", DEFAULT_MAX_BYTES)
    if isinstance(cap, bool) or not isinstance(cap, int) or not MIN_MAX_BYTES <= cap <= MAX_MAX_BYTES:
        raise ValueError(f"max_output_bytes must be an integer from {MIN_MAX_BYTES} to {MAX_MAX_BYTES}")
    return cap


class _Pipes:
    """What a pump reads: the selector over the pipes still open, and what runs when it stops."""

    def __init__(self, selector: selectors.BaseSelector, fds: list[int], done: Callable[[], None]) -> None:
        self.selector = selector
        self.fds = fds
        self.done = done
        self._all = tuple(fds)

    def close(self) -> None:
        self.selector.close()
        for fd in self._all:
            os.close(fd)


class Output:
    """The three log files of one attempt and their sizes; `changed` is called after every write."""

    def __init__(self, directory: Path, changed: Callable[[], None], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = directory
        self.sizes = dict.fromkeys(STREAMS, 0)
        self.max_bytes = max_bytes
        self._marker = marker(max_bytes)
        self.truncated: set[str] = set()
        """Streams that reached the cap (their file ends with the marker)."""
        self._changed = changed
        self._fds: dict[str, int] = {}
        self.created = False
        """True once the files exist, from the first byte on: a quiet attempt writes no file."""
        self.error: str | None = None
        """Why the files could not be written (output is then discarded)."""
        self.exited_at: float | None = None
        """Monotonic time rank 0 was reaped; set by the attempt, read by the pump."""
        self.kept: dict[str, bytes] | None = None
        """Every stream, held in memory across a reset that wiped the files (`Attempts.wait`'s `keep`)."""
        self._held: _Pipes | None = None
        """The pipes `pump(inline=True)` left for `pump_for` (`_taking`: one caller takes them)."""
        self._taking = threading.Lock()

    def pump(self, stdout_fd: int, stderr_fd: int, done: Callable[[], None],
             inline: bool = False) -> threading.Thread | None:
        """Pump the read ends of the two pipes; `done` runs when the pump stops. In a thread started now, or
        (`inline`) once its caller calls `pump_for`, which it must."""
        selector = selectors.DefaultSelector()
        selector.register(stdout_fd, selectors.EVENT_READ, "stdout")
        selector.register(stderr_fd, selectors.EVENT_READ, "stderr")
        pipes = _Pipes(selector, [stdout_fd, stderr_fd], done)
        if inline:
            self._held = pipes
            return None
        return self._in_thread(pipes)

    def pump_for(self, seconds: float) -> None:
        """Run the pump held for this call (`pump(inline=True)`) here for up to `seconds`, then in a thread if the
        pipes are still open. Once only: a later or concurrent call returns at once."""
        with self._taking:
            pipes, self._held = self._held, None
        if pipes is None:
            return
        try:
            ended = self._pump(pipes, time.monotonic() + seconds)
        except Exception:  # as a pump thread's would, it ends the pump only (closed, `done` called): the launch's
            log.exception("the output pump of %s failed", self.directory.name)  # answer still comes
            return
        if not ended:
            self._in_thread(pipes)  # the attempt outlived the wait

    def _in_thread(self, pipes: _Pipes) -> threading.Thread:
        thread = threading.Thread(target=self._pump, args=(pipes, None), name=f"pump-{self.directory.name}",
                                  daemon=True)
        thread.start()
        return thread

    def _create(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in STREAMS:
                self._fds[name] = os.open(os.path.join(self.directory, name),
                                          os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            self.created = True
        except OSError as exc:
            self.close()
            self.error = f"cannot write the attempt's logs: {exc}"

    def _pump(self, pipes: _Pipes, deadline: float | None) -> bool:
        """Read until the pipes end (then close everything and call `done`: True) or `deadline` passes (False)."""
        ended = True
        try:
            while pipes.fds:
                now = time.monotonic()
                timeout = 0.05
                if self.exited_at is not None:
                    left = self.exited_at + EXIT_GRACE_S - now
                    if left <= 0:
                        break
                    timeout = min(timeout, left)
                if deadline is not None:
                    if now >= deadline:
                        ended = False
                        return False
                    timeout = min(timeout, deadline - now)
                for key, _ in pipes.selector.select(timeout):
                    data = os.read(key.fd, _CHUNK)
                    if not data:
                        pipes.selector.unregister(key.fd)
                        pipes.fds.remove(key.fd)
                        continue
                    self._append(key.data, data)
            return True
        finally:
            if ended:
                pipes.close()
                self.close()
                pipes.done()

    def close(self) -> None:
        """Close the files; idempotent (the pump calls it when it stops, a failed launch directly)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def _append(self, stream: str, data: bytes) -> None:
        if not self.created and not self.error:
            self._create()
        if self.error:
            return  # keep draining so the job never blocks on a full pipe
        wrote = False
        try:
            for name in (stream, "combined"):
                if name in self.truncated:
                    continue  # read and dropped: the job keeps running and never blocks on a full pipe
                room = self.max_bytes - len(self._marker) - self.sizes[name]
                part = data if len(data) <= room else data[:max(0, room)] + self._marker
                self._write(self._fds[name], part)
                if len(data) > room:
                    self.truncated.add(name)
                # Sizes grow only after the bytes are in the files, so a reader never reads past them.
                self.sizes[name] += len(part)
                wrote = True
        except OSError as exc:
            # The logs live on the pod's capped disk, which the job may have filled: what was written stays
            # readable, the rest is drained and dropped rather than ending the pump (and the job's pipes).
            self.error = f"the attempt's logs stopped at {self.sizes['combined']} bytes: {exc.strerror}"
        if wrote:
            self._changed()

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def read(self, stream: str, offset: int, max_bytes: int) -> bytes:
        """Up to `max_bytes` from `offset` of a stream, never past what the pump has written."""
        end = min(self.sizes[stream], offset + max_bytes)
        if self.kept is not None:
            return self.kept[stream][offset:end]
        if end <= offset:
            return b""
        fd = os.open(os.path.join(self.directory, stream), os.O_RDONLY | os.O_CLOEXEC)  # FileNotFoundError once reset
        try:
            return os.pread(fd, end - offset, offset) if end > offset else b""
        finally:
            os.close(fd)
