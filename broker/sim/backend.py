"""The simulated backend: the fake backend's pods, with a venue's costs in virtual time.

`SimBackend` is `FakeBackend` (pods in memory, numbered GPU slots) whose pod start, termination,
hand-off and first instruction take the time a venue model gives, on the virtual clock. A pod holds
its device from the create call until its termination ends, as a Kubernetes pod holds its GPU until
the kubelet has torn it down. Every pod's life is recorded, so a run can report the capacity it held:
processor-seconds (GPUs, or cores for a CPU pool) from create to the end of termination, busy, idle or
owner-held alike; a standby shares its active pod's card and adds no processors (paper §6, App. C.1).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Protocol

from broker.clock import Clock
from broker.ports.agent import AttemptStatus, FakeAgent, LaunchRequest
from broker.ports.backend import FakeBackend, PodInfo, PodRequest


class Costs(Protocol):
    """What a venue model answers: per-phase costs in seconds, sampled from a seeded generator."""

    def pod_start(self, rng: random.Random, starting: int) -> float:
        """Create -> agent answering, for a pod created while `starting` pods (itself included) start."""
        ...

    def termination(self, rng: random.Random) -> float:
        """Delete -> the pod's device free again."""
        ...

    def handoff(self, rng: random.Random) -> float:
        """Commit -> the agent has the job (package delivery, launch call)."""
        ...

    def first_instruction(self, rng: random.Random) -> float:
        """Launch -> the job's first instruction runs."""
        ...

    def promotion(self, rng: random.Random) -> float:
        """A standby's first launch: its promotion to the card's active pod (paid on top of the hand-off)."""
        ...


@dataclass
class PodLife:
    """One pod from create to the end of its termination."""

    name: str
    pool: str
    processors: float
    created_at: float
    ready_at: float | None = None
    deleted_at: float | None = None
    standby: bool = False

    def held(self, until: float, since: float | None = None) -> float:
        end = self.deleted_at if self.deleted_at is not None else until
        start = self.created_at if since is None else max(self.created_at, since)
        return max(0.0, min(end, until) - start) * self.processors


class SimAgent(FakeAgent):
    """A fake agent whose launch takes the venue's hand-off and whose job starts after its first instruction."""

    def __init__(self, pod: str, clock: Clock, costs: Costs, rng: random.Random, standby: bool = False) -> None:
        super().__init__(pod, clock)
        self.costs = costs
        self.rng = rng
        self.standby = standby

    async def launch(self, request: LaunchRequest) -> AttemptStatus:
        delay = self.costs.handoff(self.rng)
        if self.standby:
            self.standby = False  # promoted once; it is the card's active pod from now on
            delay += self.costs.promotion(self.rng)
        await self.clock.sleep(delay)
        status = await super().launch(request)
        first = status.started_at + self.costs.first_instruction(self.rng) if status.started_at is not None else None
        status = dataclasses.replace(status, first_instruction_at=first)
        self.runs[request.attempt_id].status = status
        return status

    async def _run(self, request: LaunchRequest, run: Any) -> None:
        started = run.status.started_at
        first = run.status.first_instruction_at
        if started is not None and first is not None and first > started:
            await self.clock.sleep(first - started)
        await super()._run(request, run)


class SimBackend(FakeBackend):
    """Pods in memory whose start, termination and job hand-off cost a venue's time on the virtual clock."""

    kind = "sim"

    def __init__(self, clock: Clock, costs: Costs, rng: random.Random, gpus: int = 0, model: str = "sim-gpu") -> None:
        super().__init__(clock, gpus=gpus, model=model)
        self.costs = costs
        self.rng = rng
        self.lives: dict[str, PodLife] = {}
        self.starting = 0
        self.peak_starting = 0

    async def create(self, request: PodRequest) -> PodInfo:
        self.starting += 1
        self.peak_starting = max(self.peak_starting, self.starting)
        delay = self.costs.pod_start(self.rng, self.starting)
        pool = request.pool
        processors = 0.0 if request.gpus else float(pool.gpus if pool.gpus else pool.cpus)
        life = PodLife(request.name, pool.name, processors, self.clock.now(), standby=bool(request.gpus))
        self.lives[request.name] = life
        self.start_delay = delay  # read by the fake's create before its first await: this create's own
        try:
            info = await super().create(request)
        except BaseException:
            life.deleted_at = self.clock.now()
            raise
        finally:
            self.starting -= 1
        self.agents[request.name] = SimAgent(request.name, self.clock, self.costs, self.rng, standby=bool(request.gpus))
        life.ready_at = self.clock.now()
        return info

    async def delete(self, name: str) -> None:
        if name not in self.pods:
            return
        self.agents.pop(name, None)  # the agent stops answering at once; the device frees after termination
        await self.clock.sleep(self.costs.termination(self.rng))
        await super().delete(name)
        life = self.lives.get(name)
        if life is not None and life.deleted_at is None:
            life.deleted_at = self.clock.now()

    def held_processor_seconds(self, until: float, since: float | None = None) -> float:
        """Processor-seconds held by every pod between `since` and `until`."""
        return sum(life.held(until, since) for life in self.lives.values())

    def pods_created(self, pool: str | None = None) -> int:
        return sum(1 for life in self.lives.values() if not life.standby and (pool is None or life.pool == pool))


class VenueCosts:
    """A venue model (`broker.sim.venues.Venue`) as the backend's costs.

    The control plane's own accept and dispatch phases (App. C.4: 0.04 s and 0.01 s) have no store latency
    to hide in here (the in-memory store answers at once), so they are paid with the hand-off.
    """

    def __init__(self, venue: Any, *, termination_s: float | None = None) -> None:
        self.venue = venue
        self.termination_s = float(venue.termination_s if termination_s is None else termination_s)

    def pod_start(self, rng: random.Random, starting: int) -> float:
        return float(self.venue.sample_cold_start(rng, starting))

    def termination(self, rng: random.Random) -> float:
        return self.termination_s

    def handoff(self, rng: random.Random) -> float:
        return float(self.venue.accept_s + self.venue.dispatch_s + self.venue.handoff_s)

    def first_instruction(self, rng: random.Random) -> float:
        return float(self.venue.first_instruction_s)

    def promotion(self, rng: random.Random) -> float:
        return float(self.venue.promotion_s)
