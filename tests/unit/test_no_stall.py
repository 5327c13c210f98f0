"""No stall (issue 10): a queued job is never blocked by pods that no queued job can use.

The two queue stalls found from outside, each pinned on the virtual clock, then a property over random
workloads: after every dispatch pass and reconcile, a pool with a queued job that is below its ceiling,
or that keeps idle pods no queued job can use, has capacity moving; and every workload drains.
"""

from __future__ import annotations

import os
import random

from broker.claiming.tracker import REASON_QUOTA, REASON_SESSION_RESETTING
from broker.jobs import Job, JobSpec, JobState
from broker.pods import Origin, Pod, PodState
from broker.pools import CallerLimits
from tests.unit.harness import Harness, cpu_pool


async def test_a_single_use_job_breaks_its_owners_holds_at_the_ceiling() -> None:
    """Finding 1: every pod idle, held for the owner whose single-use job is queued (it cannot use them)."""
    h = await Harness([cpu_pool(max_count=2, caller_hold_seconds=600.0, idle_timeout=600.0)]).start()
    try:
        first = [await h.submit("alice", lease_tag=f"s{i}") for i in range(2)]
        for job in first:
            await h.finish(job)
        await h.run_for(61.0)  # past the hold tenure: the holds may be broken
        assert sum(1 for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE) == 2
        single = await h.submit("alice", single_use=True)
        done = await h.finish(single, timeout=10.0)
        assert done.state is JobState.SUCCEEDED and h.paths(done) == ["new"]
        assert h.cp.controller.holds_broken == {"cpu": 1}  # one hold for one pod, not both
    finally:
        await h.stop()


async def test_a_single_use_job_breaks_its_owners_hold_while_other_pods_run_long_jobs() -> None:
    """The only idle pod is the owner's own held pod: it is supply to break, not to wait out."""
    h = await Harness([cpu_pool(max_count=3, caller_hold_seconds=600.0, idle_timeout=600.0)]).start()
    try:
        await h.finish(await h.submit("alice", lease_tag="a"))
        bob = [await h.submit("bob", lease_tag=f"b{i}", command=("sleep", "300")) for i in range(2)]
        await h.run_for(61.0)
        single = await h.submit("alice", single_use=True)
        done = await h.finish(single, timeout=10.0)
        assert done.state is JobState.SUCCEEDED
        await h.until(lambda: all((h.store.get(j.id) or j).state is JobState.SUCCEEDED for j in bob), 400.0, step=1.0)
    finally:
        await h.stop()


async def test_a_single_use_job_retires_an_unused_idle_pod_at_a_static_ceiling() -> None:
    """Floor = ceiling: the never-used floor pods are warm for everyone but a single-use job."""
    h = await Harness([cpu_pool(min_count=2, max_count=2, idle_timeout=None)]).start()
    try:
        await h.run_for(1.0)
        assert sum(1 for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE) == 2
        done = await h.finish(await h.submit("alice", single_use=True), timeout=10.0)
        assert done.state is JobState.SUCCEEDED
        await h.run_for(1.0)  # the floor comes back once the single-use pod is gone
        assert sum(1 for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE) == 2
    finally:
        await h.stop()


async def test_an_owners_jobs_waiting_on_its_quota_do_not_spare_its_holds() -> None:
    """A job over its caller's quota cannot take the caller's held pod; another caller blocked at the
    ceiling breaks that hold instead of waiting for the quota to free."""
    h = Harness([cpu_pool(max_count=2, caller_hold_seconds=600.0, idle_timeout=600.0)],
                limits={"alice": CallerLimits(max_pods=1)})
    await h.start()
    try:
        await h.finish(await h.submit("alice", lease_tag="a"))
        long = await h.submit("alice", lease_tag="b", recycle=False, command=("sleep", "600"))  # a new pod: 2 of 2
        await h.run_for(61.0)
        assert (h.store.get(long.id) or long).state is JobState.RUNNING
        over = await h.submit("alice", lease_tag="c")
        await h.run_for(0.5)
        assert h.cp.dispatcher.waiting_reason[over.id] == REASON_QUOTA
        carol = await h.finish(await h.submit("carol"), timeout=10.0)
        assert carol.state is JobState.SUCCEEDED and h.cp.controller.holds_broken == {"cpu": 1}
    finally:
        await h.stop()


