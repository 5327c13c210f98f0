"""What the dashboard's live parts read: one shared snapshot per tick, and the pools' last hour.

`Hub` computes a snapshot of the topics somebody watches (pools, pods, jobs) at most every
`interval` seconds and only while an SSE client is connected; every client of that tick shares it,
and a client scoped to one caller shares that caller's filtered copy with the other clients of the
same caller. Twenty open dashboards therefore cost one snapshot per tick, not twenty.

`Timeline` is a ring buffer of per-pool samples (held, busy, queued demand) taken every `every`
seconds by a supervised background task; an hour of it is what the Pools page plots.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from broker.api.auth import Identity
from broker.api.schemas import job_view
from broker.clock import Clock
from broker.control import ControlPlane
from broker.jobs import Job
from broker.ui.commands import display_command
from broker.warmth.poolview import caller_pool_view

log = logging.getLogger("firepool.ui")

TOPICS = ("pools", "pods", "jobs")
RECENT_JOBS = 200
"""Jobs that finished since a client connected stay in the snapshot this long (by count)."""
NEWEST_JOBS = 20
"""The newest jobs read from the store, per watching caller (all callers' for an admin), on a tick where
more jobs finished than the hub saw leave the live set (they started and ended between two ticks)."""
SENT_RECENT = 50
"""Finished jobs sent per event besides the live ones: a Jobs page shows 50 rows."""
COMMAND_CHARS = 1000
"""A job row's command is cut here: a snapshot carries up to 50 finished rows besides the live ones."""
CATCH_ALL_TICKS = 10
"""Read the newest jobs at least every this many ticks anyway (a job cancelled while queued is not counted
as finished by the executor)."""


@dataclass
class Snapshot:
    seq: int
    at: float
    data: dict[str, Any]
    scoped: dict[tuple[str, bool], dict[str, Any]] = field(default_factory=dict)
    _encoded: dict[tuple[str, bool, frozenset[str]], str] = field(default_factory=dict)

    def for_identity(self, who: Identity) -> dict[str, Any]:
        """This tick's data as `who` may see it, filtered once per caller per tick."""
        key = (who.caller, who.admin)
        found = self.scoped.get(key)
        if found is None:
            found = self.scoped[key] = scope(self.data, who) | {"seq": self.seq, "at": self.at}
        return found

    def encoded(self, who: Identity, topics: set[str]) -> str:
        """This tick's SSE event for `who` watching `topics`, serialized once for every such client; the
        same data encodes to the same text, so a stream skips a tick that changed nothing it shows."""
        key = (who.caller, who.admin, frozenset(topics))
        text = self._encoded.get(key)
        if text is None:
            data = self.for_identity(who)
            body = {k: v for k, v in data.items() if k in topics}
            text = self._encoded[key] = f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
        return text


def scope(data: dict[str, Any], who: Identity) -> dict[str, Any]:
    """A caller sees its own pods and jobs and its own holds; an admin sees everything."""
    if who.admin:
        return data
    out: dict[str, Any] = {}
    if "pools" in data:
        out["pools"] = [caller_pool_view(v, who.caller) for v in data["pools"]]
    if "pods" in data:
        out["pods"] = [p for p in data["pods"] if p.get("caller") == who.caller]
    if "jobs" in data:
        out["jobs"] = [j for j in data["jobs"] if j["caller"] == who.caller]
    return out


def job_row(job: Job, reason: str | None) -> dict[str, Any]:
    """The fields of a job the tables show: its command as `display_command` words it, no env, no attempts."""
    view = job_view(job, reason)
    acq = view.get("acquisition") or []
    return {"id": job.id, "state": view["state"], "caller": job.caller, "pool": job.spec.pool,
            "lease_tag": job.spec.lease_tag, "path": acq[0]["path"] if acq else None,
            "reason": acq[0].get("reason") if acq else None, "waiting_reason": reason,
            "exit_code": job.exit_code, "error_class": job.error_class, "retries": job.retries,
            "command": shown_command(job.spec.command),
            "submitted_at": job.timings.get("submitted_at"), "started_at": started_at(job.timings),
            "finished_at": job.timings.get("finished_at")}


def started_at(timings: Mapping[str, float]) -> float | None:
    """When the job's command began: its first instruction (else its hand-off to the pod)."""
    return timings.get("first_instruction_at") or timings.get("handed_off_at")


def shown_command(argv: Sequence[str]) -> str:
    """`display_command`, cut at COMMAND_CHARS (the table truncates further, the full text is the title)."""
    text = display_command(argv)
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 1] + "…"


