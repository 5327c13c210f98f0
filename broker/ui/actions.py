"""What an admin may do from the dashboard: break a hold, retire a session, drain a pool.

Each action goes through the same control-plane calls the broker uses itself: a broken hold is the
held pod retired (as the scaler breaks holds at a pool's ceiling, counted in `holds_broken`); a retired
session is `ControlPlane.end_session` on the owner's behalf; a drained pool has its idle pods retired
now and its busy ones marked to retire at release, so the floor refills it with fresh pods.
"""

from __future__ import annotations

from typing import Any

from broker.control import ControlPlane
from broker.errors import Conflict, InvalidRequest, NotFound
from broker.pods import PodState


def break_hold(cp: ControlPlane, pod_name: str) -> dict[str, Any]:
    pod = cp.tracker.pods.get(pod_name)
    if pod is None:
        raise NotFound(f"no pod {pod_name!r}", {"pod": pod_name})
    if not pod.held(cp.clock.now()):
        raise Conflict(f"pod {pod_name} holds nothing (it is {pod.state.value})", {"pod": pod_name})
    owner = pod.caller
    if not cp.controller.retire(pod_name, only_if_idle_since=pod.idle_since):
        raise Conflict(f"pod {pod_name} was taken meanwhile", {"pod": pod_name})
    cp.controller.holds_broken[pod.pool] = cp.controller.holds_broken.get(pod.pool, 0) + 1
    cp.controller.wake()
    return {"pod": pod_name, "pool": pod.pool, "owner": owner}


async def retire_session(cp: ControlPlane, caller: str, queue: str, tag: str) -> dict[str, Any]:
    return await cp.end_session(caller, tag, queue)


def drain_pool(cp: ControlPlane, pool: str) -> dict[str, Any]:
    if pool not in cp.catalog.pools:
        raise InvalidRequest(f"no pool {pool!r}", {"field": "pool"})
    retired, marked = [], []
    for pod in cp.tracker.snapshot():
        if pod.pool != pool:
            continue
        if pod.state in (PodState.IDLE, PodState.STARTING):
            if cp.controller.retire(pod.name, only_if_idle_since=None if pod.state is PodState.STARTING
                                    else pod.idle_since):
                retired.append(pod.name)
        elif cp.tracker.retire_at_release(pod.name):
            marked.append(pod.name)
    cp.controller.wake()
    return {"pool": pool, "retired": retired, "retiring_at_release": marked}
