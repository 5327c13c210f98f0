"""Who yields (design §7), the preemption budget's tiers (R6), aging, and the whole loop on the fake backend."""

from __future__ import annotations

import pytest

from broker.fleet.preemption import Budget, Running, Tier, choose, cost, decide, order, tier_for
from broker.fleet.quotas import CallerQuota, OrgQuota, PreemptionBudget, QuotasSpec, TeamQuota
from broker.jobs import ErrorClass, JobState, job_sort_key
from tests.unit.harness import Harness, gpu_pool

NOW = 10_000.0


def _r(job_id: str, *, borrowed: bool = False, preemptible: bool = False, priority: int = 0, started: float = 0.0,
       gpus: int = 1, session: bool = False) -> Running:
    return Running(job_id, "x", gpus, priority, started, borrowed, preemptible or borrowed, session)


JOBS = [
    _r("b-low-old", borrowed=True, priority=-1, started=100.0),
    _r("b-low-new", borrowed=True, priority=-1, started=900.0),
    _r("b-mid-old", borrowed=True, priority=0, started=200.0),
    _r("b-mid-new", borrowed=True, priority=0, started=800.0),
    _r("b-high", borrowed=True, priority=5, started=50.0),
    _r("p-low", preemptible=True, priority=-2, started=300.0),
    _r("p-mid", preemptible=True, priority=0, started=400.0),
    _r("p-high", preemptible=True, priority=3, started=10.0),
    _r("guaranteed", priority=-9, started=0.0),        # in quota, not preemptible: below the line
    _r("kernel", borrowed=True, session=True, started=0.0),  # a session job: below the line even when borrowed
    _r("young", borrowed=True, priority=-5, started=NOW - 10.0),  # within min_runtime_before_preempt
]


@pytest.mark.parametrize(("priority", "expected"), [
    # 1: borrowed at the lowest borrowed priority, newest first (LIFO); 2: other borrowed, by priority, newest first;
    # 3: preemptible within quota of LOWER priority than the preemptor, lowest first. Never: guaranteed, kernel, young.
    (0, ["b-low-new", "b-low-old", "b-mid-new", "b-mid-old", "b-high", "p-low"]),
    (1, ["b-low-new", "b-low-old", "b-mid-new", "b-mid-old", "b-high", "p-low", "p-mid"]),
    (9, ["b-low-new", "b-low-old", "b-mid-new", "b-mid-old", "b-high", "p-low", "p-mid", "p-high"]),
    (-5, ["b-low-new", "b-low-old", "b-mid-new", "b-mid-old", "b-high"]),
])
def test_who_yields_in_order_and_never_below_the_line(priority: int, expected: list[str]) -> None:
    got = [r.job_id for r in order(JOBS, priority=priority, now=NOW, min_runtime_s=60.0)]
    assert got == expected
    assert not {"guaranteed", "kernel", "young"} & set(got)


@pytest.mark.parametrize(("need", "expected"), [
    (1, ["b-low-new"]),
    (2, ["b-low-new", "b-low-old"]),
    (3, ["b-low-new", "b-low-old", "b-mid-new"]),
    (7, []),  # only 6 GPUs may yield to a priority-0 job: preempting some of them would place nothing
])
def test_the_fewest_victims_that_free_enough_or_none(need: int, expected: list[str]) -> None:
    assert [r.job_id for r in choose(JOBS, need, priority=0, now=NOW, min_runtime_s=60.0)] == expected


def test_the_cost_is_gpu_seconds_of_progress_at_risk() -> None:
    assert cost([_r("a", gpus=4, started=NOW - 100.0), _r("b", gpus=2, started=NOW - 10.0)], NOW) == 420.0


@pytest.mark.parametrize(("rate", "tier"), [(0.0, Tier.FREE), (9.99, Tier.FREE), (10.0, Tier.WARN), (24.9, Tier.WARN),
                                            (25.0, Tier.FLOOR), (80.0, Tier.FLOOR)])
