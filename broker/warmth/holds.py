"""Owner holds and when to break them.

After a job a pod is held for its caller for `caller_hold_seconds` (inheriting `idle_timeout`); the hold
lives in the pod record (and the pod's annotations, so a restarted broker restores it). When queued jobs
are blocked at a pool's ceiling, holds are broken so the ceiling can serve them: only on pods older than a
minimum tenure, oldest first, never an owner's whose own jobs are queued. A broken hold retires the pod
(its state belongs to its owner); the room it frees is what the blocked jobs get, never the pod itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.pods import Pod, PodState

MIN_TENURE_S = 60.0
"""A pod younger than this keeps its hold even when the pool is blocked (paper App. A.5 default)."""


def holds_to_break(pods: list[Pod], blocked: int, queued_by: Mapping[str, int], now: float,
                   min_tenure: float = MIN_TENURE_S) -> list[Pod]:
    """The held pods to retire so `blocked` queued pods fit under the ceiling, oldest pod first.

    A candidate is an idle used pod whose hold expired, or a live hold of an owner with nothing queued
    in this pool (an excess hold), on a pod created at least `min_tenure` seconds ago.
    """
    if blocked <= 0:
        return []
    candidates = [p for p in pods
                  if p.state is PodState.IDLE and p.used and p.caller is not None
                  and now - p.created_at >= min_tenure
                  and (p.hold_until <= now or queued_by.get(p.caller, 0) <= 0)]
    candidates.sort(key=lambda p: (p.created_at, p.name))
    return candidates[:blocked]
