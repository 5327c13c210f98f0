"""The quarantine port: failure counts and quarantines of devices and nodes, kept across restarts.

`broker.health.quarantine` decides; this keeps its records. The SQL implementation lives in
`broker.store.quarantine` (the `quarantine` table); `MemoryQuarantineStore` is the fake for unit tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class QuarantineRecord:
    """One device (key: its device key) or node (key: `node:<id>`) that has failed on hardware."""

    key: str
    kind: str
    """`device` or `node`."""
    node: str
    """The node a device is on ("" when the backend does not say); a node's own id for a node."""
    failures: int
    """Hardware-class failures counted since it was last released."""
    reason: str
    """The last failure's description."""
    updated_at: float
    quarantined_at: float | None = None
    """Set while quarantined: no new pod lands on it, its pods are drained."""
    released_at: float | None = None
    released_by: str | None = None

    @property
    def quarantined(self) -> bool:
        return self.quarantined_at is not None

    def view(self) -> dict[str, object]:
        return {"key": self.key, "kind": self.kind, "node": self.node, "failures": self.failures,
                "reason": self.reason, "quarantined": self.quarantined, "quarantined_at": self.quarantined_at,
                "released_at": self.released_at, "released_by": self.released_by, "updated_at": self.updated_at}


class QuarantineStore(Protocol):
    blocking: bool
    """True when calls do I/O (run them off the event loop)."""

    def load(self) -> list[QuarantineRecord]: ...

    def save(self, record: QuarantineRecord) -> None:
        """Insert or replace the record with this key; durable on return."""
        ...


class MemoryQuarantineStore:
    blocking = False

    def __init__(self) -> None:
        self.records: dict[str, QuarantineRecord] = {}

    def load(self) -> list[QuarantineRecord]:
        return list(self.records.values())

    def save(self, record: QuarantineRecord) -> None:
        self.records[record.key] = record
