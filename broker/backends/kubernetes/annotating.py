"""Owner annotations on pods, written in order and off the claim path when they only age.

The control plane re-annotates a pod at every launch and every reset: on a warm loop that was two PATCH
round trips (and two watch events) per job, run in threads beside the next claim. Most of them change
nothing a restarted broker relies on. So each write is split by what it changes against what the pod
record already holds:

- **identity** (caller, queue, lease tag, used, origin, role, image — every key not listed below): written
  at once, as before. These say whose the pod is and whether it was ever used; recovery must never read a
  used pod as fresh or give one caller's pod to another, so they reach the pod when the control plane asks,
  at the same point in its sequence as before this module existed.
- **ageing** (`hold-until`, `idle-since`, `job`): coalesced per pod and written `defer_s` after the first
  unwritten change (the latest values win). A warm loop of one session changes only these. Recovery reads
  `hold-until` and `idle-since` to restore holds and keep-alives, and ignores `job`; if the broker dies
  inside the window, a restored hold or keep-alive ends at most `defer_s` (plus the jobs run meanwhile)
  earlier than it would have: warmth lost, never a pod given to the wrong caller. A clean stop flushes
  every pending write first.

Writes to one pod are serialised (a launch's and a reset's PATCH used to race in two threads, and the older
record could land last); nothing is written for a pod being deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from broker.clock import Clock
from broker.errors import FirepoolError
from broker.pods import ANNOTATION_PREFIX

log = logging.getLogger("firepool.k8s")

AGEING = frozenset({ANNOTATION_PREFIX + "hold-until", ANNOTATION_PREFIX + "idle-since", ANNOTATION_PREFIX + "job"})
DEFER_S = 1.0

Write = Callable[[str, dict[str, str]], Awaitable[None]]
"""PATCH these annotations onto the pod (and record them as written); raises FirepoolError."""


class Annotator:
    def __init__(self, clock: Clock, write: Write, defer_s: float = DEFER_S) -> None:
        self.clock = clock
        self.write = write
        self.defer_s = defer_s
        self._pending: dict[str, dict[str, str]] = {}
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.writes = 0
        """PATCHes sent (for tests and the benchmark)."""

    async def annotate(self, name: str, written: Mapping[str, str], wanted: Mapping[str, str]) -> None:
        """Bring the pod's record (`written`: what it holds now) to `wanted`: at once when an identity key
        changes, within `defer_s` when only ageing keys do, not at all when nothing changes."""
        pending = self._pending.setdefault(name, {})
        pending.update({k: v for k, v in wanted.items() if written.get(k) != v or k in pending})
        if not pending:
            del self._pending[name]
            return
        if any(k not in AGEING for k in pending):
            await self.flush(name)
        elif name not in self._timers:
            due = self.clock.now() + self.defer_s
            self._timers[name] = asyncio.get_running_loop().create_task(self._later(name, due),
                                                                        name=f"annotate {name} later")

    async def _later(self, name: str, due: float) -> None:
        if due > self.clock.now():
            await self.clock.sleep(due - self.clock.now())
        self._timers.pop(name, None)
        try:
            await self.flush(name)
        except FirepoolError as exc:
            log.warning("writing the owner record of pod %s failed: %s", name, exc)

    async def flush(self, name: str) -> None:
        """Write what is pending for the pod now, after any write to it already under way."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            body = self._pending.pop(name, None)
            if body:
                self.writes += 1
                await self.write(name, body)

    def forget(self, name: str) -> None:
        """The pod is being deleted: drop what was not written."""
        self._pending.pop(name, None)
        self._locks.pop(name, None)
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    async def close(self) -> None:
        """Flush every pending write (a clean stop loses no hold), then stop the timers."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for name in list(self._pending):
            with contextlib.suppress(FirepoolError):
                await self.flush(name)
