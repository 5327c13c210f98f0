"""A single-use pod that retires (its job was cancelled or placed elsewhere) is counted once by the floor: it
must not read as a missing floor pod and bring a plain pod into the pool for a job that is gone."""

from __future__ import annotations

from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec
from broker.warmth.pooling import count, plan

NOW = 1000.0
FLOOR_1 = PoolSpec(name="p", min_count=1, max_idle_count=1, max_count=4, idle_timeout=60.0, step=4)


def _pod(name: str, state: PodState, origin: Origin) -> Pod:
    pod = Pod(name, "p", (), state=state, origin=origin, template=FLOOR_1.template_hash, created_at=NOW - 10)
    pod.idle_since = NOW - 5
    return pod


def test_a_retiring_single_use_pod_does_not_make_the_floor_create_a_plain_pod() -> None:
    pods = [_pod("floor", PodState.IDLE, Origin.WARM), _pod("orphan", PodState.RETIRING, Origin.SINGLE_USE)]
    counts = count(pods, FLOOR_1, NOW)
    p = plan(FLOOR_1, pods, counts, demand=0, now=NOW)
    assert p.create == 0, p


def test_the_floor_still_replaces_a_retiring_plain_pod() -> None:
    pods = [_pod("floor", PodState.RETIRING, Origin.WARM), _pod("single", PodState.IDLE, Origin.SINGLE_USE)]
    p = plan(FLOOR_1, pods, count(pods, FLOOR_1, NOW), demand=0, now=NOW)
    assert p.create == 1 and "floor" in p.reason, p
