"""Counters and histograms the control plane keeps for itself; `/metrics` and benchmarks read them.

Plain in-process numbers (no metrics library in core), so the simulator and unit tests see the same
figures the Prometheus exporter publishes.
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

RESET_PROOFS_KEPT = 5
"""Reset proofs kept per pod (the dashboard's Pods page shows them)."""
RESET_PROOF_PODS = 10_000
"""Pods whose proofs are kept, most recently reset first; older pods are forgotten."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram in the Prometheus convention."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


@dataclass
class Stats:
    acquisitions: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(pool, path) -> pods acquired."""
    start_latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    """(pool, path of rank 0) -> submit -> first instruction, seconds."""
    jobs_finished: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(pool, state) -> jobs that reached a terminal state."""
    resets: Counter[tuple[str, bool]] = field(default_factory=Counter)
    """(pool, clean) -> resets."""
    pods_created: Counter[str] = field(default_factory=Counter)
    pods_deleted: Counter[str] = field(default_factory=Counter)
    reset_proofs: OrderedDict[str, list[dict[str, object]]] = field(default_factory=OrderedDict)
    """pod -> its last resets: when, how long, clean, processes killed, residue found."""

    def observe_reset(self, pod: str, at: float, clean: bool, duration_s: float | None = None, killed: int = 0,
                      problems: tuple[str, ...] = ()) -> None:
        proof: dict[str, object] = {"at": at, "clean": clean, "duration_s": duration_s, "killed": killed,
                                    "residue": list(problems)}
        self.reset_proofs[pod] = [*self.reset_proofs.pop(pod, []), proof][-RESET_PROOFS_KEPT:]
        while len(self.reset_proofs) > RESET_PROOF_PODS:
            self.reset_proofs.popitem(last=False)

    def observe_start(self, pool: str, path: str, seconds: float) -> None:
        hist = self.start_latency.get((pool, path))
        if hist is None:
            hist = self.start_latency[(pool, path)] = Histogram()
        hist.observe(seconds)