def test_budget_tiers_follow_r6(rate: float, tier: Tier) -> None:
    assert tier_for(rate, 10.0, 25.0) is tier


def test_the_budget_counts_the_trailing_hour_and_holds_back_all_but_guaranteed_jobs() -> None:
    budget = Budget(warn_pct=10.0, limit_pct=25.0)
    victim = [_r("v", borrowed=True, gpus=10, started=NOW - 3600.0)]  # 36,000 GPU-s at risk
    # 100 GPUs running: the fleet runs 360,000 GPU-s an hour; this preemption is 10% of it.
    first = decide(budget, victim, 10, priority=0, guaranteed=False, now=NOW, min_runtime_s=0, running_gpus=100)
    assert first is not None and first.tier is Tier.WARN and first.go and first.rate_pct == pytest.approx(10.0)
    budget.spend(NOW, first.cost_gpu_s)
    budget.spend(NOW, 36_000.0)
    held = decide(budget, victim, 10, priority=0, guaranteed=False, now=NOW, min_runtime_s=0, running_gpus=100)
    assert held is not None and held.tier is Tier.FLOOR and not held.go  # above the floor: it queues
    floor = decide(budget, victim, 10, priority=0, guaranteed=True, now=NOW, min_runtime_s=0, running_gpus=100)
    assert floor is not None and floor.go  # a guaranteed job is the floor: never throttled
    later = decide(budget, victim, 10, priority=0, guaranteed=False, now=NOW + 3600.0, min_runtime_s=0,
                   running_gpus=100)
    assert later is not None and later.tier is Tier.FREE or later is not None and later.tier is Tier.WARN
    assert budget.rate_pct(NOW + 3600.0, 100) == 0.0  # an hour later the window is empty


QUOTAS = QuotasSpec(orgs={"acme": OrgQuota(teams={
    "nlp": TeamQuota(guaranteed_gpus=2, callers={"alice": CallerQuota()}),
    "rl": TeamQuota(guaranteed_gpus=2, callers={"bob": CallerQuota()}),
})}, preemption_grace_s=5.0, min_runtime_before_preempt=1.0)


async def test_a_guaranteed_job_preempts_a_borrowed_one_which_requeues_aged_and_finishes_later() -> None:
    h = await Harness([gpu_pool(max_count=4, step=4)], gpus=4, quotas=QUOTAS).start()
    try:
        borrowed = [await h.submit("alice", pool="gpu", lease_tag=f"b{i}", command=("sleep", "30"),
                                   max_retries=2, extra={"preemptible": True}) for i in range(4)]
        await h.until(lambda: all((h.store.get(j.id) or j).state is JobState.RUNNING for j in borrowed))
        # 2 run on nlp's guarantee, 2 on rl's unused guarantee (borrowed).
        assert h.cp.tracker.quota_view()["borrowed"] == {"team:acme/nlp": 2}
        on_loan = {lease.job_id for lease in h.cp.tracker.leases() if lease.borrowed}
        await h.run_for(2.0)  # past min_runtime_before_preempt
        owner = await h.submit("bob", pool="gpu", lease_tag="g", command=("sleep", "1"), pods=2)
        done = await h.finish(owner, timeout=30.0)
        assert done.state is JobState.SUCCEEDED
        victims = [j for j in (h.store.get(b.id) for b in borrowed) if j is not None and j.preempt_count]
        assert len(victims) == 2
        assert {v.id for v in victims} == on_loan  # the borrowed ones yield; alice's in-quota jobs keep running
        for v in victims:
            assert v.attempts[0].error_class == ErrorClass.PREEMPTED and v.retries == 1
            assert v.priority == 1 and job_sort_key(v)[0] == -1  # aged by its preemption
        events = h.store.list_events()
        preemptions = [e for e in events if e.kind == "preemption"]
        assert {e.subject for e in preemptions} == {v.id for v in victims}
        assert all(e.caller == "alice" and e.cost_gpu_s and e.detail["for_job"] == owner.id for e in preemptions)
        for v in victims:  # re-queued, they run again once the owner is done, and finish
            final = await h.finish(v, timeout=120.0)
            assert final.state is JobState.SUCCEEDED and len(final.attempts) == 2
    finally:
        await h.stop()


