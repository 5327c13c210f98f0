"""A modelled pod start: a venue's cold start as a distribution, and a pool template's `venue_delay` read as one.

A pool opts in with `template: {venue_delay: {median_s, p90_s, crowd_n, crowd_factor, scale, seed}}`: each
pod start then draws a lognormal fitted to the median and p90, stretched by node contention when several
pods start at once (linear from 1× for one pod to `crowd_factor`× for `crowd_n` or more), times `scale`.
Pure (no I/O): the catalog checks a pool's `venue_delay` with `from_template` when it is read, the local
backend draws from it (broker.backends.startdelay), and the simulator's venue models build the template.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

Z90 = 1.2815515655446004
"""The standard normal's 90th percentile: a lognormal's p90 is exp(mu + Z90 * sigma)."""


@dataclass(frozen=True, slots=True)
class StartModel:
    """A cold-start distribution: lognormal from median and p90, with a contention term for crowded starts."""

    median_s: float
    """Median create→ready of one pod started alone (s)."""
    p90_s: float
    """Its 90th percentile (s); equal to the median for a fixed delay."""
    crowd_n: int = 1
    """How many pods starting at once give the full contention factor."""
    crowd_factor: float = 1.0
    """How much slower a start is when `crowd_n` or more pods start together (1.0: no contention)."""
    scale: float = 1.0
    """Multiplies every draw (0.1: a tenth of the venue's cold start)."""

    def __post_init__(self) -> None:
        if not (self.median_s >= 0 and self.p90_s >= self.median_s):
            raise ValueError(f"a start model needs 0 <= median_s <= p90_s, got {self.median_s}, {self.p90_s}")
        if self.crowd_n < 1 or self.crowd_factor < 1.0 or self.scale < 0:
            raise ValueError("a start model needs crowd_n >= 1, crowd_factor >= 1 and scale >= 0")

    @property
    def sigma(self) -> float:
        """The lognormal's shape, fitted so that its median and p90 are the model's."""
        if self.median_s <= 0 or self.p90_s == self.median_s:
            return 0.0
        return math.log(self.p90_s / self.median_s) / Z90

    def crowding(self, starting: int) -> float:
        """The contention multiplier with `starting` pods starting at once (this one included)."""
        if self.crowd_n <= 1:
            return 1.0
        n = min(max(starting, 1), self.crowd_n)
        return 1.0 + (self.crowd_factor - 1.0) * (n - 1) / (self.crowd_n - 1)

    def sample(self, rng: random.Random, starting: int = 1) -> float:
        """One start's duration (s), scaled, given how many pods start at once."""
        if self.median_s <= 0:
            return 0.0
        base = self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0)) if self.sigma else self.median_s
        return base * self.crowding(starting) * self.scale

    def scaled(self, factor: float) -> StartModel:
        """The same model with every draw multiplied by `factor` more."""
        return StartModel(self.median_s, self.p90_s, self.crowd_n, self.crowd_factor, self.scale * factor)

    def template(self, seed: int | None = None) -> dict[str, Any]:
        """The pool-template value (`template: {venue_delay: ...}`) that makes a backend use this model."""
        return {**asdict(self), **({"seed": seed} if seed is not None else {})}


def from_template(template: Mapping[str, Any]) -> tuple[StartModel, int | None] | None:
    """The pool template's start model and seed, or None when it has none; ValueError names a bad field."""
    raw = template.get("venue_delay")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(
            "venue_delay must be a mapping of median_s, p90_s, crowd_n, crowd_factor, scale, seed"
        )
    fields = {"median_s", "p90_s", "crowd_n", "crowd_factor", "scale", "seed"}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ValueError(f"venue_delay: unknown field(s) {unknown} (allowed: {sorted(fields)})")
    try:
        model = StartModel(
            median_s=float(raw["median_s"]),
            p90_s=float(raw.get("p90_s", raw["median_s"])),
            crowd_n=int(raw.get("crowd_n", 1)),
            crowd_factor=float(raw.get("crowd_factor", 1.0)),
            scale=float(raw.get("scale", 1.0)),
        )
    except KeyError:
        raise ValueError("venue_delay needs median_s") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"venue_delay: {exc}") from None
    seed = raw.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError("venue_delay: seed must be an integer")
    return model, seed
