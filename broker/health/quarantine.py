"""Quarantine (design §8): a GPU that keeps failing is a property of the hardware, not of the jobs.

Hardware-class failures (the agent's classification of an Xid, ECC error or NVML health change, and a
launch the pod's agent refused) are counted per device key. At `threshold` failures the device is
quarantined: no new pod gets it, its pods drain (idle ones retire now, busy ones when their job ends).
When `node_threshold` devices of one node are quarantined, the node is (the node, not a card, is at
fault); faults of a node's pods that hold no device count against the node itself. Records live in the
store (`broker.ports.quarantine`), so a restarted broker keeps them; only an operator releases one
(`firepool quarantine release KEY`), which clears its count.

The counting and the threshold are pure (`count_fault`); `Quarantine` keeps the records and persists
them. Every decision is announced through `broker.health.decisions.decided`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

from broker.clock import Clock
from broker.errors import NotFound
from broker.health.decisions import QUARANTINE_RELEASED, QUARANTINED, EventSink, decided
from broker.pools import QuarantineSettings
from broker.ports.quarantine import QuarantineRecord, QuarantineStore

T = TypeVar("T")

DEVICE = "device"
NODE = "node"
NODE_PREFIX = "node:"


def node_key(node: str) -> str:
    return NODE_PREFIX + node


def count_fault(record: QuarantineRecord | None, key: str, kind: str, node: str, why: str, now: float,
                threshold: int) -> QuarantineRecord:
    """One more failure of `key`: its record with the count raised, quarantined at the threshold."""
    base = record or QuarantineRecord(key=key, kind=kind, node=node, failures=0, reason="", updated_at=now)
    failures = base.failures + 1
    quarantined_at = base.quarantined_at
    if quarantined_at is None and failures >= threshold:
        quarantined_at = now
    return dataclasses.replace(base, node=node or base.node, failures=failures, reason=why, updated_at=now,
                               quarantined_at=quarantined_at)


class Quarantine:
    """The records, the placement block they imply, and the operator's release."""

    def __init__(self, settings: QuarantineSettings, store: QuarantineStore, clock: Clock) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.records: dict[str, QuarantineRecord] = {}
        self._blocked_devices: frozenset[str] = frozenset()
        self._blocked_nodes: frozenset[str] = frozenset()
        self.on_change: Callable[[], None] = lambda: None
        """Called after a quarantine or release (the control plane drains pods and wakes the controller)."""
        self.events: EventSink | None = None
        """Where quarantines and releases are recorded (the broker's event log)."""

    async def load(self) -> None:
        records = await self._io(self.store.load)
        self.records = {r.key: r for r in records}
        self._reindex()

    # ---------------------------------------------------------------- placement

    def blocked_devices(self) -> frozenset[str]:
        """Quarantined device keys: no new pod gets one."""
        return self._blocked_devices

    def blocked_nodes(self) -> frozenset[str]:
        """Quarantined nodes: no new pod goes there."""
        return self._blocked_nodes

    def blocks(self, gpus: Sequence[str], node: str = "") -> bool:
        """A pod on these devices (on this node) must not run new work."""
        return bool(node and node in self._blocked_nodes) or any(g in self._blocked_devices for g in gpus)

    def _reindex(self) -> None:
        quarantined = [r for r in self.records.values() if r.quarantined]
        self._blocked_devices = frozenset(r.key for r in quarantined if r.kind == DEVICE)
        self._blocked_nodes = frozenset(r.node for r in quarantined if r.kind == NODE)

    # ---------------------------------------------------------------- faults

    async def fault(self, gpus: Sequence[str], node: str, why: str, *, subject: str = "",
                    caller: str | None = None) -> list[QuarantineRecord]:
        """Count one hardware-class failure of a pod on `gpus` (on `node`); the records newly quarantined."""
        now = self.clock.now()
        changed: list[QuarantineRecord] = []
        for key in gpus or ():
            changed.append(count_fault(self.records.get(key), key, DEVICE, node, why, now, self.settings.threshold))
        if not gpus and node:
            key = node_key(node)
            changed.append(count_fault(self.records.get(key), key, NODE, node, why, now, self.settings.threshold))
        newly = [r for r in changed if r.quarantined and not _was_quarantined(self.records.get(r.key))]
        for record in changed:
            self.records[record.key] = record
        if node and any(r.kind == DEVICE for r in newly):
            bad = sum(1 for r in self.records.values() if r.kind == DEVICE and r.node == node and r.quarantined)
            key = node_key(node)
            if bad >= self.settings.node_threshold and not _was_quarantined(self.records.get(key)):
                prior = self.records.get(key)
                node_record = QuarantineRecord(key=key, kind=NODE, node=node, failures=prior.failures if prior else 0,
                                               reason=f"{bad} of its devices are quarantined", updated_at=now,
                                               quarantined_at=now)
                self.records[key] = node_record
                changed.append(node_record)
                newly.append(node_record)
        for record in changed:
            await self._io(functools.partial(self.store.save, record))
        self._reindex()
        for record in newly:
            why = (f"{record.failures} hardware-class failure(s), threshold {self.settings.threshold}; "
                   f"last: {record.reason}") if record.failures >= self.settings.threshold else record.reason
            decided(QUARANTINED, f"{record.kind}/{record.key}", why, caller=caller,
                    detail={"failures": record.failures, "node": record.node, "last_job": subject}, events=self.events)
        if newly:
            self.on_change()
        return newly

    # ---------------------------------------------------------------- operator

    def list(self) -> list[QuarantineRecord]:
        """Every record with failures or a quarantine, quarantined first."""
        return sorted((r for r in self.records.values() if r.failures or r.quarantined),
                      key=lambda r: (not r.quarantined, r.key))

    async def release(self, key: str, by: str) -> QuarantineRecord:
        """Let a device or node back into placement and clear its count; NotFound when it is not quarantined."""
        record = self.records.get(key) or self.records.get(node_key(key))
        if record is None or not record.quarantined:
            raise NotFound(f"{key!r} is not quarantined", {"key": key})
        released = dataclasses.replace(record, failures=0, quarantined_at=None, released_at=self.clock.now(),
                                       released_by=by, updated_at=self.clock.now())
        self.records[record.key] = released
        await self._io(lambda: self.store.save(released))
        self._reindex()
        decided(QUARANTINE_RELEASED, f"{record.kind}/{record.key}", f"released by {by}",
                detail={"failures": record.failures, "quarantined_at": record.quarantined_at}, events=self.events)
        self.on_change()
        return released

    async def _io(self, work: Callable[[], T]) -> T:
        return await asyncio.to_thread(work) if self.store.blocking else work()


def _was_quarantined(record: QuarantineRecord | None) -> bool:
    return record is not None and record.quarantined
