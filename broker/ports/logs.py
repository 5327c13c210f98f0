"""The log store port: where the broker keeps each attempt's output once the pod is reset.

`FileLogStore` (the embedded default) lives in `broker.running.logstore`; `MemoryLogStore` is the fake.
Streams are `combined`, `stdout` and `stderr`.
"""

from __future__ import annotations

from typing import Protocol

STREAMS = ("combined", "stdout", "stderr")


class LogStore(Protocol):
    blocking: bool

    def write(self, attempt_id: str, stream: str, data: bytes) -> None:
        """Store the whole stream of a finished attempt (replacing any earlier copy)."""
        ...

    def read(self, attempt_id: str, stream: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        """Bytes from `offset`; empty when there is nothing (more)."""
        ...


class MemoryLogStore:
    blocking = False

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], bytes] = {}

    def write(self, attempt_id: str, stream: str, data: bytes) -> None:
        self.data[(attempt_id, stream)] = data

    def read(self, attempt_id: str, stream: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        return self.data.get((attempt_id, stream), b"")[offset:offset + max_bytes]
