"""The claim path: gangs, the per-GPU gate, retries, timeouts, cancellation, quotas, lost commits."""

from __future__ import annotations

import pytest

from broker.errors import StoreError
from broker.jobs import AttemptState, JobSpec, JobState
from broker.pools import CallerLimits
from tests.unit.harness import Harness, cpu_pool, gpu_pool


async def test_a_gang_never_holds_a_partial_set() -> None:
    h = await Harness([cpu_pool(max_count=3, caller_hold_seconds=5.0)]).start()
    try:
        busy = [await h.submit("alice", lease_tag=f"t{i}", command=("sleep", "10")) for i in range(2)]
        await h.run_for(1.0)
        gang = await h.submit("bob", lease_tag="g", pods=3, command=("sleep", "1"))
        for _ in range(40):
            await h.run_for(0.2)
            held_by_gang = h.cp.tracker.pods_of(gang.id)
            assert held_by_gang == () or len(held_by_gang) == 3
            if held_by_gang:
                break
        done = await h.finish(gang)
        assert done.state is JobState.SUCCEEDED and len(set(done.pods)) == 3
        for job in busy:
            assert (await h.finish(job)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_the_per_gpu_gate_never_runs_two_jobs_on_one_gpu() -> None:
    h = Harness([gpu_pool(max_count=3)], gpus=1)
    h.backend.pin_gpu = "fake-gpu-0"  # every pod lands on one card, as standbys would
    await h.start()
    try:
        jobs = [await h.submit(f"caller{i}", pool="gpu", command=("sleep", "2")) for i in range(3)]
        running_together = 0
        while not all(h.store.get(j.id).terminal for j in jobs):  # type: ignore[union-attr]
            await h.run_for(0.1)
            on_gpu = [p for p in h.cp.tracker.snapshot() if p.state.value == "running"]
            running_together = max(running_together, len(on_gpu))
        assert running_together == 1
        finals = [h.store.get(j.id) for j in jobs]
        assert all(f is not None and f.state is JobState.SUCCEEDED for f in finals)
    finally:
        await h.stop()


async def test_a_failing_job_is_retried_as_new_attempts_then_fails() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.run_job(command=("exit", "3"), max_retries=2)
        assert job.state is JobState.FAILED
        assert job.error_class == "NonZeroExit" and job.exit_code == 3 and job.retries == 2
        assert [a.id for a in job.attempts] == [f"{job.id}:0", f"{job.id}:1", f"{job.id}:2"]
        assert all(a.state is AttemptState.FAILED and a.exit_code == 3 for a in job.attempts)
    finally:
        await h.stop()


async def test_timeout_ends_the_job_as_timeout() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.run_job(command=("sleep", "60"), timeout_s=1.0)
        assert job.state is JobState.FAILED and job.error_class == "Timeout"
        assert job.timings["finished_at"] - job.timings["submitted_at"] < 3.0
    finally:
        await h.stop()


async def test_cancel_a_queued_job_stores_cancelled_and_never_runs_it() -> None:
    h = await Harness([cpu_pool(max_count=1)]).start()
    try:
        blocker = await h.submit("alice", command=("sleep", "5"))
        await h.run_for(0.5)
        queued = await h.submit("bob")
        cancelled = await h.cp.cancel("bob", queued.id)
        assert cancelled.state is JobState.CANCELLED and cancelled.error_class == "Cancelled"
        await h.finish(blocker)
        await h.run_for(70)
        assert h.store.get(queued.id).attempts == ()  # type: ignore[union-attr]
    finally:
        await h.stop()


async def test_cancel_a_running_job_kills_it_and_returns_the_pod() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.submit(command=("hang",))
        await h.until(lambda: job.id in h.cp.executor.launched)
        await h.cp.cancel("alice", job.id)
        done = await h.finish(job)
        assert done.state is JobState.CANCELLED and done.error_class == "Cancelled"
        assert done.attempts[-1].state is AttemptState.CANCELLED
        again = await h.run_job()
        assert h.paths(again) == ["warm"]
    finally:
        await h.stop()


async def test_the_same_idempotency_key_returns_the_same_job() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        first = await h.submit(idempotency_key="k1")
        second = await h.submit(idempotency_key="k1")
        other_caller = await h.submit("bob", idempotency_key="k1")
        assert second.id == first.id
        assert other_caller.id != first.id
    finally:
        await h.stop()


async def test_a_lost_pod_ends_the_attempt_pod_lost_and_the_pod_is_deleted() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.submit(command=("hang",))
        await h.until(lambda: job.id in h.cp.executor.launched)
        pod = h.store.get(job.id).pods[0]  # type: ignore[union-attr]
        h.backend.agents[pod].reachable = False
        done = await h.finish(job, timeout=120)
        assert done.state is JobState.FAILED and done.error_class == "PodLost"
        assert done.exit_code is None
        await h.run_for(0.5)
        assert pod in h.backend.deleted
    finally:
        await h.stop()


async def test_single_use_pods_are_created_for_the_job_and_deleted_after() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        warm = await h.run_job(lease_tag="t")
        job = await h.run_job(lease_tag="t", single_use=True)
        assert h.paths(job) == ["new"] and job.pods != warm.pods
        await h.run_for(0.5)
        assert job.pods[0] in h.backend.deleted
    finally:
        await h.stop()


async def test_caller_limits_hold_jobs_back_without_failing_them() -> None:
    h = await Harness([cpu_pool()], limits={"alice": CallerLimits(max_pods=1)}).start()
    try:
        a = await h.submit("alice", lease_tag="x", command=("sleep", "5"))
        b = await h.submit("alice", lease_tag="y", command=("sleep", "5"))
        await h.run_for(1.0)
        assert h.store.get(a.id).state is JobState.RUNNING  # type: ignore[union-attr]
        assert h.store.get(b.id).state is JobState.QUEUED  # type: ignore[union-attr]
        assert h.cp.waiting_reason(b.id) == "caller quota"
        assert (await h.finish(b)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_lost_commit_returns_the_pods_and_runs_nothing() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        job = await h.queued_for_the_pod()
        agent = next(iter(h.backend.agents.values()))
        original_commit = h.store.commit
        outcomes: list[bool] = []

        def lose_the_first(writes):  # another writer got there first, once: the queued job's claim
            mine = any(j.id == job.id for j, _ in writes)
            result = [False for _ in writes] if mine and not outcomes else original_commit(writes)
            if mine:
                outcomes.extend(result)
            return result

        h.store.commit = lose_the_first  # type: ignore[method-assign]
        launches_before = len(agent.launches)
        done = await h.finish(job)
        assert outcomes[0] is False
        assert done.state is JobState.SUCCEEDED and h.paths(done) == ["warm"]
        assert [r.attempt_id for r in agent.launches[launches_before:]] == [f"{job.id}:0"]
    finally:
        await h.stop()


async def test_exit_code_is_absent_when_no_process_ran() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.submit(command=("hang",))
        await h.run_for(0.01)
        await h.cp.cancel("alice", job.id)
        done = await h.finish(job)
        assert done.state is JobState.CANCELLED
        ok = await h.run_job(command=("exit", "0"))
        assert ok.exit_code == 0
    finally:
        await h.stop()


async def test_a_submit_that_finds_its_warm_pod_idle_is_stored_bound_without_a_claim_write() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        warm = await h.run_job(lease_tag="t", command=("true",))
        commits = h.store.commits
        job, created = await h.cp.submit("alice", JobSpec(pool="cpu", command=("sleep", "1"), lease_tag="t"))
        stored = h.store.get(job.id)
        assert created and stored is not None and stored.state is JobState.RUNNING and stored.pods == warm.pods
        assert [a.state for a in stored.attempts] == [AttemptState.LAUNCHING]
        assert h.store.commits == commits  # its insert carried the claim
        done = await h.finish(job)
        assert done.state is JobState.SUCCEEDED and h.paths(done) == ["warm"] and len(done.attempts) == 1
    finally:
        await h.stop()


async def test_a_bound_insert_whose_answer_was_lost_runs_once_when_the_caller_retries_it() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        warm = await h.run_job(lease_tag="t", command=("true",))
        agent = h.backend.agents[warm.pods[0]]
        launches_before = len(agent.launches)
        calls = h.lose_first_insert_answer()
        with pytest.raises(StoreError):
            await h.submit(lease_tag="t", idempotency_key="k1")
        landed = h.store.get(calls[0])
        assert landed is not None and landed.state is JobState.RUNNING  # stored bound, and never launched
        await h.run_for(5.0)
        assert len(agent.launches) == launches_before
        again = await h.submit(lease_tag="t", idempotency_key="k1")  # the caller retries with the same key
        assert again.id == calls[0]
        done = await h.finish(again, timeout=30.0)
        assert done.state is JobState.SUCCEEDED and [a.state.value for a in done.attempts] == ["LOST", "SUCCEEDED"]
        assert [r.attempt_id for r in agent.launches[launches_before:]] == [f"{again.id}:1"]
    finally:
        await h.stop()
