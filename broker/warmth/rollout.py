"""Template rollout: a changed pool template makes older pods stale; they drain a few at a time.

At most `drain_budget` stale pods are in flight (retiring, marked to retire when their job ends, or
replaced by a pod still starting) at once. An idle stale pod retires now; a busy one finishes its job first, so no job fails. Replacements
come from the ordinary scaler (a retiring pod is still physical, so the ceiling is never exceeded) and
go to whichever job the dispatcher serves first, the longest waiter.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.pods import Pod, PodState
from broker.pools import PoolSpec

_BUSY = (PodState.ASSIGNED, PodState.RUNNING, PodState.RESETTING)


@dataclass(frozen=True)
class Drain:
    retire: tuple[str, ...] = ()
    """Idle (or starting) stale pods to retire now."""
    mark: tuple[str, ...] = ()
    """Busy stale pods to retire when their job ends."""


def drain(spec: PoolSpec, pods: list[Pod], now: float) -> Drain:
    """The stale pods to start draining this pass, within the pool's drain budget."""
    template = spec.template_hash
    stale = [p for p in pods if p.template != template and p.state is not PodState.GONE]
    # A drain stays in flight until its replacement is ready: retiring or marked stale pods, and
    # current-template pods still starting (a rolling update that never takes more than the budget away).
    in_flight = (sum(1 for p in stale if p.state is PodState.RETIRING or (p.retire and p.state in _BUSY))
                 + sum(1 for p in pods if p.template == template and p.state is PodState.STARTING))
    budget = max(0, spec.drain_budget - in_flight)
    if not budget:
        return Drain()
    # Unheld idle first (nobody loses a warm pod), then held idle, then busy; oldest first within each.
    idle = sorted((p for p in stale if p.state in (PodState.IDLE, PodState.STARTING)),
                  key=lambda p: (p.held(now), p.created_at, p.name))
    busy = sorted((p for p in stale if p.state in _BUSY and not p.retire), key=lambda p: (p.created_at, p.name))
    retire = tuple(p.name for p in idle[:budget])
    mark = tuple(p.name for p in busy[: budget - len(retire)])
    return Drain(retire=retire, mark=mark)
