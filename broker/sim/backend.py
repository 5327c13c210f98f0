"""The simulated backend: the fake backend's pods, with a venue's costs in virtual time.

`SimBackend` is `FakeBackend` (pods in memory, numbered GPU slots) whose pod start, termination,
hand-off and first instruction take the time a venue model gives, on the virtual clock. A pod holds
its device from the create call until its termination ends, as a Kubernetes pod holds its GPU until
the kubelet has torn it down. Every pod's life is recorded, so a run can report the capacity it held:
processor-seconds from create to the end of termination, busy, idle or owner-held alike. A GPU pod's
are counted per card: a card is held while any pod of its active–standby group lives on it, once
however many share it (paper §6: "the group counts as one physical GPU"), so a promoted standby holds its
card after the pod it replaced is gone. A CPU pod holds its cores.
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
    devices: tuple[str, ...] = ()
    """The cards the pod is bound to (a standby: its active pod's); empty for a CPU pod."""

    def end(self, until: float) -> float:
        return self.deleted_at if self.deleted_at is not None else until

    def held(self, until: float, since: float | None = None, *, starting: bool = False) -> float:
        """Processor-seconds from create to the end of termination (`starting`: to the end of its start)."""
        end = self.end(until) if not starting or self.ready_at is None else min(self.ready_at, self.end(until))
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
        life = PodLife(request.name, pool.name, processors, self.clock.now(), standby=bool(request.gpus),
                       devices=request.gpus)
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
        life.devices = info.gpus
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
        """Processor-seconds held between `since` and `until`: each card once while any pod lives on it,
        each CPU pod's cores."""
        cpu = sum(life.held(until, since) for life in self.lives.values() if not self._on_cards(life))
        return cpu + sum(_covered(spans, since, until) for spans in self._cards(until, ready=False).values())

    def creating_processor_seconds(self, until: float, since: float | None = None) -> float:
        """The part of `held_processor_seconds` before anything was ready: a card while none of its pods had
        started (a standby starting beside a ready pod adds none), a CPU pod until it started."""
        cpu = sum(life.held(until, since, starting=True) for life in self.lives.values() if not self._on_cards(life))
        held = self._cards(until, ready=False)
        ready = self._cards(until, ready=True)
        return cpu + sum(_covered(spans, since, until) - _covered(ready.get(card, []), since, until)
                         for card, spans in held.items())

    @staticmethod
    def _on_cards(life: PodLife) -> bool:
        # An active pod's cards are known once it is ready; one deleted while starting counts its processors.
        return bool(life.devices)

    def _cards(self, until: float, *, ready: bool) -> dict[str, list[tuple[float, float]]]:
        """card -> the spans its pods held it (from create, or from ready with `ready`) to their termination's end."""
        out: dict[str, list[tuple[float, float]]] = {}
        for life in self.lives.values():
            start = life.ready_at if ready else life.created_at
            if start is None:
                continue
            for card in life.devices:
                out.setdefault(card, []).append((start, life.end(until)))
        return out

    def pods_created(self, pool: str | None = None) -> int:
        return sum(1 for life in self.lives.values() if not life.standby and (pool is None or life.pool == pool))


def _covered(spans: list[tuple[float, float]], since: float | None, until: float) -> float:
    """Length of the union of `spans` inside [since, until]."""
    total, reach = 0.0, since if since is not None else float("-inf")
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, until)
        if end > start:
            total += end - start
            reach = end
    return total


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