async def test_a_non_preemptible_job_beyond_its_guarantee_waits_with_the_reason_and_preempts_nobody() -> None:
    h = await Harness([gpu_pool(max_count=4, step=4)], gpus=4, quotas=QUOTAS).start()
    try:
        first = [await h.submit("alice", pool="gpu", lease_tag=f"a{i}", command=("sleep", "30")) for i in range(3)]
        await h.run_for(2.0)
        states = [(h.store.get(j.id) or j).state for j in first]
        assert states.count(JobState.RUNNING) == 2 and states.count(JobState.QUEUED) == 1
        waiting = next(j for j in first if (h.store.get(j.id) or j).state is JobState.QUEUED)
        assert (h.cp.waiting_reason(waiting.id) or "").startswith("team quota: team 'acme/nlp' holds 2 of its 2")
        assert not [e for e in h.store.list_events() if e.kind.startswith("preemption")]
    finally:
        await h.stop()


def test_budget_spend_is_per_window() -> None:
    budget = Budget(10.0, 25.0, window_s=100.0)
    budget.spend(0.0, 50.0)
    assert budget.rate_pct(50.0, 1) == 50.0
    assert budget.rate_pct(100.0, 1) == 0.0


def test_the_budget_knobs_default_to_r6() -> None:
    assert PreemptionBudget() == PreemptionBudget(warn_pct=10.0, limit_pct=25.0)


def _quotas(warn_pct: float, limit_pct: float) -> QuotasSpec:
    return QuotasSpec(orgs=QUOTAS.orgs, preemption_grace_s=5.0, min_runtime_before_preempt=1.0,
                      preemption_budget=PreemptionBudget(warn_pct=warn_pct, limit_pct=limit_pct))


async def _alice_fills_the_pool(h: Harness) -> set[str]:
    """alice runs 2 jobs on nlp's guarantee and 2 on rl's unused quota; returns the borrowed ones."""
    jobs = [await h.submit("alice", pool="gpu", lease_tag=f"b{i}", command=("sleep", "30"), max_retries=2,
                           extra={"preemptible": True}) for i in range(4)]
    await h.until(lambda: all((h.store.get(j.id) or j).state is JobState.RUNNING for j in jobs))
    await h.run_for(2.0)
    return {lease.job_id for lease in h.cp.tracker.leases() if lease.borrowed}


async def test_past_the_budget_limit_only_a_guaranteed_job_preempts_and_the_other_is_told_why() -> None:
    h = await Harness([gpu_pool(max_count=4, step=4)], gpus=4, quotas=_quotas(0.0001, 0.0002)).start()
    try:
        on_loan = await _alice_fills_the_pool(h)
        above_floor = await h.submit("bob", pool="gpu", lease_tag="p", command=("sleep", "1"),
                                     extra={"preemptible": True})
        await h.run_for(3.0)
        assert (h.store.get(above_floor.id) or above_floor).state is JobState.QUEUED
        held = [e for e in h.store.list_events() if e.kind == "preemption.throttled"]
        assert len(held) == 1 and held[0].subject == above_floor.id and held[0].caller == "bob"
        assert held[0].detail["would_preempt"][0] in on_loan and held[0].cost_gpu_s and held[0].cost_gpu_s > 0
        assert not [e for e in h.store.list_events() if e.kind == "preemption"]
        floor = await h.submit("bob", pool="gpu", lease_tag="g", command=("sleep", "1"))
        assert (await h.finish(floor, timeout=30.0)).state is JobState.SUCCEEDED
        assert [e.subject for e in h.store.list_events() if e.kind == "preemption"][0] in on_loan
    finally:
        await h.stop()


