"""Warmth on the virtual clock: owner holds expire and are broken at the ceiling, a template rollout drains
under saturated load, borrowed capacity goes back to its owner one GPU per GPU."""

from __future__ import annotations

import dataclasses

from broker.jobs import Job, JobState
from broker.pods import PodState
from broker.pools import Catalog
from broker.ports.capacity import StaticCapacitySource
from tests.unit.harness import Harness, cpu_pool, gpu_pool


async def test_an_owner_hold_expires_and_the_used_pod_retires() -> None:
    h = Harness([cpu_pool(caller_hold_seconds=30.0, idle_timeout=300.0, max_idle_count=4)])
    h.cp.controller.tick = h.cp.controller._loop.tick = 300.0  # the expiry itself must wake the loop
    await h.start()
    try:
        job = await h.run_job("alice")
        pod = job.acquisition[0].pod
        assert h.cp.tracker.pods[pod].held(h.clock.now())
        await h.run_for(27.0)
        assert pod not in h.backend.deleted
        await h.run_for(4.0)
        assert pod in h.backend.deleted  # the idle cap keeps unused pods, never another caller's used one
    finally:
        await h.stop()


async def test_holds_break_at_the_ceiling_after_tenure_oldest_first_sparing_owners_with_queued_jobs() -> None:
    h = await Harness([cpu_pool(max_count=3, caller_hold_seconds=600.0, idle_timeout=600.0)]).start()
    try:
        first = [await h.submit("alice", command=("sleep", "1")), await h.submit("alice", command=("sleep", "1"))]
        await h.run_for(0.5)
        bob = await h.submit("bob", command=("sleep", "1"))
        for j in [*first, bob]:
            await h.finish(j)
        alice_pods = {(h.store.get(j.id) or j).acquisition[0].pod for j in first}
        bob_pod = (h.store.get(bob.id) or bob).acquisition[0].pod
        await h.run_for(5.0)
        gang = await h.submit("alice", pods=3, command=("sleep", "30"))  # 2 own held pods + 1 more
        await h.run_for(0.1)  # carol queues behind alice's gang
        carol = await h.submit("carol", command=("sleep", "1"))
        await h.run_for(50.0)  # t≈57: every pod is younger than the 60 s tenure
        assert not h.backend.deleted
        assert h.cp.pools_view()[0]["held"] == 3 and h.cp.pools_view()[0]["queued_demand"] == 4
        await h.run_for(5.0)
        assert h.backend.deleted == [bob_pod]  # alice is spared: her jobs are queued
        gang_done = await h.finish(gang)
        assert gang_done.state is JobState.SUCCEEDED
        assert alice_pods <= {a.pod for a in gang_done.acquisition}
        carol_done = await h.finish(carol)
        assert carol_done.state is JobState.SUCCEEDED
        # carol got a new pod; the broken holds retired, none was handed to her
        carol_pod = carol_done.acquisition[0].pod
        assert carol_pod not in alice_pods | {bob_pod} and carol_done.acquisition[0].path == "new"
        assert len(h.backend.deleted) == 2 and h.backend.deleted[1] in alice_pods  # oldest of alice's pods
        assert h.cp.controller.holds_broken["cpu"] == 2
    finally:
        await h.stop()


async def test_rollout_under_saturated_load_drains_within_budget_and_ceiling_with_no_failed_job() -> None:
    spec = cpu_pool(min_count=2, max_count=4, max_idle_count=4, caller_hold_seconds=60.0, drain_budget=1)
    h = await Harness([spec], start_delay=3.0).start()
    callers = [f"c{i}" for i in range(6)]
    current: dict[str, Job] = {}
    done: list[Job] = []
    peak_physical = 0
    peak_draining = 0

    async def drive(seconds: float) -> None:
        nonlocal peak_physical, peak_draining
        end = h.clock.now() + seconds
        while h.clock.now() < end:
            for c in callers:
                job = current.get(c)
                row = h.store.get(job.id) if job else None
                if row is None or row.terminal:
                    if row is not None:
                        done.append(row)
                    current[c] = await h.submit(c, command=("sleep", "2"))
            await h.run_for(0.05)
            pods = [p for p in h.cp.tracker.snapshot() if p.state is not PodState.GONE]
            new = h.cp.controller.pools["cpu"].template_hash
            peak_physical = max(peak_physical, len(pods))
            peak_draining = max(peak_draining, sum(1 for p in pods if p.template != new and (
                p.state is PodState.RETIRING or p.retire)))

    try:
        await drive(30.0)
        before = {p.name for p in h.cp.tracker.snapshot()}
        assert len(before) == 4
        rolled = dataclasses.replace(spec, template={"image": "base:v2"})
        h.cp.reload_catalog(Catalog(pools={"cpu": rolled}))
        assert h.cp.pools_view()[0]["stale"] == 4
        for _ in range(60):
            await drive(5.0)
            if not any(p.name in before for p in h.cp.tracker.snapshot()):
                break
        assert not any(p.name in before for p in h.cp.tracker.snapshot()), "rollout did not converge"
        await drive(20.0)  # the longest waiters got the replacements; let their jobs finish
        assert h.cp.pools_view()[0]["stale"] == 0
        assert peak_physical <= 4 and peak_draining <= 1
        assert done and all(j.state is JobState.SUCCEEDED for j in done)
        assert {j.caller for j in done} == set(callers)  # every caller was served
        # No overtaking: of the jobs that waited for a pod other than their own, none submitted later was
        # placed before one submitted earlier (the longest waiter goes first).
        waited = [j for j in done if j.acquisition[0].reason is not None]
        assert len(waited) > 4
        overtakes = [(a.id, b.id) for a in waited for b in waited
                     if a.timings["submitted_at"] < b.timings["submitted_at"]
                     and a.timings["claimed_at"] > b.timings["claimed_at"]]
        assert overtakes == []
    finally:
        await h.stop()


