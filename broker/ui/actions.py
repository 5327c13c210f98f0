"""What the dashboard's forms do. An admin may break a hold, retire a session, drain a pool; any caller
may cancel their own job and end their own session.

Each action goes through the same control-plane calls the broker uses itself: a broken hold is the
held pod retired (as the scaler breaks holds at a pool's ceiling, counted in `holds_broken`); a retired
session is `ControlPlane.end_session` on the owner's behalf; a drained pool has its idle pods retired
now and its busy ones marked to retire at release, so the floor refills it with fresh pods. A caller's
own cancel and end-session are `ControlPlane.cancel` and `ControlPlane.end_session` for that caller, as
REST's `POST /v1/jobs/{id}/cancel` and `DELETE /v1/sessions/{tag}`; another caller's job or session is
"not found", exactly as one that does not exist.
"""

from __future__ import annotations

from typing import Any

from broker.control import ControlPlane
from broker.errors import Conflict, InvalidRequest, NotFound
from broker.jobs import Job
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


async def cancel_own_job(cp: ControlPlane, caller: str, job_id: str) -> Job:
    """Cancel `caller`'s own job (NotFound for another caller's, as for none)."""
    return await cp.cancel(caller, job_id)


async def end_own_session(cp: ControlPlane, caller: str, queue: str, tag: str) -> dict[str, Any]:
    """End `caller`'s own live session; NotFound when the caller has no such session (another caller's
    included: the same answer as for a tag nobody uses)."""
    key = (caller, queue, tag)
    live = any(pod.key == key for pod in cp.tracker.snapshot()) or any(
        j.caller == caller and j.spec.queue == queue and j.spec.lease_tag == tag and not j.terminal
        for j in cp.book.live.values())
    if not tag or not live:
        raise NotFound(f"no session {tag!r}", {"session": tag})
    return await cp.end_session(caller, tag, queue)