async def test_a_single_use_job_cancelled_while_its_pod_starts_leaves_no_orphan() -> None:
    """Finding 2: submit single-use, cancel 20 ms later; the pod made for it retires at once, and normal
    jobs behind it run (max_count 2, idle_timeout 15)."""
    h = await Harness([cpu_pool(max_count=2, max_idle_count=2, idle_timeout=15.0, caller_hold_seconds=15.0)],
                      start_delay=2.0).start()
    try:
        for _ in range(2):
            single = await h.submit("alice", single_use=True)
            await h.run_for(0.02)
            assert (await h.cp.cancel("alice", single.id)).state is JobState.CANCELLED
        await h.run_for(3.0)  # both pods were made for the cancelled jobs; they never ran anything
        orphans = [p for p in h.cp.tracker.snapshot() if p.origin is Origin.SINGLE_USE]
        assert orphans == [] and len(h.backend.deleted) == 2
        normal = await h.finish(await h.submit("alice"), timeout=10.0)
        assert normal.state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_single_use_gang_whose_create_failed_gets_the_missing_pod_only() -> None:
    """What a single-use job still needs is derived from the pods made for it: a failed create is made
    again, once, and no pod is left over for a job that is gone."""
    h = await Harness([cpu_pool(max_count=4)], start_delay=1.0).start()
    try:
        h.backend.fail_creates = 1
        gang = await h.run_job("alice", single_use=True, pods=2)
        assert gang.state is JobState.SUCCEEDED and len(h.backend.created) == 3
        await h.run_for(0.5)
        assert [p for p in h.cp.tracker.snapshot() if p.origin is Origin.SINGLE_USE] == []
    finally:
        await h.stop()


