"""No starving gangs: reservations after a pool's wait, in a total order, and backfill that cannot delay them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pytest

from broker.claiming.reserving import REASON_BACKFILL, Reservation, estimate
from broker.claiming.tracker import Claim, Lease, Shortfall, Tracker
from broker.jobs import Job, JobState
from broker.pods import Pod, PodState
from broker.pools import CatalogError, PoolSpec, parse_pool
from tests.unit.harness import Harness, cpu_pool, gpu_pool

JOB_S = 2.0
START_DELAY = 1.0


@dataclass
class StreamRun:
    gang: Job
    submitted_at: float
    started_at: float | None = None
    held_before_reservation: set[str] = field(default_factory=set)
    small_jobs_started: int = 0


async def _gang_behind_a_stream(h: Harness, *, horizon: float, reserve_after: float | None) -> StreamRun:
    """Eight back-to-back 1-pod job loops of alice keep the 8-slot pool busy; bob's 8-pod gang arrives at t=1."""
    workers: dict[int, Job | None] = dict.fromkeys(range(8))
    run: StreamRun | None = None
    started: set[str] = set()
    t0 = h.clock.now()
    end = t0 + horizon
    while h.clock.now() < end:
        for w, job in workers.items():
            if job is None or (h.store.get(job.id) or job).terminal:
                workers[w] = await h.submit("alice", lease_tag=f"loop{w}", command=("sleep", str(JOB_S)))
        for job in workers.values():
            live = h.store.get(job.id) if job else None
            if live is not None and live.state is not JobState.QUEUED:
                started.add(live.id)
        if run is None and h.clock.now() >= t0 + 1.0:
            run = StreamRun(await h.submit("bob", lease_tag="gang", pods=8, command=("sleep", "1")), h.clock.now())
        if run is not None and run.started_at is None:
            gang = h.store.get(run.gang.id)
            assert gang is not None
            if gang.state is not JobState.QUEUED:
                run.started_at = h.clock.now()
            elif reserve_after is None or h.clock.now() < run.submitted_at + reserve_after:
                # Without a reservation the gang holds nothing: no lease, no pod set aside.
                run.held_before_reservation |= {p.name for p in h.cp.tracker.pods_of(run.gang.id)}
                run.held_before_reservation |= {p.name for p in h.cp.tracker.snapshot()
                                                if p.reserved_for == run.gang.id}
        await h.run_for(0.05)
    assert run is not None
    run.small_jobs_started = len(started)
    return run


def _pool(reserve_after: float | None) -> PoolSpec:
    return cpu_pool(max_count=8, max_idle_count=8, step=8, caller_hold_seconds=60.0,
                    reserve_gangs_after=reserve_after)


async def test_without_reservations_a_gang_starves_behind_a_stream_and_holds_nothing() -> None:
    h = await Harness([_pool(None)], start_delay=START_DELAY).start()
    try:
        run = await _gang_behind_a_stream(h, horizon=60.0, reserve_after=None)
        assert run.started_at is None  # the stream reuses its warm pods forever
        assert run.held_before_reservation == set()
        assert run.small_jobs_started > 100
    finally:
        await h.stop()


async def test_a_reserved_gang_starts_within_a_bounded_time_behind_a_stream() -> None:
    reserve_after = 5.0
    h = await Harness([_pool(reserve_after)], start_delay=START_DELAY).start()
    try:
        run = await _gang_behind_a_stream(h, horizon=30.0, reserve_after=reserve_after)
        assert run.held_before_reservation == set()
        assert run.started_at is not None
        waited = run.started_at - run.submitted_at
        # The reservation is made on the first dispatch pass after `reserve_after` (passes run on events,
        # at the latest every tick); from then on every busy pod frees within one job and is replaced
        # within one pod start; half a second covers resets and the passes in between.
        bound = reserve_after + h.cp.dispatcher.tick + JOB_S + START_DELAY + 0.5
        print(f"\n8-pod gang behind 8 loops of {JOB_S:.0f} s jobs: waited {waited:.2f} s (bound {bound:.1f} s)")
        assert waited <= bound
        gang = await h.finish(run.gang)
        assert gang.state is JobState.SUCCEEDED and len(set(gang.pods)) == 8
        assert not h.cp.tracker.reservations("cpu")
    finally:
        await h.stop()


