"""A watcher that raises (a bug, not an agent error) on an attempt re-attached after a restart ends the attempt
with a typed error and follows the job's retry policy, as a raising bind task does; it never leaves the job
RUNNING with nobody watching it."""

from __future__ import annotations

from broker.jobs import ErrorClass, JobState
from broker.pods import PodState
from broker.ports.agent import AttemptStatus
from tests.unit.harness import Harness, cpu_pool


async def _restart_with_a_raising_watch(max_retries: int) -> tuple[Harness, str, list[int]]:
    """A running job, then a restarted broker whose first long-poll of its attempt raises a non-agent error."""
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    job = await h.submit(command=("sleep", "100"), max_retries=max_retries)
    await h.until(lambda: h.store.get(job.id).state is JobState.RUNNING)  # type: ignore[union-attr]
    await h.run_for(0.5)
    await h.stop()
    agent = h.backend.agents[h.store.get(job.id).pods[0]]  # type: ignore[union-attr]
    real, calls = agent.wait, [0]

    async def wait(attempt_id: str, timeout_s: float) -> AttemptStatus:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyError("a bug, not an AgentError")
        return await real(attempt_id, timeout_s)

    agent.wait = wait  # type: ignore[method-assign]
    again = h.restarted([cpu_pool(max_count=1, step=1)])
    await again.start()
    assert again.cp.recovery is not None and again.cp.recovery.reattached == [job.id]
    return again, job.id, calls


async def test_a_raising_watch_of_a_reattached_attempt_fails_the_job_and_frees_its_pod() -> None:
    h, job_id, calls = await _restart_with_a_raising_watch(max_retries=0)
    try:
        row = h.store.get(job_id)
        assert row is not None
        job = await h.finish(
            row, timeout=30.0
        )  # the attempt sleeps 100 s: only the failure ends it this soon
        assert calls[0] == 1
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.LAUNCH_ERROR, job
        assert "KeyError" in (job.error_message or "")
        await h.run_for(1.0)
        assert all(
            p.state in (PodState.IDLE, PodState.GONE, PodState.RETIRING) for p in h.cp.tracker.snapshot()
        )
        assert (
            await h.run_job("alice", command=("exit", "0"))
        ).state is JobState.SUCCEEDED  # the pool still serves
    finally:
        await h.stop()


async def test_a_raising_watch_of_a_reattached_attempt_is_retried_under_the_jobs_retry_policy() -> None:
    h, job_id, _ = await _restart_with_a_raising_watch(max_retries=1)
    try:
        row = h.store.get(job_id)
        assert row is not None
        job = await h.finish(row, timeout=300.0)
        assert job.state is JobState.SUCCEEDED and job.retries == 1, job
        assert job.attempts[0].error_class == ErrorClass.LAUNCH_ERROR
    finally:
        await h.stop()
