"""The pool controller's plan: demand, the floor, the ceiling, keep-alive, owner holds, idle cap."""

from __future__ import annotations

from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec
from broker.warmth.pooling import count, plan
from tests.unit.harness import Harness, cpu_pool


def _pods(spec: PoolSpec, states: list[PodState], **fields: object) -> list[Pod]:
    pods = []
    for i, state in enumerate(states):
        pod = Pod(f"p{i}", spec.name, state=state, origin=Origin.WARM, template=spec.template_hash)
        for k, v in fields.items():
            setattr(pod, k, v)
        pods.append(pod)
    return pods


def test_demand_creates_up_to_step_and_ceiling_and_starting_pods_are_supply() -> None:
    spec = PoolSpec(name="p", max_count=5, step=2)
    assert plan(spec, [], count([], spec, 0.0), demand=4, now=0.0).create == 2
    starting = _pods(spec, [PodState.STARTING] * 2)
    assert plan(spec, starting, count(starting, spec, 0.0), demand=2, now=0.0).create == 0
    busy = _pods(spec, [PodState.RUNNING] * 4)
    assert plan(spec, busy, count(busy, spec, 0.0), demand=3, now=0.0).create == 1


def test_the_floor_is_kept_at_zero_demand() -> None:
    spec = PoolSpec(name="p", min_count=3, max_count=5, step=8)
    p = plan(spec, [], count([], spec, 0.0), demand=0, now=0.0)
    assert p.create == 3 and "floor" in p.reason


def test_expired_holds_retire_and_live_holds_stay() -> None:
    spec = PoolSpec(name="p", max_count=5)
    pods = _pods(spec, [PodState.IDLE] * 2, used=True, caller="alice", key=("alice", "default", ""))
    pods[0].hold_until, pods[1].hold_until = 10.0, 100.0
    p = plan(spec, pods, count(pods, spec, 50.0), demand=0, now=50.0)
    assert p.retire == ("p0",)


def test_unused_idle_pods_past_keep_alive_retire_beyond_the_idle_cap_and_floor() -> None:
    spec = PoolSpec(name="p", min_count=1, max_idle_count=2, max_count=8, idle_timeout=30.0)
    pods = _pods(spec, [PodState.IDLE] * 5, idle_since=0.0)
    assert plan(spec, pods, count(pods, spec, 10.0), demand=0, now=10.0).retire == ()
    assert len(plan(spec, pods, count(pods, spec, 40.0), demand=0, now=40.0).retire) == 3
    capless = PoolSpec(name="p", min_count=0, max_idle_count=0, max_count=8, idle_timeout=30.0)
    assert len(plan(capless, pods, count(pods, capless, 40.0), demand=0, now=40.0).retire) == 5


async def test_keep_alive_expiry_retires_a_warm_pod_on_the_virtual_clock() -> None:
    h = await Harness([cpu_pool(min_count=0, max_idle_count=0, idle_timeout=20.0)], start_delay=2.0).start()
    try:
        job = await h.submit(single_use=False)
        await h.cp.cancel("alice", job.id)  # the pod it triggered starts and is never used
        await h.run_for(5.0)
        fresh = [p for p in h.cp.tracker.snapshot() if not p.used]
        assert len(fresh) == 1
        await h.run_for(14.0)  # ready at t=2: its 20 s keep-alive has 3 s left
        assert fresh[0].name not in h.backend.deleted
        await h.run_for(4.0)
        assert fresh[0].name in h.backend.deleted
    finally:
        await h.stop()


async def test_more_wanted_wakes_the_controller_at_once_and_less_only_nudges_it() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        calls: list[str] = []
        c = h.cp.controller
        c.wake, c.nudge = (lambda: calls.append("wake")), (lambda: calls.append("nudge"))  # type: ignore[method-assign]
        c.report_demand({"cpu": 4}, {}, {"cpu": {"alice": 4}})
        c.report_demand({"cpu": 3}, {}, {"cpu": {"alice": 3}})  # a fan-out draining: every pass, less
        c.report_demand({"cpu": 3}, {}, {"cpu": {"alice": 2, "bob": 1}})  # a new caller waits: hold breaks due
        c.report_demand({"cpu": 3}, {}, {"cpu": {"alice": 2, "bob": 1}}, over_quota={"cpu": {"bob": 1}})
        c.report_demand({"cpu": 3}, {}, {"cpu": {"alice": 2, "bob": 1}})  # bob's quota frees room
        c.report_demand({"cpu": 3}, {}, {"cpu": {"alice": 2, "bob": 1}})  # nothing changed
        c.report_demand({"cpu": 3}, {"job-1": ("cpu", 1)}, {"cpu": {"alice": 2, "bob": 1}})  # a single-use job
        assert calls == ["wake", "nudge", "wake", "nudge", "wake", "wake"]
    finally:
        await h.stop()
