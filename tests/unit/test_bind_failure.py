"""A bind task that raises (a bug on the launch path) ends its attempt with a typed error and follows the
job's retry policy; it never leaves the job RUNNING for ever nor its pods assigned."""

from __future__ import annotations

from collections.abc import Sequence

from broker.jobs import ErrorClass, JobState
from broker.pods import PodState
from broker.running.topology import Rendezvous
from tests.unit.harness import Harness, cpu_pool


def _break_rendezvous(h: Harness, times: int) -> list[int]:
    calls = [0]
    real = h.backend.rendezvous

    def rendezvous(coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        calls[0] += 1
        if calls[0] <= times:
            raise KeyError("a bug, not a FirepoolError")
        return real(coordinator, world, members)

    h.backend.rendezvous = rendezvous  # type: ignore[method-assign]
    return calls


async def test_a_raising_bind_fails_the_job_with_a_typed_error() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        _break_rendezvous(h, times=1)
        job = await h.finish(await h.submit("alice"), timeout=30.0)
        assert job.state is JobState.FAILED, job
        assert job.error_class == ErrorClass.LAUNCH_ERROR
        assert "KeyError" in (job.error_message or "")
        assert job.attempts[-1].state.value == "FAILED"
        await h.run_for(1.0)
        assert all(p.state in (PodState.IDLE, PodState.GONE, PodState.RETIRING) for p in h.cp.tracker.snapshot())
        again = await h.run_job("alice")  # the pool still serves
        assert again.state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_raising_bind_is_retried_under_the_jobs_retry_policy() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        calls = _break_rendezvous(h, times=1)
        job = await h.finish(await h.submit("alice", max_retries=1), timeout=30.0)
        assert job.state is JobState.SUCCEEDED and job.retries == 1, job
        assert job.attempts[0].error_class == ErrorClass.LAUNCH_ERROR
        assert calls[0] == 2
    finally:
        await h.stop()