async def test_borrowed_pods_fill_the_published_ceiling_and_go_back_one_gpu_per_owner_gpu() -> None:
    capacity = StaticCapacitySource({"fake-gpu": 2})
    pool = gpu_pool(max_count=4, step=4, borrow=True, caller_hold_seconds=600.0, idle_timeout=600.0)
    h = await Harness([pool], gpus=4, budgets={"fake-gpu": 1}, capacity=capacity).start()
    try:
        jobs = [await h.submit(c, pool="gpu", command=("sleep", "5")) for c in ("a", "b")]
        await h.run_for(1.0)
        jobs += [await h.submit(c, pool="gpu", command=("sleep", "5")) for c in ("c", "d")]
        await h.run_for(7.0)
        view = h.cp.pools_view()[0]
        assert view["physical"] == 3 and view["borrowed"] == 2 and view["queued_demand"] == 1
        assert h.cp.controller.ledger.used("fake-gpu") == 1.0
        borrowed = sorted((p for p in h.cp.tracker.snapshot() if h.cp.controller.borrowing.ledger.holds(p.name)),
                          key=lambda p: p.created_at)
        capacity.set("fake-gpu", 1)  # the owner reclaims one GPU
        h.cp.controller.borrowing.refresh()
        h.cp.controller.reconcile_once()
        await h.run_for(1.0)
        assert h.cp.controller.borrowing.released == {"fake-gpu": 1.0}
        assert borrowed[-1].name in h.backend.deleted and borrowed[0].name not in h.backend.deleted
        assert h.cp.pools_view()[0]["borrowed"] == 1
        capacity.set("fake-gpu", 0)
        await h.run_for(11.0)  # the next poll sees it
        assert h.cp.controller.borrowing.released == {"fake-gpu": 2.0}
        assert h.cp.pools_view()[0]["borrowed"] == 0
        # d waits on the spent budget until an excess hold (a's, past its 60 s tenure) is broken for it
        last = await h.finish(jobs[3], timeout=120.0)
        assert last.state is JobState.SUCCEEDED and h.clock.now() >= 60.0
        for j in jobs:
            assert (await h.finish(j)).state is JobState.SUCCEEDED
        assert h.cp.controller.borrowing.ledger.peak["fake-gpu"] <= 2.0
        assert h.cp.controller.ledger.peak["fake-gpu"] <= 1.0
    finally:
        await h.stop()


async def test_the_30_s_reconcile_loop_wakes_at_once_for_queue_growth_and_at_a_create_backoff() -> None:
    h = Harness([cpu_pool()])
    h.cp.controller.tick = h.cp.controller._loop.tick = 30.0  # the production default
    await h.start()
    try:
        await h.run_for(40.0)
        assert h.backend.created == []
        h.backend.fail_creates = 1
        job = await h.submit("alice")
        await h.run_for(0.2)
        assert len(h.backend.created) == 1 and not h.cp.tracker.pods  # woken at once; the create failed
        await h.run_for(2.5)  # the 2 s backoff, not the 30 s tick, brings the retry
        assert len(h.backend.created) == 2
        assert (await h.finish(job)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_hold_broken_for_one_blocked_job_is_not_followed_by_another_while_its_pod_is_deleted() -> None:
    h = Harness([cpu_pool(max_count=2, caller_hold_seconds=600.0, idle_timeout=600.0)])
    slow_delete = h.backend.delete

    async def delete(name: str) -> None:
        await h.clock.sleep(10.0)  # a Kubernetes pod takes a while to go
        await slow_delete(name)

    h.backend.delete = delete  # type: ignore[method-assign]
    await h.start()
    try:
        await h.finish(await h.submit("alice"))
        await h.finish(await h.submit("bob"))
        await h.run_for(60.0)
        carol = await h.submit("carol")
        await h.run_for(5.0)
        assert h.cp.controller.holds_broken == {"cpu": 1}
        assert sum(1 for p in h.cp.tracker.snapshot() if p.state.value == "retiring") == 1
        assert (await h.finish(carol)).state is JobState.SUCCEEDED
        assert h.cp.controller.holds_broken == {"cpu": 1}
    finally:
        await h.stop()


async def test_single_use_pods_wait_for_budget_headroom() -> None:
    h = await Harness([gpu_pool(max_count=2)], gpus=2, budgets={"fake-gpu": 1}).start()
    try:
        first = await h.submit("alice", pool="gpu", single_use=True, command=("sleep", "5"))
        second = await h.submit("bob", pool="gpu", single_use=True, command=("sleep", "5"))
        await h.run_for(2.0)
        assert len(h.backend.created) == 1 and h.cp.controller.ledger.peak["fake-gpu"] == 1.0
        assert (await h.finish(first)).state is JobState.SUCCEEDED
        assert (await h.finish(second)).state is JobState.SUCCEEDED
        assert h.cp.controller.ledger.peak["fake-gpu"] == 1.0
    finally:
        await h.stop()
