"""An attempt that ended while the broker was down is finalised by recovery. A finish that raises (a bug, not an
agent error) still lands the job in a terminal state, as the outcome path commits it, and retires the pods no
reset proved clean; it never leaves the job RUNNING with its pods assigned."""

from __future__ import annotations

from typing import Any

import pytest

import broker.running.ending
from broker.jobs import ErrorClass, JobState
from broker.pods import PodState
from tests.unit.harness import Harness, cpu_pool, failing_once


async def _restart_after_the_job_ended(timeout_s: float | None = None) -> tuple[Harness, Harness, str]:
    """A job whose attempt ends while its broker is stopped (`sleep 1`, or killed at `timeout_s`); the restarted
    broker's executor.finish raises."""
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    job = await h.submit(command=("sleep", "1" if timeout_s is None else "1000"), timeout_s=timeout_s)
    await h.until(lambda: h.store.get(job.id).state is JobState.RUNNING)  # type: ignore[union-attr]
    await h.run_for(0.2)
    await h.stop()
    h.clock.advance(5.0)  # the attempt ends during the outage
    again = h.restarted([cpu_pool(max_count=1, step=1)])
    real, calls = again.cp.executor.finish, [0]

    async def finish(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:  # recovery's; later jobs finish as usual
            raise KeyError("a bug, not an AgentError")
        await real(*args, **kwargs)

    again.cp.executor.finish = finish  # type: ignore[method-assign]
    await again.start()
    assert again.cp.recovery is not None and again.cp.recovery.finalised == [job.id]
    return h, again, job.id


@pytest.mark.parametrize(
    ("timeout_s", "state", "exit_code"), [(None, JobState.SUCCEEDED, 0), (1.0, JobState.FAILED, 137)]
)
async def test_a_raising_finish_after_a_restart_commits_the_ranks_outcome_and_retires_the_pods(
    timeout_s: float | None, state: JobState, exit_code: int
) -> None:
    h, again, job_id = await _restart_after_the_job_ended(timeout_s)
    try:
        row = h.store.get(job_id)
        assert row is not None
        job = await again.finish(row, timeout=5.0)
        assert job.state is state and job.attempts[-1].exit_code == exit_code, job
        pod = job.pods[0] if job.pods else row.pods[0]
        await again.run_for(1.0)
        assert pod in again.backend.deleted  # no reset proved it clean
        assert job_id not in again.cp.executor.launched
        assert all(p.state in (PodState.IDLE, PodState.STARTING) for p in again.cp.tracker.snapshot())
        assert (
            await again.run_job("alice", command=("exit", "0"))
        ).state is JobState.SUCCEEDED  # the pool serves
    finally:
        await again.stop()


async def test_at_recovery_when_even_the_outcome_raises_the_job_fails_with_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(broker.running.ending, "outcome_of", failing_once(broker.running.ending.outcome_of))
    h, again, job_id = await _restart_after_the_job_ended()
    try:
        row = h.store.get(job_id)
        assert row is not None
        job = await again.finish(row, timeout=5.0)
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.LAUNCH_ERROR, job
        assert "KeyError" in (job.error_message or "")
    finally:
        await again.stop()


async def test_a_raising_watch_whose_finish_raises_too_still_ends_the_job_and_retires_its_pod() -> None:
    """A re-attached attempt: its watcher raises, and so does the finish its abort goes through. The attempt still ends (a typed
    error, no retry) and its pod, with the ranks that may still run on it, is deleted."""
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    job = await h.submit(command=("sleep", "100"), max_retries=1)
    await h.until(lambda: h.store.get(job.id).state is JobState.RUNNING)  # type: ignore[union-attr]
    await h.run_for(0.5)
    await h.stop()
    pod = h.store.get(job.id).pods[0]  # type: ignore[union-attr]
    agent = h.backend.agents[pod]

    async def wait(attempt_id: str, timeout_s: float) -> Any:
        raise KeyError("a bug in the watch")

    agent.wait = wait  # type: ignore[method-assign]
    again = h.restarted([cpu_pool(max_count=1, step=1)])
    real, calls = again.cp.executor.finish, [0]

    async def finish(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise ValueError("a bug in the finish")
        await real(*args, **kwargs)

    again.cp.executor.finish = finish  # type: ignore[method-assign]
    await again.start()
    try:
        assert again.cp.recovery is not None and again.cp.recovery.reattached == [job.id]
        row = h.store.get(job.id)
        assert row is not None
        done = await again.finish(row, timeout=10.0)  # the attempt sleeps 100 s: only the failure ends it
        assert done.state is JobState.FAILED and done.error_class == ErrorClass.LAUNCH_ERROR, done
        assert "KeyError" in (done.error_message or "") and done.retries == 0  # the watch's bug, the root cause
        await again.run_for(1.0)
        assert pod in again.backend.deleted
        assert (await again.run_job("alice", command=("exit", "0"))).state is JobState.SUCCEEDED
    finally:
        await again.stop()
