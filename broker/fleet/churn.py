"""A virtual-time workload over a fleet, run through `placement.place`: fragmentation under churn.

Jobs of a few classes (shape, topology, mean duration, share of GPU-hours) arrive as a Poisson stream
sized so the offered load is `occupancy` of the fleet's GPUs; each lasts an exponential time. A job
that cannot be placed waits in arrival order; whenever GPUs come back, the queue is tried again in
order (a smaller job may pass a blocked larger one: backfill). Every `sample_s` the run records
`largest_placeable`, the GPUs in use and the half-open and mixed-shape nodes (the R1 pathology).
Nothing sleeps: time is a number, events come off a heap. The same seed gives the same run.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.fleet.capacity import largest_placeable
from broker.fleet.nodes import Fleet, Node
from broker.fleet.placement import Ask, Placement, Policy, Topology, apply, place, release

HOUR = 3600.0


@dataclass(frozen=True)
class JobClass:
    name: str
    pods: int
    gpus: int
    topology: Topology
    mean_s: float
    share: float
    """Share of the offered GPU-hours."""

    @property
    def total(self) -> int:
        return self.pods * self.gpus


MIXED: tuple[JobClass, ...] = (
    JobClass("notebook", 1, 1, "node", 1 * HOUR, 0.10),
    JobClass("inference-2", 1, 2, "node", 4 * HOUR, 0.10),
    JobClass("inference-4", 1, 4, "node", 6 * HOUR, 0.25),
    JobClass("train-4x1", 4, 1, "any", 2 * HOUR, 0.05),
    JobClass("train-8", 1, 8, "node", 8 * HOUR, 0.30),
    JobClass("train-16", 2, 8, "domain", 12 * HOUR, 0.20),
)
"""Training, inference and notebooks together (design §1: ~60% training, ~40% inference by GPU-hours)."""


@dataclass
class Sample:
    t: float
    used: int
    placeable: dict[str, int]
    half_open: int
    """Nodes with a 4-GPU allocation and exactly 4 GPUs free (R1's stalled halves)."""
    mixed: int
    """Nodes holding allocations of more than one shape."""


@dataclass
class Result:
    policy: str
    occupancy: float
    samples: list[Sample] = field(default_factory=list)
    placed: dict[str, int] = field(default_factory=dict)
    arrived: dict[str, int] = field(default_factory=dict)
    gang_waits: list[float] = field(default_factory=list)
    """Queue waits (s) of placed jobs of 8 GPUs or more."""
    at_once: int = 0
    """Jobs of 8 GPUs or more placed the moment they arrived (no queue wait)."""

    def mean(self, what: str) -> float:
        values = [float(s.placeable[what]) for s in self.samples]
        return statistics.fmean(values) if values else 0.0

    @property
    def utilization(self) -> float:
        return statistics.fmean(s.used for s in self.samples) if self.samples else 0.0

    @property
    def half_open(self) -> float:
        return statistics.fmean(s.half_open for s in self.samples) if self.samples else 0.0

    @property
    def mixed(self) -> float:
        return statistics.fmean(s.mixed for s in self.samples) if self.samples else 0.0

    @property
    def eight_gpu_placed(self) -> int:
        return sum(n for name, n in self.placed.items() if _total(name) >= 8)


_TOTALS: dict[str, int] = {}


def _total(name: str) -> int:
    return _TOTALS.get(name, 0)


def fleet_of(nodes: int, gpus_per_node: int = 8, domain_size: int = 8, model: str = "sim") -> list[Node]:
    return [Node(id=f"n{i:03d}", gpus=tuple(f"n{i:03d}-gpu{g}" for g in range(gpus_per_node)), model=model,
                 domain=f"d{i // domain_size}") for i in range(nodes)]


def run(nodes: Sequence[Node], classes: Sequence[JobClass], occupancy: float, policy: Policy, *,
        hours: float = 7 * 24, sample_s: float = HOUR, warmup_h: float = 24.0, seed: int = 3) -> Result:
    """One run; samples start after `warmup_h` so the fleet has churned into its steady state."""
    rng = random.Random(seed)
    fleet = Fleet(nodes)
    capacity = fleet.total
    for c in classes:
        _TOTALS[c.name] = c.total
    share = sum(c.share for c in classes)
    # Offered GPU-seconds per second = occupancy × capacity, split by share; per class rate = that / (gpus × mean).
    rates = [occupancy * capacity * (c.share / share) / (c.total * c.mean_s) for c in classes]
    total_rate = sum(rates)
    out = Result(policy, occupancy)
    events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, job index)
    seq = 0
    jobs: list[tuple[JobClass, float, float]] = []  # class, arrival, duration
    running: dict[int, Placement] = {}
    queue: list[int] = []
    end = hours * HOUR

    def push(t: float, kind: str, job: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, job))

    push(rng.expovariate(total_rate), "arrive", -1)
    t_sample = warmup_h * HOUR
    while events:
        t, _, kind, job = heapq.heappop(events)
        while t_sample <= min(t, end):
            out.samples.append(_sample(fleet, t_sample))
            t_sample += sample_s
        if t > end:
            break
        if kind == "arrive":
            c = rng.choices(classes, weights=rates)[0]
            jobs.append((c, t, rng.expovariate(1.0 / c.mean_s)))
            out.arrived[c.name] = out.arrived.get(c.name, 0) + 1
            queue.append(len(jobs) - 1)
            push(t + rng.expovariate(total_rate), "arrive", -1)
        else:
            c = jobs[job][0]
            release(fleet, running.pop(job))
        waiting = []
        # An arrival frees nothing: only the new job can fit now. A departure: every queued job may.
        tries, kept = (queue[-1:], queue[:-1]) if kind == "arrive" else (queue, [])
        waiting = kept
        for j in tries:
            c, arrived, duration = jobs[j]
            p = place(fleet, Ask(c.pods, c.gpus, c.topology), policy)
            if p is None:
                waiting.append(j)
                continue
            apply(fleet, p)
            running[j] = p
            out.placed[c.name] = out.placed.get(c.name, 0) + 1
            if c.total >= 8:
                out.gang_waits.append(t - arrived)
                out.at_once += t == arrived
            push(t + duration, "leave", j)
        queue = waiting
    return out


def _sample(fleet: Fleet, t: float) -> Sample:
    loads = fleet.loads.values()
    half = sum(1 for load in loads if load.free == 4 and load.allocs.get(4))
    mixed = sum(1 for load in loads if len(load.allocs) > 1)
    return Sample(t, fleet.total - fleet.free, largest_placeable(fleet), half, mixed)
