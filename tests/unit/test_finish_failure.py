"""An executor whose `finish` raises on every call (a bug on the log copy, health, outcome or reset path, not an
agent or store error) never leaves a job RUNNING with nobody watching it: every site that ends an attempt — the
watch, a launch failure, a raising launch path, a cancel, a timeout — ends it alone (broker.running.ending), its
outcome from the ranks' statuses, no retry, and retires the pods no reset proved clean."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import broker.running.ending
from broker.errors import FirepoolError
from broker.jobs import ErrorClass, Job, JobState
from broker.pods import PodState
from broker.ports.agent import FakeAgent
from broker.running.topology import Rendezvous
from tests.unit.harness import Harness, cpu_pool, failing_once


def _break_finish(h: Harness) -> list[int]:
    calls = [0]

    async def finish(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        raise KeyError("a bug in finish, not an AgentError")

    h.cp.executor.finish = finish  # type: ignore[method-assign]
    return calls


async def _ended(h: Harness, job: Job, timeout: float = 30.0) -> Job:
    done = await h.finish(job, timeout=timeout)
    await h.run_for(1.0)
    assert job.id not in h.cp.executor.launched
    assert not h.cp.tracker.pods_of(job.id)
    for name in done.pods or (done.attempts[-1].pods if done.attempts else ()):
        assert name in h.backend.deleted  # no reset proved it clean
    assert all(p.state in (PodState.IDLE, PodState.STARTING) for p in h.cp.tracker.snapshot())
    return done


async def _serves(h: Harness) -> None:
    """The pool still runs jobs (each ends alone too: finish raises on every call)."""
    again = await h.run_job("alice", command=("exit", "0"))
    assert again.state is JobState.SUCCEEDED, again


@pytest.mark.parametrize(
    ("command", "state", "exit_code"),
    [
        (("exit", "0"), JobState.SUCCEEDED, 0),
        (("sleep", "2"), JobState.SUCCEEDED, 0),
        (("exit", "3"), JobState.FAILED, 3),
    ],
)
async def test_a_watched_attempt_whose_finish_raises_commits_the_ranks_outcome_and_retires_the_pod(
    command: tuple[str, ...], state: JobState, exit_code: int
) -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        calls = _break_finish(h)
        job = await _ended(h, await h.submit(command=command, max_retries=2))
        assert job.state is state and job.attempts[-1].exit_code == exit_code, job
        assert job.retries == 0 and len(job.attempts) == 1  # a finish that raised is never retried
        assert calls[0] == 1
        await _serves(h)
    finally:
        await h.stop()


async def test_a_timed_out_attempt_whose_finish_raises_ends_timed_out() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        _break_finish(h)
        job = await _ended(h, await h.submit(command=("sleep", "1000"), timeout_s=1.0), timeout=60.0)
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.TIMEOUT, job
        await _serves(h)
    finally:
        await h.stop()


async def test_a_cancelled_attempt_whose_finish_raises_ends_cancelled() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        _break_finish(h)
        job = await h.submit(command=("sleep", "1000"))
        await h.until(lambda: job.id in h.cp.executor.launched)
        await h.run_for(0.5)
        await h.cp.cancel("alice", job.id)
        done = await _ended(h, job)
        assert done.state is JobState.CANCELLED and done.error_class == ErrorClass.CANCELLED, done
        await _serves(h)
    finally:
        await h.stop()


async def test_a_job_cancelled_before_launch_whose_finish_raises_ends_cancelled() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        _break_finish(h)
        real = h.cp.executor.start

        async def start(job: Job, lease: Any) -> None:  # the caller cancels between the commit and the launch
            await h.cp.cancel(job.caller, job.id)
            await real(job, lease)

        h.cp.executor.start = start  # type: ignore[method-assign]
        done = await _ended(h, await h.submit(command=("sleep", "1000")))
        assert done.state is JobState.CANCELLED and done.attempts[-1].message == "cancelled before launch", (
            done
        )
    finally:
        await h.stop()


def _break_rendezvous(h: Harness, exc: Exception) -> None:
    def rendezvous(coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        raise exc

    h.backend.rendezvous = rendezvous  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "exc", [FirepoolError("the ranks cannot meet"), KeyError("a bug on the launch path")]
)
async def test_a_failed_launch_whose_finish_raises_fails_the_job_without_a_retry(exc: Exception) -> None:
    """A launch that fails (an expected error) or raises (a bug: `abort` ends it through the same finish)."""
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        _break_finish(h)
        _break_rendezvous(h, exc)
        job = await _ended(h, await h.submit(command=("exit", "0"), max_retries=2))
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.LAUNCH_ERROR, job
        assert job.retries == 0 and len(job.attempts) == 1, job
    finally:
        await h.stop()


async def test_a_raising_watch_whose_finish_raises_too_ends_the_job_and_retires_its_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def wait(self: FakeAgent, attempt_id: str, timeout_s: float) -> Any:
        raise KeyError("a bug in the watch")

    monkeypatch.setattr(FakeAgent, "wait", wait)
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        _break_finish(h)
        job = await _ended(h, await h.submit(command=("sleep", "100")))
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.LAUNCH_ERROR, job
        assert "KeyError" in (job.error_message or "")
    finally:
        await h.stop()


async def test_when_even_the_outcome_raises_the_job_fails_with_a_typed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(broker.running.ending, "outcome_of", failing_once(broker.running.ending.outcome_of))
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        _break_finish(h)
        job = await _ended(h, await h.submit(command=("exit", "0")))
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.LAUNCH_ERROR, job
        assert "KeyError" in (job.error_message or "")
    finally:
        await h.stop()
