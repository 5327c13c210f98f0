"""The reuse rules of DESIGN.md, pinned on the virtual clock with the fake backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.jobs import AttemptState, Job, JobState
from broker.pods import PodState
from tests.unit.harness import Harness, cpu_pool


@pytest.fixture
async def h():
    harness = await Harness([cpu_pool()]).start()
    yield harness
    await harness.stop()


async def test_same_caller_and_tag_reuses_the_warm_pod(h: Harness) -> None:
    first = await h.run_job(lease_tag="conv-1")
    second = await h.run_job(lease_tag="conv-1")
    assert first.state is JobState.SUCCEEDED and second.state is JobState.SUCCEEDED
    assert h.paths(first) == ["new"]
    assert h.paths(second) == ["warm"]
    assert second.pods == first.pods
    assert second.acquisition[0].reason is None


async def test_three_concurrent_callers_never_share_a_pod(h: Harness) -> None:
    jobs = []
    for _round in range(3):
        for caller in ("alice", "bob", "carol"):
            jobs.append(await h.submit(caller, lease_tag="t", command=("sleep", "2")))
        for job in jobs[-3:]:
            await h.finish(job)
    finals = [h.store.get(j.id) for j in jobs]
    callers_by_pod: dict[str, set[str]] = {}
    for job in finals:
        assert job is not None and job.state is JobState.SUCCEEDED
        callers_by_pod.setdefault(job.pods[0], set()).add(job.caller)
    assert all(len(callers) == 1 for callers in callers_by_pod.values()), callers_by_pod
    later = [j for j in finals[3:] if j is not None]
    assert all(h.paths(j) == ["warm"] for j in later)


async def test_at_the_ceiling_a_new_tag_starts_on_the_emptied_old_pod_and_keeps_it() -> None:
    h = await Harness([cpu_pool(max_count=1)]).start()
    try:
        first = await h.run_job(lease_tag="session-a")
        agent = h.backend.agents[first.pods[0]]
        second = await h.run_job(lease_tag="session-b")
        assert h.paths(second) == ["recycled"]
        assert second.pods == first.pods
        assert "this session's pod" in (second.acquisition[0].reason or "")
        assert agent.workspace_wiped == 1  # the second session started on an emptied workspace
        await h.run_for(1.0)
        assert first.pods[0] not in h.backend.deleted
        third = await h.run_job(lease_tag="session-b")
        assert third.pods == first.pods and h.paths(third) == ["warm"] and agent.workspace_wiped == 1
    finally:
        await h.stop()


async def test_hold_expiry_retires_the_pod(h: Harness) -> None:
    job = await h.run_job(lease_tag="t")
    pod = h.cp.tracker.pods[job.pods[0]]
    assert pod.held(h.clock.now())
    await h.run_for(59.0)
    assert job.pods[0] not in h.backend.deleted
    await h.run_for(2.5)
    assert job.pods[0] in h.backend.deleted
    assert pod.state is PodState.GONE


async def test_another_caller_never_gets_a_held_pod_even_at_the_ceiling() -> None:
    h = await Harness([cpu_pool(max_count=1)]).start()
    try:
        alice = await h.run_job("alice", lease_tag="t")
        bob = await h.submit("bob", lease_tag="t")
        await h.run_for(30.0)
        assert h.store.get(bob.id).state is JobState.QUEUED  # type: ignore[union-attr]
        bob_done = await h.finish(bob, timeout=60.0)
        assert bob_done.pods != alice.pods
        assert h.paths(bob_done) == ["new"]
    finally:
        await h.stop()


async def test_unclean_reset_deletes_the_pod_and_the_next_job_gets_a_new_one(h: Harness) -> None:
    first = await h.submit(lease_tag="t", command=("sleep", "1"))
    await h.until(lambda: bool(h.store.get(first.id).pods))  # type: ignore[union-attr]
    pod_name = h.store.get(first.id).pods[0]  # type: ignore[union-attr]
    h.backend.agents[pod_name].unclean_next_reset = True
    await h.finish(first)
    await h.run_for(0.5)
    assert pod_name in h.backend.deleted
    second = await h.run_job(lease_tag="t")
    assert second.pods[0] != pod_name
    assert h.paths(second) == ["new"]
    assert h.cp.stats.resets[("cpu", False)] == 1


async def test_reuse_tag_hint_keeps_the_pod_across_tags() -> None:
    h = await Harness([cpu_pool(reuse_tag="hint")]).start()
    try:
        first = await h.run_job(lease_tag="a")
        second = await h.run_job(lease_tag="b")
        assert second.pods == first.pods
        assert h.paths(second) == ["warm"]
        assert "hint" in (second.acquisition[0].reason or "")
        await h.run_for(1.0)
        assert first.pods[0] not in h.backend.deleted
        other_queue = await h.run_job(lease_tag="b", queue="eval")
        assert h.paths(other_queue) == ["recycled"] and other_queue.pods == first.pods
    finally:
        await h.stop()


async def test_a_short_lone_job_is_reset_by_its_launch_and_a_long_one_by_a_reset_request(h: Harness) -> None:
    short = await h.run_job(lease_tag="t", command=("echo", "hi"))
    agent = h.backend.agents[short.pods[0]]
    assert agent.launches[-1].reset_after is not None and len(agent.resets) == 1
    assert h.logs.read("alice", short.attempts[-1].id, "stdout") == b"hi\n"  # the logs came with the launch
    long = await h.run_job(lease_tag="t", command=("sleep", "5"))  # outlives the launch's wait
    assert long.pods == short.pods and len(agent.resets) == 2
    third = await h.run_job(lease_tag="t", command=("exit", "3"))  # clean after either: reused
    assert third.pods == short.pods and h.paths(third) == ["warm"]
    assert h.cp.stats.resets[("cpu", True)] == 3


async def test_a_gangs_ranks_are_reset_by_reset_requests() -> None:
    h = await Harness([cpu_pool(max_count=2)]).start()
    try:
        job = await h.run_job("bob", pods=2, command=("exit", "0"))
        assert job.state is JobState.SUCCEEDED
        for name in job.pods:
            agent = h.backend.agents[name]
            assert [r.reset_after for r in agent.launches] == [None] and len(agent.resets) == 1
    finally:
        await h.stop()


async def test_a_pod_goes_back_to_the_pool_only_once_its_jobs_outcome_is_handed_to_the_store(h: Harness) -> None:
    # Else the next job could be claimed on it and stored first: a broker killed in between would find two jobs
    # running on one pod. Here the outcome waits behind the attempt's slow start write (the job outlived the
    # launch's wait), the race where the pod used to go back first.
    seen: list[tuple[str, list[PodState]]] = []
    book = h.cp.book
    real = book._commit

    async def commit(job: Job, expected: int, queued: Callable[[], None] | None = None) -> bool:
        attempt = job.current_attempt
        if attempt is not None and attempt.state is AttemptState.RUNNING:  # the start write: slow
            await h.clock.sleep(1.0)
        if job.terminal:
            seen.append((job.id, [h.cp.tracker.pods[n].state for n in job.pods]))
        return await real(job, expected, queued)

    book._commit = commit  # type: ignore[method-assign]
    job = await h.run_job(lease_tag="t", command=("sleep", "0.3"))
    assert job.state is JobState.SUCCEEDED and seen == [(job.id, [PodState.RESETTING])]
    assert h.cp.tracker.pods[job.pods[0]].state is PodState.IDLE  # and back once it was