async def test_backfill_runs_only_jobs_that_end_before_the_gang_could_fill() -> None:
    h = await Harness([cpu_pool(max_count=4, step=4, caller_hold_seconds=5.0, reserve_gangs_after=0.0)], start_delay=START_DELAY).start()
    try:
        t0 = h.clock.now()
        blocker = await h.submit("alice", command=("sleep", "40"), timeout_s=50.0)
        await h.run_for(2.0)
        gang = await h.submit("bob", pods=4, command=("sleep", "1"))
        await h.run_for(3.0)  # three pods start and are reserved for the gang; alice's pod is the fourth
        [(res, held)] = h.cp.tracker.reservations("cpu")
        assert (res.job_id, held) == (gang.id, 3)
        assert math.isfinite(res.fill_at) and res.fill_at >= t0 + 40.0  # alice's timeout, then a replacement
        short = await h.submit("carol", command=("sleep", "5"), timeout_s=10.0)
        too_long = await h.submit("dave", command=("sleep", "5"), timeout_s=100.0)
        unbounded = await h.submit("erin", command=("sleep", "5"))
        await h.run_for(1.0)
        assert (h.store.get(short.id) or short).state is JobState.RUNNING
        assert [a.reason for a in (h.store.get(short.id) or short).acquisition] == [REASON_BACKFILL]
        for job in (too_long, unbounded):
            assert (h.store.get(job.id) or job).state is JobState.QUEUED
        done_short = await h.finish(short)
        assert done_short.state is JobState.SUCCEEDED
        done_gang = await h.finish(gang, timeout=80.0)
        gang_started = done_gang.timings["committed_at"]
        done_blocker = await h.finish(blocker)
        assert gang_started <= done_blocker.timings["finished_at"] + START_DELAY + 1.0
        for job in (too_long, unbounded):
            assert (await h.finish(job)).timings["committed_at"] > gang_started
        # carol's backfilled pod retired at release: it never went back to the gang as carol's pod.
        assert done_short.pods[0] not in done_gang.pods
    finally:
        await h.stop()


def _tracker(max_count: int = 8) -> Tracker:
    return Tracker({"p": PoolSpec(name="p", max_count=max_count)})


def _idle(t: Tracker, name: str) -> Pod:
    pod = Pod(name, "p", state=PodState.IDLE)
    t.add(pod)
    return pod


def test_reservations_fill_in_priority_then_submit_order_and_never_split_pods() -> None:
    t = _tracker()
    t.reserve_gang(Reservation("late", "bob", "p", 3, (0, 2.0, "late"), 0.0))
    t.reserve_gang(Reservation("early", "carol", "p", 2, (0, 1.0, "early"), 0.0))
    t.reserve_gang(Reservation("urgent", "dave", "p", 2, (-5, 9.0, "urgent"), 0.0))
    for i in range(5):
        _idle(t, f"p{i}")
    held = {r.job_id: n for r, n in t.reservations("p")}
    assert held == {"urgent": 2, "early": 2, "late": 1}
    assert [r.job_id for r, _ in t.reservations("p")] == ["urgent", "early", "late"]
    # A pod of no reservation's asking stays claimable by anyone only when every gang is full.
    assert isinstance(t.claim(Claim("x", "erin", "p"), 0.0), Shortfall)
    lease = t.claim(Claim("urgent", "dave", "p", pods=2), 0.0)
    assert isinstance(lease, Lease) and [p.reserved_for for p in lease.pods] == [None, None]
    assert [r.job_id for r, _ in t.reservations("p")] == ["early", "late"]


def test_a_dropped_reservation_hands_its_pods_to_the_next_gang() -> None:
    t = _tracker()
    t.reserve_gang(Reservation("first", "bob", "p", 2, (0, 1.0, "first"), 0.0))
    t.reserve_gang(Reservation("second", "carol", "p", 2, (0, 2.0, "second"), 0.0))
    _idle(t, "a")
    _idle(t, "b")
    assert {r.job_id: n for r, n in t.reservations("p")} == {"first": 2, "second": 0}
    t.drop_reservation("first", "p")
    assert {r.job_id: n for r, n in t.reservations("p")} == {"second": 2}
    assert isinstance(t.claim(Claim("second", "carol", "p", pods=2), 0.0), Lease)
    assert t.reservations("p") == []


def test_a_reservation_takes_the_idle_pods_there_are_when_it_is_made() -> None:
    t = _tracker()
    for name in "abc":
        _idle(t, name)
    t.reserve_gang(Reservation("g", "bob", "p", 4, (0, 1.0, "g"), 0.0))
    assert t.reservations("p")[0][1] == 3
    assert isinstance(t.claim(Claim("other", "alice", "p"), 0.0), Shortfall)
    _idle(t, "d")
    assert isinstance(t.claim(Claim("g", "bob", "p", pods=4), 0.0), Lease)


def test_the_reservation_wait_is_a_checked_pool_setting() -> None:
    assert parse_pool({"name": "p"}).reserve_gangs_after == 60.0
    assert parse_pool({"name": "p", "reserve_gangs_after": None}).reserve_gangs_after is None
    assert parse_pool({"name": "p", "reserve_gangs_after": 2.5}).reserve_gangs_after == 2.5
    for bad in ("soon", -1, True):
        with pytest.raises(CatalogError, match="reserve_gangs_after"):
            parse_pool({"name": "p", "reserve_gangs_after": bad})


def test_a_job_ahead_of_a_reserved_gang_may_take_its_pod_and_one_behind_may_not() -> None:
    t = _tracker()
    t.reserve_gang(Reservation("g", "bob", "p", 4, (0, 5.0, "g"), 0.0))
    _idle(t, "a")
    _idle(t, "b")
    behind = t.claim(Claim("later", "alice", "p", order=(0, 6.0, "later")), 0.0)
    assert isinstance(behind, Shortfall)
    urgent = t.claim(Claim("urgent", "alice", "p", order=(-1, 9.0, "urgent")), 0.0)
    earlier = t.claim(Claim("earlier", "carol", "p", order=(0, 4.0, "earlier")), 0.0)
    assert isinstance(urgent, Lease) and isinstance(earlier, Lease)
    assert t.reservations("p")[0][1] == 0


