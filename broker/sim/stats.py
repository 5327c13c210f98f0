"""The statistics of App. B.4, in one place for the simulator and the benchmarks.

Percentiles pool all jobs of an arm with linear interpolation; paired effects are computed per repeat and
summarised with a 95% bootstrap CI over repeats (seed 2027, 2,000 resamples, percentile method); arms
run in a Williams crossover order so each arm follows every other equally often.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

BOOTSTRAP_SEED = 2027  # App. B.4: "seed 2027"
BOOTSTRAP_RESAMPLES = 2000  # App. B.4: "2,000 resamples"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    data = sorted(values)
    k = (len(data) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def pooled_percentile(groups: Sequence[Sequence[float]], q: float) -> float:
    """The q-th percentile of all jobs of all repeats together (Table 5: "percentiles pool all jobs")."""
    return percentile([v for g in groups for v in g], q)


@dataclass(frozen=True, slots=True)
class Effect:
    """A paired effect and its bootstrap confidence interval."""

    estimate: float
    lo: float
    hi: float

    def __str__(self) -> str:
        return f"{self.estimate:.3g} [{self.lo:.3g}, {self.hi:.3g}]"


def bootstrap(pairs: Sequence[tuple[float, float]], statistic: Callable[[Sequence[tuple[float, float]]], float],
              *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> Effect:
    """`statistic` over the repeats' pairs, with a percentile bootstrap CI resampling whole repeats."""
    if not pairs:
        raise ValueError("bootstrap of no repeats")
    rng = random.Random(seed)
    n = len(pairs)
    draws = sorted(statistic([pairs[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - level) / 2.0 * 100.0
    return Effect(statistic(pairs), percentile(draws, tail), percentile(draws, 100.0 - tail))


def paired_difference(base: Sequence[float], other: Sequence[float], *, seed: int = BOOTSTRAP_SEED) -> Effect:
    """Median over repeats of (other − base), e.g. Off minus On per repeat (Table 5's paired differences)."""
    return bootstrap(_pairs(base, other), lambda ps: statistics.median(o - b for b, o in ps), seed=seed)


def speedup(fast: Sequence[float], slow: Sequence[float], *, center: str = "median",
            seed: int = BOOTSTRAP_SEED) -> Effect:
    """How many times `fast` beats `slow`: center(slow) ÷ center(fast) over repeats (Table 5's loop speedup uses
    medians of makespans; `center="mean"` gives a ratio of means), bootstrapped over paired repeats."""
    if center not in ("median", "mean"):
        raise ValueError(f"center must be median or mean, got {center!r}")

    def pick(values: Sequence[float]) -> float:
        return statistics.median(values) if center == "median" else statistics.fmean(values)

    def ratio(ps: Sequence[tuple[float, float]]) -> float:
        return pick([s for _, s in ps]) / pick([f for f, _ in ps])

    return bootstrap(_pairs(fast, slow), ratio, seed=seed)


def _pairs(a: Sequence[float], b: Sequence[float]) -> list[tuple[float, float]]:
    if len(a) != len(b):
        raise ValueError(f"paired samples of different lengths ({len(a)} and {len(b)})")
    return list(zip(a, b, strict=True))


def williams_orders(k: int) -> list[list[int]]:
    """A Williams design for k arms: each arm in each position, and each ordered pair of arms adjacent equally
    often (k sequences for even k, 2k for odd k: the cyclic rows and their reverses)."""
    if k < 1:
        raise ValueError("a crossover needs at least one arm")
    first: list[int] = [0]
    lo, hi = 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(a + i) % k for a in first] for i in range(k)]
    if k % 2:
        rows += [list(reversed(r)) for r in rows]
    return rows


def crossover_order(arms: Sequence[T], repeat: int) -> list[T]:
    """The order to run `arms` in for repeat number `repeat` (0-based), cycling through the Williams design."""
    rows = williams_orders(len(arms))
    return [arms[i] for i in rows[repeat % len(rows)]]
