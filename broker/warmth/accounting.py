"""The pool controller's GPU accounting: the accelerator budget ledger and borrowed capacity.

Every create reserves its GPUs (CPU cores) first, in the pool's own budget and then, for a pool that may
borrow, in another owner's unused capacity; a deleted pod gives its reservation back (or hands it to the
pod still on its GPUs, for an active-standby group); each pass adopts pods the ledgers do not know (a
restarted broker) and drops vanished ones. A pool whose creates the budget holds back gets one
`budget.throttled` event when that starts.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.events import EventLog
from broker.pods import Pod, PodState
from broker.pools import PoolSpec
from broker.warmth.borrowing import Borrowing
from broker.warmth.budgets import Ledger, units_of
from broker.warmth.scaling import Plan, followers


class Accounting:
    """The ledger half of broker.warmth.pooling.PoolController (a mixin: it holds no state of its own)."""

    clock: Clock
    tracker: Tracker
    pools: dict[str, PoolSpec]
    ledger: Ledger
    borrowing: Borrowing | None
    events: EventLog | None
    throttled: set[str]
    on_ready: Callable[[], None]

    def headroom(self, spec: PoolSpec) -> int | None:
        """Whole pods the pool's accelerator budget (plus borrowable capacity) still allows; None: unbounded."""
        units = units_of(spec)
        own = self.ledger.pods_fit(spec.accelerator, units)
        if own is None:
            return None
        if spec.borrow and self.borrowing is not None:
            own += self.borrowing.fits(spec.accelerator, units)
        return own

    def borrowed(self, pods: list[Pod]) -> int:
        """How many of these pods sit on borrowed capacity."""
        if self.borrowing is None:
            return 0
        return sum(1 for p in pods if self.borrowing.ledger.holds(p.name))

    def _reserve(self, name: str, spec: PoolSpec) -> bool:
        units = units_of(spec)
        if self.ledger.reserve(name, spec.accelerator, units):
            return True
        b = self.borrowing
        return (
            spec.borrow
            and b is not None
            and b.ledger.limit(spec.accelerator) is not None
            and b.ledger.reserve(name, spec.accelerator, units)
        )

    def _release(self, pod: Pod) -> None:
        """A pod is gone: its group's reservation moves to a pod still on its GPUs, or is given back."""
        spec = self.pools.get(pod.pool)
        shared = (
            pod.gpus and spec is not None and spec.standbys_per_active > 0
        )  # only standby pools share GPUs
        mate = (
            next(
                (
                    p
                    for p in self.tracker.snapshot()
                    if p.gpus == pod.gpus and p.name != pod.name and p.state is not PodState.GONE
                ),
                None,
            )
            if shared
            else None
        )
        for ledger in (self.ledger, *((self.borrowing.ledger,) if self.borrowing is not None else ())):
            r = ledger.release(pod.name)
            if r is not None and mate is not None and not ledger.holds(mate.name):
                ledger.adopt(mate.name, r.accelerator, r.units)

    def _sync_ledgers(self, snapshot: list[Pod]) -> None:
        """Observe: adopt pods the ledger does not know (recovered after a restart), drop vanished ones."""
        live = {p.name for p in snapshot if p.state is not PodState.GONE}
        ledgers = [self.ledger] + ([self.borrowing.ledger] if self.borrowing is not None else [])
        for ledger in ledgers:
            for name in ledger.pods():
                if name not in live:
                    ledger.release(name)
        groups: set[tuple[str, ...]] = set()
        for ledger in ledgers:
            for name in ledger.pods():
                pod = self.tracker.pods.get(name)
                if pod is not None and pod.gpus:
                    groups.add(pod.gpus)
        skip: set[str] = set()
        by_pool: dict[str, list[Pod]] = {}
        for pod in snapshot:
            by_pool.setdefault(pod.pool, []).append(pod)
        for name, pods in by_pool.items():
            spec = self.pools.get(name)
            if spec is not None:
                skip |= followers(pods, spec, self.clock.now())
        for pod in snapshot:
            spec = self.pools.get(pod.pool)
            if spec is None or pod.state is PodState.GONE or pod.name in skip or pod.gpus in groups:
                continue
            if not any(ledger.holds(pod.name) for ledger in ledgers):
                self.ledger.adopt(pod.name, spec.accelerator, units_of(spec))
                if pod.gpus:
                    groups.add(pod.gpus)

    def _note_budget_full(self, full: frozenset[str]) -> None:
        """Tell the tracker which pools' budgets allow no pod (a ceiling for takeovers); a pool newly full
        wakes the dispatcher, whose blocked jobs may now take their caller's least recently used session."""
        if full == self.tracker.budget_full:
            return
        newly = full - self.tracker.budget_full
        self.tracker.budget_full = full
        if newly:
            self.on_ready()

    def _note_throttle(self, spec: PoolSpec, p: Plan, created: int, demand: int) -> None:
        """A `budget.throttled` event when the accelerator budget starts holding this pool's creates back."""
        throttled = demand > 0 and (
            created < p.create or p.reason.startswith(f"budget of {spec.accelerator} exhausted")
        )
        if not throttled:
            self.throttled.discard(spec.name)
            return
        if spec.name in self.throttled:
            return
        self.throttled.add(spec.name)
        if self.events is not None:
            view = self.ledger.view().get(spec.accelerator, {})
            self.events.emit(
                "budget.throttled",
                spec.name,
                f"budget of {spec.accelerator} exhausted ({view.get('used')} of {view.get('limit')} "
                f"in use): {demand} queued pods wait for capacity to free",
                None,
                None,
                {
                    "accelerator": spec.accelerator,
                    "demand_pods": demand,
                    "used": view.get("used"),
                    "limit": view.get("limit"),
                },
            )