async def test_a_single_use_gangs_ready_pod_retires_when_the_gang_is_cancelled_before_its_claim() -> None:
    """A pod made for a single-use job that left the queue retires at once, idle or still starting."""
    h = await Harness([cpu_pool(max_count=2)], start_delay=1.0).start()
    try:
        h.backend.fail_creates = 1
        gang = await h.submit("alice", single_use=True, pods=2)
        await h.run_for(1.5)  # one pod is ready and waits for the other, whose create failed (2 s backoff)
        made = [p for p in h.cp.tracker.snapshot() if p.reserved_for == gang.id]
        assert [p.state for p in made] == [PodState.IDLE]
        await h.cp.cancel("alice", gang.id)
        await h.spin()
        assert made[0].state in (PodState.RETIRING, PodState.GONE) and made[0].name in h.backend.deleted
        await h.run_for(5.0)
        assert [p for p in h.cp.tracker.snapshot() if p.origin is Origin.SINGLE_USE] == []
        assert (await h.finish(await h.submit("alice"), timeout=5.0)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_cancelled_single_use_jobs_pod_is_deleted_at_once_without_a_reset() -> None:
    h = await Harness([cpu_pool(max_count=1)]).start()
    try:
        job = await h.submit("alice", single_use=True, command=("sleep", "30"))
        await h.run_for(0.5)
        pod = (h.store.get(job.id) or job).pods[0]
        agent = h.backend.agents[pod]
        await h.cp.cancel("alice", job.id)
        await h.spin()
        assert (h.store.get(job.id) or job).state is JobState.CANCELLED
        assert pod in h.backend.deleted and agent.resets == []  # deleting it is the proof
    finally:
        await h.stop()


async def test_a_failed_single_use_jobs_pod_retires_at_once() -> None:
    h = await Harness([cpu_pool(max_count=1)]).start()
    try:
        failed = await h.run_job("alice", single_use=True, command=("exit", "3"))
        assert failed.state is JobState.FAILED
        await h.spin()
        assert failed.pods[0] in h.backend.deleted
        assert (await h.finish(await h.submit("alice"), timeout=5.0)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


# ---------------------------------------------------------------- the property, over random workloads

CALLERS = ("alice", "bob", "carol")


def can_use(job: Job, pod: Pod) -> bool:
    """Whether a queued job could ever run on this idle or starting pod, as the reuse rules say (generous:
    a gang may use a pod as part of its set, a caller any of its own sessions' pods)."""
    if pod.origin is Origin.SINGLE_USE:
        return pod.reserved_for == job.id
    if job.spec.single_use:
        return False
    if pod.state is PodState.IDLE and pod.used:
        return pod.caller == job.caller
    return True


def stalled_pools(h: Harness) -> list[str]:
    """Pools where a job is queued, and the pool is below its ceiling or keeps an idle pod no queued job
    can use, yet nothing moves: no pod starts that a queued job can use, no pod retires."""
    queued = list(h.cp.dispatcher.queued.values())
    # A job waiting on its session's resetting pod or on its caller's quota waits for its own pods.
    needy = [j for j in queued
             if h.cp.dispatcher.waiting_reason.get(j.id) not in (REASON_SESSION_RESETTING, REASON_QUOTA)]
    out = []
    for name, spec in h.catalog.pools.items():
        jobs = [j for j in needy if j.spec.pool == name]
        pods = [p for p in h.cp.tracker.snapshot() if p.pool == name and p.state is not PodState.GONE]
        if not jobs:
            continue
        room = spec.max_count - sum(1 for p in pods if not p.standby)
        useless = [p for p in pods if p.state is PodState.IDLE
                   and not any(can_use(j, p) for j in queued if j.spec.pool == name)]
        # A single-use job's pods are made as a whole set (a part would hold room no other job can use), so idle
        # pods nobody can use must give way only when that lets some job's pods fit (broker.warmth.holds).
        needs = [j.spec.pods - sum(1 for p in pods if p.origin is Origin.SINGLE_USE and p.reserved_for == j.id)
                 if j.spec.single_use else 1 for j in jobs]
        if not any(room >= n for n in needs) and not any(room + len(useless) >= n for n in needs):
            continue
        moving = any(p.state is PodState.RETIRING for p in pods) or any(
            p.state is PodState.STARTING and any(can_use(j, p) for j in jobs) for p in pods)
        if not moving:
            out.append(f"{name}: queued {[(j.caller, j.spec.pods, j.spec.single_use) for j in jobs]}, "
                       f"pods {[(p.state.value, p.caller, p.origin.value, p.reserved_for) for p in pods]}, "
                       f"plan {h.cp.controller.last_plan.get(name)}")
    return out


async def step(h: Harness, seconds: float) -> None:
    """Event-driven time: jump from timer to timer, letting every task run at each."""
    end = h.clock.now() + seconds
    while True:
        await h.spin()
        due = h.clock.next_deadline()
        if due is None or due > end:
            break
        h.clock.advance_to(due)
    h.clock.advance_to(end)
    await h.spin()


async def check_one_reconcile(h: Harness, seed: int) -> None:
    """One dispatch pass, one reconcile: a stalled pool is a failure."""
    h.cp.dispatcher.dispatch_once()
    await h.spin()
    h.cp.controller.reconcile_once()
    stalled = stalled_pools(h)
    assert not stalled, f"seed {seed}, t={h.clock.now() - T0:.2f}: capacity did not move: {stalled}"
    await h.spin()


T0 = 1_800_000_000.0


async def run_workload(seed: int, strict: bool = True) -> None:
    """One random workload; `strict` breaks holds with no tenure and checks every reconcile, otherwise the
    default tenure applies and only the drain is checked."""
    rng = random.Random(seed)
    ceiling = rng.randint(1, 4)
    pool = cpu_pool(max_count=ceiling, min_count=rng.choice([0, 0, 1, ceiling]),
                    max_idle_count=rng.randint(0, 3), idle_timeout=rng.choice([3.0, 15.0, 60.0, None]),
                    caller_hold_seconds=rng.choice([2.0, 15.0, 90.0]), step=rng.randint(1, 4),
                    reserve_gangs_after=rng.choice([None, 5.0]), reuse_tag=rng.choice(["boundary", "hint"]))
    quota = rng.randint(1, ceiling) if rng.random() < 0.3 else ceiling
    limits = {"alice": CallerLimits(max_pods=quota)} if quota < ceiling else {}
    h = Harness([pool], start_delay=rng.choice([0.0, 0.5, 3.0]), limits=limits)
    if strict:
        h.cp.controller.hold_tenure = 0.0  # any hold nobody queued can use is breakable now

    async def check() -> None:
        if strict:
            await check_one_reconcile(h, seed)
    h.cp.controller.tick = h.cp.controller._loop.tick = 30.0  # production's: events and expiries must wake it
    await h.start()
    jobs: list[Job] = []
    try:
        for _ in range(rng.randint(10, 30)):
            kind = rng.random()
            caller = rng.choice(CALLERS)
            most = quota if caller == "alice" else ceiling  # larger jobs of a caller over quota never run
            duration = str(rng.choice([0.5, 2.0, 10.0, 30.0]))
            if kind < 0.3:
                jobs.append(await h.submit(caller, lease_tag=rng.choice(["", "a", "b"]),
                                           recycle=rng.random() < 0.7, command=("sleep", duration)))
            elif kind < 0.45:  # a batch (POST /v1/jobs:batch) of like and unlike jobs
                batch = [JobSpec(pool="cpu", command=("sleep", str(rng.choice([0.5, 2.0, 10.0]))),
                                 lease_tag=rng.choice(["", "a", "b"]), recycle=rng.random() < 0.7,
                                 single_use=rng.random() < 0.2) for _ in range(rng.randint(2, 8))]
                jobs += [job for job, _ in await h.cp.submit_many(caller, batch)]
            elif kind < 0.75:
                pods = rng.randint(1, min(2, most))
                jobs.append(await h.submit(caller, single_use=True, pods=pods, command=("sleep", duration)))
            elif kind < 0.85 and most > 1:
                jobs.append(await h.submit(caller, pods=rng.randint(2, most), command=("sleep", duration)))
            elif jobs:
                victim = rng.choice(jobs)
                await step(h, rng.choice([0.0, 0.02, 0.5]))
                await h.cp.cancel(victim.caller, victim.id)
            await check()
            await step(h, rng.choice([0.02, 0.5, 3.0, 15.0]))
            await check()
        # Submissions stop: everything drains, checking the property as time goes.
        for _ in range(400):
            if all((h.store.get(j.id) or j).terminal for j in jobs):
                break
            await step(h, 5.0)
            await check()
        final = [h.store.get(j.id) or j for j in jobs]
        assert all(j.terminal for j in final), f"seed {seed}: did not drain: {[j.state for j in final]}"
        assert {j.state for j in final} <= {JobState.SUCCEEDED, JobState.CANCELLED}, f"seed {seed}"
        await step(h, 200.0)  # every hold and keep-alive has run out
        left = [p for p in h.cp.tracker.snapshot() if p.origin is Origin.SINGLE_USE or p.reserved_for is not None]
        assert left == [], f"seed {seed}: pods kept for jobs that are gone: {left}"
    finally:
        await h.stop()


SEEDS = int(os.environ.get("FIREPOOL_STALL_SEEDS", "15"))
"""Workloads per run: 15 keep the unit suite fast; set more for a long search (500 pass)."""


async def test_capacity_moves_within_one_reconcile_and_every_workload_drains() -> None:
    for seed in range(SEEDS):
        await run_workload(seed)


async def test_every_workload_drains_with_the_default_hold_tenure() -> None:
    for seed in range(1000, 1000 + SEEDS // 3):
        await run_workload(seed, strict=False)
