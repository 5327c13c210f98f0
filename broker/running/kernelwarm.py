"""Kernel warmth per pool: once a pool serves kernels, every pod of it keeps a pre-started kernel while idle.

A pod's agent in mode `learned` (the catalog's `kernels: auto` or `learned`) keeps a pre-imported,
unbound kernel process while the broker says its pool serves kernels. The broker learns that per pool,
not per pod: a notebook's or a conversation's first kernel usually lands on a pod that never ran one (a
never-used pod, a new one), and a pod that learned only from its own jobs would start that kernel cold.

A pool serves kernels while one of its kernel jobs runs and for its keep-alive after the last one
started or ended (at most `REMEMBER_MAX_S`); then it forgets, and its pods drop their processes. A pool
that never ran a kernel job costs nothing: its agents are never told anything. Standby pods are never
told (a zero-VRAM slot holds nothing); a promoted one is told after its first job like any other.

`KernelWarmth` keeps what each agent was last told and tells only the difference, from one loop woken by
kernel jobs starting and ending and by pods becoming ready, with `TICK_S` as a fallback. Agent calls
run outside every lock; the tracker is read through its snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter

from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.pods import Pod, PodState
from broker.ports.backend import Backend

log = logging.getLogger("firepool.kernelwarm")

LEARNING = ("auto", "learned")
"""Pool `kernels` values whose pods keep a pre-started kernel as the broker learns (agent mode `learned`)."""
REMEMBER_MAX_S = 3600.0
"""The longest a pool remembers serving kernels after its last kernel job (a pool without keep-alive)."""
TICK_S = 5.0
"""Fallback pass: pods that became ready without a wake-up, and agents whose last telling failed."""
TOLD_STATES = frozenset({PodState.IDLE, PodState.ASSIGNED, PodState.RUNNING, PodState.RESETTING})
"""Pods whose agent answers; a busy one stores the word and acts on it after its next clean reset."""


class KernelWarmth:
    def __init__(self, *, clock: Clock, tracker: Tracker, backend: Backend, tick_s: float = TICK_S) -> None:
        self.clock = clock
        self.tracker = tracker
        self.backend = backend
        self.tick_s = tick_s
        self.running: Counter[str] = Counter()
        """Pool -> kernel jobs running now."""
        self.jobs: dict[str, str] = {}
        """Kernel job id -> its pool, while it runs."""
        self.last: dict[str, float] = {}
        """Pool -> when one of its kernel jobs last started or ended."""
        self.told: dict[str, bool] = {}
        """Pod -> what its agent was last told; a pod first seen before the first pass is told either way."""
        self.first_pass = True
        self._wake = asyncio.Event()

    # ---------------------------------------------------------------- events

    def started(self, job_id: str, pool: str) -> None:
        """A kernel job of `pool` launched: the pool serves kernels from now on."""
        if job_id not in self.jobs:
            self.jobs[job_id] = pool
            self.running[pool] += 1
        self.last[pool] = self.clock.now()
        self.wake()

    def ended(self, job_id: str) -> None:
        pool = self.jobs.pop(job_id, None)
        if pool is None:
            return
        self.running[pool] -= 1
        if self.running[pool] <= 0:
            del self.running[pool]
        self.last[pool] = self.clock.now()
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    # ---------------------------------------------------------------- deciding

    def remembers_for(self, pool: str) -> float:
        spec = self.tracker.pool(pool)
        if spec is None or spec.kernels not in LEARNING:
            return -math.inf
        return min(spec.keep_alive, REMEMBER_MAX_S)

    def serves(self, pool: str, now: float) -> bool:
        """Whether `pool` serves kernels now: one runs, or one started or ended within its memory."""
        if self.tracker.pool(pool) is None or self.remembers_for(pool) == -math.inf:
            return False
        if self.running.get(pool, 0) > 0:
            return True
        last = self.last.get(pool)
        return last is not None and now - last < self.remembers_for(pool)

    def wanted(self, pod: Pod, now: float) -> bool:
        return not pod.standby and self.serves(pod.pool, now)

    def changes(self, now: float) -> dict[str, bool]:
        """Pods whose agent must hear the word now (and the word), and forget pods that are gone."""
        if not self.first_pass and not self.last and True not in self.told.values():
            return {}  # no pool serves kernels and no agent keeps one: nothing to look at
        pods = self.tracker.snapshot()
        names = {p.name for p in pods}
        for gone in [n for n in self.told if n not in names]:
            del self.told[gone]
        found = {}
        for pod in pods:
            if pod.state not in TOLD_STATES or self.remembers_for(pod.pool) == -math.inf:
                continue
            want = self.wanted(pod, now)
            before = self.told.get(pod.name)
            if before is None and not self.first_pass and not want:
                continue  # a new agent starts untold: telling it "no" would cost a non-kernel pool a call per pod
            if before != want:
                found[pod.name] = want
        return found

    def next_change(self, now: float) -> float:
        """Seconds until a pool that serves kernels would forget (the loop's next deadline)."""
        due = self.tick_s
        for pool, last in self.last.items():
            if self.running.get(pool, 0) == 0:
                left = last + self.remembers_for(pool) - now
                if left > 0:
                    due = min(due, left)
        return due

    # ---------------------------------------------------------------- telling

    async def reconcile(self) -> None:
        now = self.clock.now()
        changes = self.changes(now)
        self.first_pass = False
        for pool in [p for p in self.last if not self.serves(p, now) and self.running.get(p, 0) == 0]:
            del self.last[pool]  # forgotten: pods already told "no" stay told
        if changes:
            await asyncio.gather(*(self._tell(name, keep) for name, keep in changes.items()))

    async def _tell(self, name: str, keep: bool) -> None:
        try:
            await self.backend.agent(name).keep_kernels(keep)  # the agent client's own timeout bounds it
        except FirepoolError as exc:
            if exc.details.get("status") in (404, 405):  # an agent older than this endpoint: it keeps none
                self.told[name] = keep
                return
            log.debug("telling %s keep_kernels=%s failed (next pass retries): %s", name, keep, exc)
            return
        self.told[name] = keep

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception:  # a bad pass must not end kernel warmth for the broker's life
                log.exception("kernel warmth pass failed")
            await self.clock.wait(self._wake, self.next_change(self.clock.now()))