async def test_a_reservation_at_the_ceiling_breaks_other_callers_idle_holds_but_not_its_own() -> None:
    pool = cpu_pool(max_count=8, step=8, caller_hold_seconds=300.0, reserve_gangs_after=5.0)
    h = await Harness([pool], start_delay=START_DELAY).start()
    try:
        holder = await h.run_job("alice", pods=3, command=("sleep", "10"))
        mine = await h.run_job("bob", pods=2, lease_tag="own", command=("sleep", "1"))
        gang = await h.submit("bob", pods=8, lease_tag="gang", command=("sleep", "1"))
        done = await h.finish(gang, timeout=30.0)
        # alice's three held pods retired for the gang (replaced after one pod start); bob's own two
        # held pods joined his gang instead of being retired.
        waited = done.timings["committed_at"] - gang.timings["submitted_at"]
        assert waited <= 5.0 + h.cp.dispatcher.tick + START_DELAY + 0.5
        assert set(mine.pods) <= set(done.pods) and not set(holder.pods) & set(done.pods)
        assert all(name in h.backend.deleted for name in holder.pods)
    finally:
        await h.stop()


async def test_cancelling_a_reserved_gang_frees_its_pods_for_anyone() -> None:
    h = await Harness([cpu_pool(max_count=4, step=4, reserve_gangs_after=0.0)], start_delay=START_DELAY).start()
    try:
        blocker = await h.submit("alice", command=("sleep", "30"))
        await h.run_for(2.0)
        gang = await h.submit("bob", pods=4, command=("sleep", "1"))
        await h.run_for(3.0)
        assert h.cp.tracker.reservations("cpu")[0][1] == 3
        assert "reservation holds 3 of 4" in (h.cp.waiting_reason(gang.id) or "")
        await h.cp.cancel("bob", gang.id)
        assert h.cp.tracker.reservations("cpu") == []
        assert not [p for p in h.cp.tracker.snapshot() if p.reserved_for is not None]
        other = await h.run_job("carol", command=("sleep", "1"))
        assert other.state is JobState.SUCCEEDED and other.acquisition[0].path == "warm"
        assert (await h.finish(blocker)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


def test_the_fill_estimate_waits_for_the_blocking_job_and_a_replacement_start() -> None:
    spec = PoolSpec(name="p", max_count=4, template={"start_delay_s": 2.0})
    res = Reservation("g", "bob", "p", 4, (0, 1.0, "g"), 0.0)
    reserved = [Pod(f"r{i}", "p", state=PodState.IDLE) for i in range(3)]
    for pod in reserved:
        pod.reserved_for = "g"
    busy = Pod("b", "p", state=PodState.RUNNING)
    busy.job = "alice-job"
    jobs = {"alice-job": ("alice", 50.0)}
    [e] = estimate(spec, [(res, 3)], [*reserved, busy], jobs.__getitem__, now=10.0)
    # alice's pod ends by 50, retires (it never changes callers) and a replacement takes 2 s.
    assert (e.fill_at, e.make_room, e.restart_s) == (52.0, 1, 2.0)
    jobs["alice-job"] = ("bob", 50.0)  # the gang's own caller's pod comes back to him as it is
    assert estimate(spec, [(res, 3)], [*reserved, busy], jobs.__getitem__, now=10.0)[0].fill_at == 50.0
    roomy = dataclasses.replace(spec, max_count=5)  # a free slot: a new pod, no room to make
    [e] = estimate(roomy, [(res, 3)], [*reserved, busy], {"alice-job": ("alice", 50.0)}.__getitem__, now=10.0)
    assert (e.fill_at, e.make_room) == (12.0, 0)
    jobs["alice-job"] = ("alice", math.inf)  # no timeout: nothing bounds the fill, no backfill
    assert estimate(spec, [(res, 3)], [*reserved, busy], jobs.__getitem__, now=10.0)[0].fill_at == math.inf


def test_restart_estimate_counts_the_modelled_venue_delay() -> None:
    """A pool whose template models a venue's cold start (`venue_delay`) starts that much slower than its
    `start_delay_s` alone: the estimate is the model's median (what the backend's sampler draws typically)."""
    import random
    import statistics

    from broker.backends.startdelay import from_template
    from broker.claiming.reserving import restart_estimate

    venue = {"median_s": 8.0, "p90_s": 20.0, "scale": 0.5, "seed": 3}
    spec = gpu_pool(template={"start_delay_s": 1.5, "venue_delay": venue})
    assert restart_estimate(gpu_pool(template={"start_delay_s": 1.5})) == 1.5
    assert restart_estimate(spec) == 1.5 + 4.0
    parsed = from_template(spec.template)
    assert parsed is not None
    rng = random.Random(7)
    drawn = statistics.median(parsed[0].sample(rng) for _ in range(4001))
    assert abs((restart_estimate(spec) - 1.5) - drawn) < 0.25  # the median the local backend really adds