async def test_between_warn_and_limit_a_preemption_goes_ahead_with_a_warning() -> None:
    h = await Harness([gpu_pool(max_count=4, step=4)], gpus=4, quotas=_quotas(0.0001, 100.0)).start()
    try:
        on_loan = await _alice_fills_the_pool(h)
        owner = await h.submit("bob", pool="gpu", lease_tag="g", command=("sleep", "1"), extra={"preemptible": True})
        assert (await h.finish(owner, timeout=30.0)).state is JobState.SUCCEEDED
        kinds = [e.kind for e in h.store.list_events()]
        assert "preemption.warn" in kinds and kinds.count("preemption") == 1
        assert next(e.subject for e in h.store.list_events() if e.kind == "preemption") in on_loan
    finally:
        await h.stop()


@pytest.mark.parametrize(("priority", "preempted", "effective"), [(0, 0, 0), (0, 1, 1), (-3, 2, -1), (5, 4, 9)])
def test_each_preemption_ages_the_job_by_one_priority_point(priority: int, preempted: int, effective: int) -> None:
    from broker.jobs import Attempt, AttemptState, Job, JobSpec

    attempts = tuple(Attempt(f"j:{n}", "j", n, ("p",), AttemptState.FAILED, error_class=ErrorClass.PREEMPTED)
                     for n in range(preempted))
    job = Job("j", "alice", JobSpec(pool="gpu", command=("x",), priority=priority),
              attempts=(*attempts, Attempt(f"j:{preempted}", "j", preempted, ("p",), AttemptState.FAILED,
                                           error_class=ErrorClass.NON_ZERO_EXIT)))
    assert job.preempt_count == preempted and job.priority == effective
    assert job_sort_key(job)[0] == -effective  # dispatched ahead of un-aged jobs of its original priority


async def test_a_preemption_recorded_before_a_restart_still_ends_the_attempt_preempted() -> None:
    import dataclasses

    from broker.running.executing import PREEMPTING

    h = await Harness([gpu_pool(max_count=2, step=2)], gpus=2, quotas=QUOTAS).start()
    try:
        job = await h.submit("alice", pool="gpu", command=("sleep", "30"), max_retries=1, extra={"preemptible": True})
        await h.until(lambda: job.id in h.cp.executor.launched)

        def marked_by_an_earlier_broker(row):  # type: ignore[no-untyped-def]
            attempt = dataclasses.replace(row.current_attempt, message=PREEMPTING + "for j-owner")
            return dataclasses.replace(row.with_attempt(attempt), version=row.version + 1)

        await h.cp.book.write(job.id, marked_by_an_earlier_broker)
        assert job.id not in h.cp.executor.preempting  # this broker never asked: only the row knows
        await h.cp.signal("alice", job.id, "KILL")  # the agent's deadline fired
        await h.until(lambda: (h.store.get(job.id) or job).preempt_count == 1)
        row = h.store.get(job.id)
        assert row is not None and row.attempts[0].message == "for j-owner" and row.retries == 1
        assert (await h.finish(job, timeout=60.0)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_job_held_back_by_its_callers_own_limit_preempts_nobody() -> None:
    from broker.pools import CallerLimits

    h = Harness([gpu_pool(max_count=4, step=4)], gpus=4, quotas=QUOTAS, limits={"bob": CallerLimits(max_gpus=1)})
    await h.start()
    try:
        await _alice_fills_the_pool(h)
        first = await h.submit("bob", pool="gpu", lease_tag="g1", command=("sleep", "20"))
        await h.until(lambda: (h.store.get(first.id) or first).state is JobState.RUNNING, timeout=30.0)
        preempted = len([e for e in h.store.list_events() if e.kind == "preemption"])
        second = await h.submit("bob", pool="gpu", lease_tag="g2", command=("sleep", "1"))
        await h.run_for(5.0)
        assert h.cp.waiting_reason(second.id) == "caller quota"
        assert len([e for e in h.store.list_events() if e.kind == "preemption"]) == preempted == 1
    finally:
        await h.stop()
