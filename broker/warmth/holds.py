"""Owner holds, and which idle pods give way when queued jobs are blocked at a pool's ceiling.

After a job a pod is held for its caller for `caller_hold_seconds` (inheriting `idle_timeout`); the hold
lives in the pod record (and the pod's annotations, so a restarted broker restores it). When queued jobs
are blocked at a pool's ceiling, idle pods that no queued job can take retire so the ceiling can serve
them: a hold is spared only for as many pods as its owner's queued jobs could take (a single-use job takes
no held pod, so it spares none), and only on pods older than a minimum tenure, oldest first. Never-used
idle pods beyond the queued warm demand give way too (a single-use job cannot take them either), and so
do the idle standbys of a card whose active pod is gone: they hold that card's place under the ceiling
(broker.warmth.standby), a warm job could be promoted onto them, a single-use job never. A retired pod's
state belongs to its owner: the room it frees is what the blocked jobs get, never the pod.

A set of pods made for one job (a single-use set, a gang confined to one node or domain) is made whole or not at
all, so room short of it serves nobody: holds break for a blocked set only when the breaks let it be made (room
under the ceiling and the budget, and a placement that keeps it on one node or domain), and then only the fewest,
oldest first; for a set no breaks can make fit, none break.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from broker.fleet.nodes import Fleet
from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec
from broker.warmth import placing
from broker.warmth.standby import groups

MIN_TENURE_S = 60.0
"""A pod younger than this keeps its hold even when the pool is blocked (paper App. A.5 default)."""


def holds_to_break(pods: list[Pod], blocked: int, queued_by: Mapping[str, int], now: float,
                   min_tenure: float = MIN_TENURE_S, warm_demand: int | None = None) -> list[Pod]:
    """The idle pods to retire so `blocked` queued pods fit under the ceiling, oldest first (see `hold_units`)."""
    if blocked <= 0:
        return []
    return [p for unit in hold_units(pods, queued_by, now, min_tenure, warm_demand)[:blocked] for p in unit]


def hold_units(pods: list[Pod], queued_by: Mapping[str, int], now: float, min_tenure: float = MIN_TENURE_S,
               warm_demand: int | None = None) -> list[list[Pod]]:
    """Every idle pod that may give way at the ceiling, in the order they do: units that each free one place.

    `queued_by` is owner -> pods of its queued jobs that could take its held pods (warm jobs, not
    single-use). A candidate is an idle used pod whose hold expired, or a live hold beyond what its
    owner's queued jobs could take, on a pod created at least `min_tenure` seconds ago; then, when
    `warm_demand` (pods of queued warm jobs, which could take a never-used pod or a standby) is given,
    never-used idle pods and orphaned cards (all idle standbys of a card with no active pod, which free
    the card together) beyond it, longest idle first. A pod alone on its card goes with its card's idle
    standbys, since the card's place under the ceiling frees only with all of them.
    """
    cards = groups(pods)

    def unit(p: Pod) -> list[Pod]:
        """The pod, with its card's idle standbys when it is the card's only active: the card frees only so."""
        group = cards.get(p.gpus) if p.gpus else None
        if group is None or group.actives != [p] or any(s.state is not PodState.IDLE for s in group.standbys):
            return [p]
        return [p, *group.standbys]

    held: dict[str, list[Pod]] = {}
    fresh: list[list[Pod]] = []
    for p in pods:
        if p.state is not PodState.IDLE or p.standby or p.reserved_for is not None or p.origin is Origin.SINGLE_USE:
            continue  # a reserved pod is its job's; a standby is its card's (below)
        if p.used and p.caller is not None:
            if now - p.created_at >= min_tenure:
                held.setdefault(p.caller if p.hold_until > now else "", []).append(p)
        elif not p.used:
            fresh.append(unit(p))
    for group in cards.values():
        if not group.actives and group.standbys and all(p.state is PodState.IDLE for p in group.standbys):
            fresh.append(group.standbys)
    candidates = [unit(p) for p in held.pop("", [])]  # expired holds: nobody's any more
    for owner, mine in held.items():
        mine.sort(key=lambda p: (p.created_at, p.name))
        candidates += [unit(p) for p in mine[: max(0, len(mine) - queued_by.get(owner, 0))]]
    candidates.sort(key=lambda unit: (unit[0].created_at, unit[0].name))
    if warm_demand is not None:
        fresh.sort(key=lambda unit: (max(p.idle_since for p in unit), unit[0].name))
        candidates += fresh[: max(0, len(fresh) - warm_demand)]
    return candidates


@dataclass(frozen=True)
class BlockedSet:
    """A set of `pods` new pods for one job that the pool could not make this pass: confined to one `where`
    (`node` | `domain`; "" anywhere, a single-use set), joining the nodes `near` (its pods already made or held)."""

    pods: int
    where: str = ""
    near: tuple[str, ...] = ()


def breaks_for_sets(units: Sequence[list[Pod]], sets: Sequence[BlockedSet], room: int, spec: PoolSpec,
                    fleet: Callable[[], Fleet]) -> list[Pod]:
    """The idle pods to retire for blocked sets, in dispatch order: for each, the fewest more of `units` (oldest
    first, as `hold_units` orders them) after whose retirement it fits beside the sets before it, or none for a
    set that no breaks let fit. Of the oldest that make it fit, those it does not need (a pod on a node the set
    cannot use) keep their hold. `room`: places the sets have now (under the ceiling and the budget); `fleet`:
    the pool's nodes as the tracked pods hold them now (a fresh copy each call)."""
    chosen: list[list[Pod]] = []
    rest = list(units)
    fitting: list[BlockedSet] = []

    def fit(gone: list[list[Pod]], blocked: BlockedSet) -> bool:
        return fits([*fitting, blocked], room + len(gone), gone, spec, fleet)

    for blocked in sets:
        k = next((k for k in range(len(rest) + 1) if fit(chosen + rest[:k], blocked)), None)
        if k is None:
            continue  # no breaks let it fit: none for it
        extra = rest[:k]
        for unit in reversed(rest[:k]):  # the newest first: the older a hold, the sooner it gives way
            if fit(chosen + [u for u in extra if u is not unit], blocked):
                extra.remove(unit)
        chosen += extra
        rest = [u for u in rest if not any(u is e for e in extra)]
        fitting.append(blocked)
    return [p for unit in chosen for p in unit]


def fits(sets: Sequence[BlockedSet], room: int, gone: Sequence[list[Pod]], spec: PoolSpec,
         fleet: Callable[[], Fleet]) -> bool:
    """Whether every set can be made at once, with `room` places, once the pods `gone` left their nodes."""
    if sum(s.pods for s in sets) > room:
        return False
    if spec.gpus <= 0:
        return True  # nodes do not matter: the backend places every pod
    mine = fleet()
    for p in (p for unit in gone for p in unit if not p.standby):  # a standby holds no GPUs of its own
        load, gpus = mine.loads.get(p.node), len(p.gpus) or spec.gpus
        if load is not None and load.allocs[gpus] > 0:
            load.remove(gpus)
    for s in sets:
        nodes = (placing.where_set(mine, spec, s.pods, s.where, s.near) if s.where
                 else placing.where(mine, spec, s.pods))
        if len(nodes) < s.pods:
            return False
        mine.apply([n for n in nodes if n in mine.loads], spec.gpus)
    return True
