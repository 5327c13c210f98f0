"""The log store port: where the broker keeps each attempt's output once the pod is reset.

`FileLogStore` (the embedded default) lives in `broker.running.logstore`; `MemoryLogStore` is the fake.
Streams are `combined`, `stdout` and `stderr`. Logs are kept per caller, so retention can bound what each
caller keeps (`broker.running.logretention`). A stream of any size is stored in pieces (`append`, then
`commit`): the broker never holds a whole log in memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

STREAMS = ("combined", "stdout", "stderr")


@dataclass(frozen=True)
class StoredLogs:
    """The stored logs of one job: what retention weighs and removes."""

    caller_key: str
    """The store's name for the caller (a digest: caller names never reach paths)."""
    job_id: str
    size: int
    """Bytes of every stream of every attempt."""
    written_at: float
    """When the newest of them was written (epoch seconds)."""


class LogStore(Protocol):
    blocking: bool

    def write(self, caller: str, attempt_id: str, stream: str, data: bytes) -> None:
        """Store a whole (small) stream of a finished attempt, replacing any earlier copy."""
        ...

    def append(self, caller: str, attempt_id: str, stream: str, data: bytes, *, first: bool) -> None:
        """Add bytes to the stream's pending copy (`first` starts it afresh); readers see it after `commit`."""
        ...

    def commit(self, caller: str, attempt_id: str, stream: str) -> None:
        """The pending copy replaces the stored stream (an empty one removes it)."""
        ...

    def read(self, caller: str, attempt_id: str, stream: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        """Bytes from `offset`; empty when there is nothing (more)."""
        ...

    def usage(self) -> list[StoredLogs]:
        """Every job's stored logs, for retention."""
        ...

    def remove(self, logs: StoredLogs) -> None:
        """Delete one job's logs; the caller's sweep mark moves to their time."""
        ...

    def swept_until(self, caller: str) -> float:
        """Logs of this caller written up to this time may have been removed by retention (0: none were)."""
        ...


class MemoryLogStore:
    blocking = False

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now
        """The control plane's clock (a virtual one in tests): when each job's logs were written."""
        self.data: dict[tuple[str, str], bytes] = {}
        self._pending: dict[tuple[str, str], bytearray] = {}
        self.written_at: dict[str, tuple[str, float]] = {}
        """job id -> (caller, time of its last write)."""
        self.marks: dict[str, float] = {}

    def write(self, caller: str, attempt_id: str, stream: str, data: bytes) -> None:
        self.data[(attempt_id, stream)] = data
        self.written_at[attempt_id.partition(":")[0]] = (caller, self.now())

    def append(self, caller: str, attempt_id: str, stream: str, data: bytes, *, first: bool) -> None:
        if first:
            self._pending[(attempt_id, stream)] = bytearray()
        self._pending[(attempt_id, stream)] += data

    def commit(self, caller: str, attempt_id: str, stream: str) -> None:
        self.write(caller, attempt_id, stream, bytes(self._pending.pop((attempt_id, stream), b"")))

    def read(self, caller: str, attempt_id: str, stream: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        return self.data.get((attempt_id, stream), b"")[offset:offset + max_bytes]

    def usage(self) -> list[StoredLogs]:
        sizes: dict[str, int] = {}
        for (aid, _), data in self.data.items():
            job = aid.partition(":")[0]
            sizes[job] = sizes.get(job, 0) + len(data)
        return [StoredLogs(self.written_at[job][0], job, size, self.written_at[job][1]) for job, size in sizes.items()]

    def remove(self, logs: StoredLogs) -> None:
        for key in [k for k in self.data if k[0].partition(":")[0] == logs.job_id]:
            del self.data[key]
        self.written_at.pop(logs.job_id, None)
        self.marks[logs.caller_key] = max(self.marks.get(logs.caller_key, 0.0), logs.written_at)

    def swept_until(self, caller: str) -> float:
        return self.marks.get(caller, 0.0)
