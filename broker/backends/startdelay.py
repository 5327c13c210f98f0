"""The local backend's modelled start delays: a pool's `venue_delay` (broker.startmodel) drawn per start.

The simulator's venue models (`broker.sim.venues`) build the same template and use the same sampler, so a
benchmark on the local backend and the simulator draw cold starts from one model.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from broker.startmodel import StartModel, from_template

__all__ = ["StartModel", "VenueDelays", "from_template"]


class VenueDelays:
    """A backend's modelled start delays: each pool draws from its own sequence, seeded by the template."""

    def __init__(self) -> None:
        self._rngs: dict[str, random.Random] = {}

    def draw(self, pool: str, template: Mapping[str, Any], starting: int) -> float:
        """The modelled delay (s) for one start of `pool` with `starting` pods starting at once, 0.0 without a
        model; ValueError names a bad `venue_delay`. Unseeded models draw from fresh entropy."""
        parsed = from_template(template)
        if parsed is None:
            return 0.0
        model, seed = parsed
        rng = self._rngs.get(pool)
        if rng is None:
            rng = self._rngs[pool] = random.Random(f"{pool}/{seed}") if seed is not None else random.Random()
        return round(model.sample(rng, starting), 6)
