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
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.pods import Origin, Pod, PodState
from broker.warmth.standby import groups

MIN_TENURE_S = 60.0
"""A pod younger than this keeps its hold even when the pool is blocked (paper App. A.5 default)."""


def holds_to_break(pods: list[Pod], blocked: int, queued_by: Mapping[str, int], now: float,
                   min_tenure: float = MIN_TENURE_S, warm_demand: int | None = None) -> list[Pod]:
    """The idle pods to retire so `blocked` queued pods fit under the ceiling, oldest first.

    `queued_by` is owner -> pods of its queued jobs that could take its held pods (warm jobs, not
    single-use). A candidate is an idle used pod whose hold expired, or a live hold beyond what its
    owner's queued jobs could take, on a pod created at least `min_tenure` seconds ago; then, when
    `warm_demand` (pods of queued warm jobs, which could take a never-used pod or a standby) is given,
    never-used idle pods and orphaned cards (all idle standbys of a card with no active pod, which free
    the card together) beyond it, longest idle first. A pod alone on its card goes with its card's idle
    standbys, since the card's place under the ceiling frees only with all of them.
    """
    if blocked <= 0:
        return []
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
    return [p for unit in candidates[:blocked] for p in unit]