class Hub:
    """One snapshot per tick shared by every SSE client; nothing is computed while nobody watches."""

    def __init__(self, cp: ControlPlane, clock: Clock, *, interval: float = 0.5) -> None:
        self.cp = cp
        self.clock = clock
        self.interval = interval
        self.clients: dict[int, tuple[set[str], Identity]] = {}
        self.snapshot: Snapshot | None = None
        self.computed = 0
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._next_id = 0
        self._live_ids: set[str] = set()
        self._finished = 0
        self._ticks = 0
        self._recent: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()

    def subscribe(self, topics: set[str], who: Identity) -> int:
        self._next_id += 1
        self.clients[self._next_id] = (topics & set(TOPICS), who)
        self._wake.set()
        return self._next_id

    def unsubscribe(self, client: int) -> None:
        self.clients.pop(client, None)

    async def next(self, after: int) -> Snapshot:
        """The first snapshot newer than sequence number `after`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.snapshot is not None and self.snapshot.seq > after)
        assert self.snapshot is not None
        return self.snapshot

    async def run(self) -> None:
        """Tick while clients are connected; sleep on the wake event while none is."""
        while True:
            if not self.clients:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self.tick()
            except Exception:  # a failed view this tick must not end live updates for good
                log.exception("dashboard: building the live snapshot failed")
            await self.clock.sleep(self.interval)

    async def tick(self) -> Snapshot:
        wanted = set().union(*(t for t, _ in self.clients.values())) if self.clients else set(TOPICS)
        data: dict[str, Any] = {}
        if "pools" in wanted:
            data["pools"] = self.cp.pools_view()
        if "pods" in wanted:
            data["pods"] = self.cp.pods_view()
        if "jobs" in wanted:
            data["jobs"] = await self._jobs()
        seq = (self.snapshot.seq if self.snapshot else 0) + 1
        snap = Snapshot(seq, self.clock.now(), data)
        self.computed += 1
        async with self._changed:
            self.snapshot = snap
            self._changed.notify_all()
        return snap

    async def _jobs(self) -> list[dict[str, Any]]:
        """Live jobs from memory; those that left it since the last tick, read once from the store; and
        the newest few per watching caller (a job may start and end between two ticks)."""
        live = dict(self.cp.book.live)
        reason = self.cp.waiting_reason
        gone = [i for i in self._live_ids if i not in live]
        left = gone[:RECENT_JOBS]
        self._live_ids = set(live)
        finished = sum(self.cp.stats.jobs_finished.values())
        unseen = finished - self._finished > len(gone)
        self._finished = finished
        self._ticks += 1
        watchers = [who for topics, who in self.clients.values() if "jobs" in topics]
        callers: set[str | None] = {None} if any(w.admin for w in watchers) else {w.caller for w in watchers}
        if not unseen and self._ticks % CATCH_ALL_TICKS != 1:
            callers = set()  # every finished job was seen leaving the live set: no store read this tick
        try:
            for job_id in left:
                job = await self.cp.book.get(job_id)
                if job is not None:
                    self._recent[job_id] = job_row(job, None)
            for caller in callers:
                newest = await self.cp.book.io(partial(self.cp.store.list_jobs, caller=caller, limit=NEWEST_JOBS))
                for job in newest:
                    if job.terminal:
                        self._recent[job.id] = job_row(job, None)
        except Exception as exc:  # the store may be down for a while; the page keeps the rows it has
            log.warning("dashboard: reading jobs failed: %s", exc)
        while len(self._recent) > RECENT_JOBS:
            self._recent.popitem(last=False)
        rows = {i: job_row(j, reason(i)) for i, j in live.items()}
        recent = sorted(self._recent, reverse=True)
        for job_id in recent[:SENT_RECENT]:
            rows.setdefault(job_id, self._recent[job_id])
        return sorted(rows.values(), key=lambda r: r["id"], reverse=True)


@dataclass(frozen=True)
class Sample:
    at: float
    pools: dict[str, tuple[int, int, int]]
    """pool -> (held, busy, queued demand)."""


class Timeline:
    """The last `span` seconds of per-pool held / busy / queued samples, one every `every` seconds."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]], clock: Clock, *, every: float = 10.0,
                 span: float = 3600.0) -> None:
        self.read = read
        self.clock = clock
        self.every = every
        self.samples: collections.deque[Sample] = collections.deque(maxlen=max(1, int(span / every)))

    def sample(self) -> Sample:
        pools = {v["name"]: (int(v["held"]), int(v["busy"]), int(v["queued_demand"])) for v in self.read()}
        s = Sample(self.clock.now(), pools)
        self.samples.append(s)
        return s

    def series(self, pool: str) -> dict[str, list[float]]:
        """Columns for one pool: at, held, busy, queued (what the chart plots)."""
        out: dict[str, list[float]] = {"at": [], "held": [], "busy": [], "queued": []}
        for s in self.samples:
            if pool in s.pools:
                held, busy, queued = s.pools[pool]
                out["at"].append(round(s.at, 1))
                out["held"].append(held)
                out["busy"].append(busy)
                out["queued"].append(queued)
        return out

    async def run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # one lost sample, not the timeline
                log.exception("dashboard: sampling the pools failed")
            await self.clock.sleep(self.every)
