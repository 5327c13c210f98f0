"""Borrowed capacity: warm or burst pods placed on another owner's reserved-but-unused GPUs.

A capacity source publishes, per GPU model, how many reserved GPUs are unused; that figure is the
ceiling of a second ledger. Pools with `borrow: true` place pods there once their own budget is spent.
When the owner reclaims, the published ceiling drops by what the owner needs and Firepool releases
exactly that many borrowed GPUs, newest borrowed pod first: an idle or starting pod retires now, a busy
one retires when its job ends (no job fails). Polled every `poll_s` (10 s by default, App. A.7).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.clock import Clock
from broker.errors import FirepoolError
from broker.pods import Pod, PodState
from broker.ports.capacity import CapacitySource
from broker.warmth.budgets import Ledger

log = logging.getLogger("firepool.borrowing")

POLL_S = 10.0


@dataclass(frozen=True)
class Preemption:
    retire: tuple[str, ...] = ()
    """Idle or starting borrowed pods to retire now."""
    mark: tuple[str, ...] = ()
    """Busy borrowed pods to retire when their job ends."""
    gpus: float = 0.0
    """GPUs this preemption gives back."""


class Borrowing:
    def __init__(self, source: CapacitySource, clock: Clock, poll_s: float = POLL_S) -> None:
        self.source = source
        self.clock = clock
        self.poll_s = poll_s
        self.ledger = Ledger()
        """Borrowed GPUs by model; the limit is the published figure (absent: nothing to borrow)."""
        self.published: dict[str, float] = {}
        self.last_poll: float | None = None
        self.released: dict[str, float] = {}
        """GPUs given back to owners per model (counted when preemption starts)."""

    def refresh(self, figures: Mapping[str, float] | None = None) -> bool:
        """Read the source (unless `figures` were read already) and apply its figures; False when the read
        failed (the last figures stay)."""
        try:
            figures = dict(self.source.read() if figures is None else figures)
        except FirepoolError as exc:
            log.warning("capacity source read failed; keeping the last figures: %s", exc)
            return False
        self.last_poll = self.clock.now()
        for model in set(self.published) - set(figures):
            self.ledger.set_limit(model, 0.0)
        for model, gpus in figures.items():
            self.ledger.set_limit(model, gpus)
        self.published = figures
        return True

    def fits(self, model: str, units: float) -> int:
        """Whole pods of `units` GPUs that may still be borrowed."""
        if self.ledger.limit(model) is None:
            return 0
        return self.ledger.pods_fit(model, units) or 0

    def preempt(self, pods: Mapping[str, Pod]) -> Preemption:
        """Borrowed pods to give back so borrowed use fits the published ceiling, newest first."""
        retire: list[str] = []
        mark: list[str] = []
        given = 0.0
        for model, view in self.ledger.view().items():
            limit = view["limit"] or 0.0
            used = view["used"] or 0.0
            mine = [(p, r.units) for p in pods.values()
                    if (r := self.ledger.reservation(p.name)) is not None and r.accelerator == model]
            leaving = sum(u for p, u in mine if _leaving(p))
            need = used - leaving - limit
            if need <= 1e-9:
                continue
            for pod, units in sorted(mine, key=lambda pu: (-pu[0].created_at, pu[0].name)):
                if need <= 1e-9:
                    break
                if _leaving(pod):
                    continue
                (retire if pod.state in (PodState.IDLE, PodState.STARTING) else mark).append(pod.name)
                need -= units
                given += units
                self.released[model] = self.released.get(model, 0.0) + units
        return Preemption(tuple(retire), tuple(mark), given)

    async def run(self, wake: Callable[[], None]) -> None:
        """Poll the source every `poll_s`; `wake()` the controller when figures change."""
        while True:
            before = dict(self.published)
            figures: Mapping[str, float] | None = None
            if self.source.blocking:  # a file or URL: read off the event loop
                try:
                    figures = await asyncio.to_thread(self.source.read)
                except FirepoolError as exc:
                    log.warning("capacity source read failed; keeping the last figures: %s", exc)
                    figures = self.published
            if self.refresh(figures) and self.published != before:
                wake()
            await self.clock.sleep(self.poll_s)


def _leaving(pod: Pod) -> bool:
    return pod.state in (PodState.RETIRING, PodState.GONE) or pod.retire
