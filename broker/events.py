"""The event log: what the fleet did to whom and why, with the cost in GPU-seconds.

Preemptions, preemption-budget warnings and refusals, reservation alerts, hold breaks and budget
throttling each `emit` one event; the store keeps them (the `events` table) and `GET /v1/events`
pages them by id or time. An admin sees every event; a caller sees the events about its own jobs and
pods. `emit` never blocks and never fails the caller: with a store that does I/O the events queue and
a supervised task (`run`) writes them; `flush` writes them now (the API flushes before it reads).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.clock import Clock
from broker.errors import FirepoolError

log = logging.getLogger("firepool.events")

KINDS = ("preemption", "preemption.warn", "preemption.throttled", "reservation.alert", "hold.broken",
         "budget.throttled", "capacity.reclaimed", "quarantine")
"""Event kinds; `kind` is a free string so later features add theirs."""
KIND_LENGTH = 64


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened; `id` is 0 until the store assigned one."""

    at: float
    kind: str
    subject: str
    """What it happened to: a job id, a pod, a pool."""
    why: str
    cost_gpu_s: float | None = None
    """GPU-seconds it cost (lost progress of a preemption, a cold start a broken hold brings); None: none known."""
    caller: str | None = None
    """The caller whose job or pod it concerns (who may read it besides an admin); None: operators only."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    id: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "kind": self.kind, "subject": self.subject, "why": self.why,
                "cost_gpu_s": self.cost_gpu_s, "caller": self.caller, "detail": dict(self.detail)}


PRIVATE_DETAIL = frozenset({"for_job", "for_caller", "would_preempt", "victims"})
"""Detail keys that name another caller's jobs: only an admin sees them (docs/security.md, visibility)."""


def caller_view(event: Event) -> dict[str, Any]:
    """An event as a non-admin caller sees it: no other caller's names or jobs."""
    view = event.to_json()
    view["detail"] = {k: v for k, v in view["detail"].items() if k not in PRIVATE_DETAIL}
    return view


def detail_text(detail: Mapping[str, Any]) -> str:
    return json.dumps(dict(detail), sort_keys=True, default=str)


class EventSink(Protocol):
    """What the log needs of the store (broker.ports.store.JobStore is one): the store port imports `Event`
    from here, so the log names only this narrow face of it and the two stay one-way."""

    @property
    def blocking(self) -> bool:
        """True when calls do I/O and belong on a worker thread."""
        ...

    def add_events(self, events: Sequence[Event]) -> list[Event]:
        """Append events; returns them with the ids the store gave them, in order."""
        ...


class EventLog:
    def __init__(self, store: EventSink, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._pending: list[Event] = []
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        self.emitted = 0
        self.by_kind: dict[str, int] = {}
        """Events emitted since start, by kind (the /metrics counter)."""
        self.cost_by_kind: dict[str, float] = {}
        """GPU-seconds those events cost, by kind."""

    def emit(self, kind: str, subject: str, why: str, cost_gpu_s: float | None = None, caller: str | None = None,
             detail: Mapping[str, Any] | None = None) -> Event:
        """Record an event (written by `run`/`flush` when the store does I/O, at once otherwise)."""
        event = Event(self.clock.now(), kind[:KIND_LENGTH], subject, why,
                      None if cost_gpu_s is None else round(float(cost_gpu_s), 3), caller, dict(detail or {}))
        self.emitted += 1
        self.by_kind[event.kind] = self.by_kind.get(event.kind, 0) + 1
        if event.cost_gpu_s is not None:
            self.cost_by_kind[event.kind] = self.cost_by_kind.get(event.kind, 0.0) + event.cost_gpu_s
        log.info("event %s %s: %s%s", kind, subject, why,
                 "" if cost_gpu_s is None else f" (cost {cost_gpu_s:.0f} GPU-s)")
        self._pending.append(event)
        if not self.store.blocking:
            self._write_now()
        else:
            self._wake.set()
        return event

    def _write_now(self) -> None:
        batch, self._pending = self._pending, []
        try:
            self.store.add_events(batch)
        except FirepoolError as exc:
            log.warning("writing %d events failed; kept for the next try: %s", len(batch), exc)
            self._pending[:0] = batch

    async def flush(self) -> None:
        """Write every pending event (on a worker thread when the store blocks). One flush at a time: a reader
        that flushes while the writer's batch is in flight returns once that batch is stored, not before."""
        async with self._flushing:
            if not self._pending:
                return
            if not self.store.blocking:
                self._write_now()
                return
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self.store.add_events, batch)
            except FirepoolError as exc:
                log.warning("writing %d events failed; kept for the next try: %s", len(batch), exc)
                self._pending[:0] = batch

    async def run(self) -> None:
        """Write events as they come (a supervised task)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()
            if self._pending:  # the store refused: try again later, not in a spin
                await self.clock.sleep(1.0)
                self._wake.set()
