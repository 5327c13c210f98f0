"""The leader's heartbeat: a health call to every pod's agent, idle ones included, every `every_s`.

A pod's agent ends its sandbox when no current broker has spoken to it for its orphan bound
(`firepool_agent.orphan`, 300 s by default); busy pods hear from the executor often, but an idle warm pod may
hear nothing for hours. This loop keeps every pod of a live leader well within the bound (30 s against
300 s: nine calls may fail in a row), and it carries the leader's term (`broker.fencing`): a new leader's
first beats teach every agent the new term, after which a deposed one's commands are refused. A failed call
changes nothing here: pods the agent of which stays silent are the backends' and the executor's to judge.
"""

from __future__ import annotations

import asyncio
import logging

from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.pods import PodState
from broker.ports.backend import Backend

log = logging.getLogger("firepool.heartbeat")

EVERY_S = 30.0
"""Default period: a tenth of the agents' default orphan bound."""
CALL_TIMEOUT_S = 5.0
PARALLEL = 32
"""Calls in flight at once: a large fleet's beat is spread, not a burst of thousands of connections."""
_SKIPPED = frozenset({PodState.STARTING, PodState.RETIRING, PodState.GONE})
"""A starting pod's agent is polled by its start; a retiring one is being deleted; a gone one has none."""


class Heartbeat:
    def __init__(self, clock: Clock, tracker: Tracker, backend: Backend, every_s: float = EVERY_S) -> None:
        self.clock = clock
        self.tracker = tracker
        self.backend = backend
        self.every_s = every_s
        self.failed = 0
        """Calls that failed since the start (for tests and logs)."""

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.every_s)
            await self.beat()

    async def beat(self) -> int:
        """One health call to the agent of every pod that has one; returns how many answered."""
        names = [p.name for p in self.tracker.snapshot() if p.state not in _SKIPPED]
        gate = asyncio.Semaphore(PARALLEL)

        async def call(name: str) -> bool:
            async with gate:
                try:
                    await asyncio.wait_for(self.backend.agent(name).health(), CALL_TIMEOUT_S)
                    return True
                except (FirepoolError, TimeoutError) as exc:
                    log.debug("heartbeat to pod %s failed: %s", name, exc)
                    return False

        answered = sum(await asyncio.gather(*(call(name) for name in names)))
        self.failed += len(names) - answered
        return answered
