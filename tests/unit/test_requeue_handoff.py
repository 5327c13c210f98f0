"""A job committed back to QUEUED (a retry, a recovery re-queue, a lost commit answer) is always run again: the
hand-off to the dispatcher's queue may raise (a bug, a cancelled task), and the dispatcher's sweep then adopts
the row it does not know. Nothing runs twice: a stale or repeated hand-off never starts an attempt again."""

from __future__ import annotations

from typing import Any

from broker.jobs import JobState
from tests.unit.harness import Harness, cpu_pool, failing_once


def _launches(h: Harness) -> list[str]:
    """Attempt ids in launch order (every rank of every attempt the agents were asked to start)."""
    started: list[str] = []
    real = h.cp.executor._launch

    async def launch(pod: Any, request: Any) -> Any:
        started.append(request.attempt_id)
        return await real(pod, request)

    h.cp.executor._launch = launch  # type: ignore[method-assign]
    return started


async def test_a_retry_whose_hand_off_to_the_queue_raises_still_runs_exactly_once_more() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        started = _launches(h)
        h.cp.executor.requeue = failing_once(h.cp.executor.requeue)  # type: ignore[method-assign]
        job = await h.submit(command=("exit", "3"), max_retries=1)
        done = await h.finish(job, timeout=30.0)
        assert done.state is JobState.FAILED and done.exit_code == 3 and done.retries == 1, done
        assert [a.exit_code for a in done.attempts] == [3, 3]
        assert started == [a.id for a in done.attempts]  # each attempt launched once, none twice
    finally:
        await h.stop()


async def test_a_retry_whose_pod_reset_raises_beside_its_commit_still_runs_exactly_once_more() -> None:
    """The reset raising makes the finish lose the committed retry it ran beside (the hand-off never happens); the
    pod it left resetting retires."""
    h = await Harness([cpu_pool(max_count=2, step=1)]).start()
    try:
        started = _launches(h)
        h.cp.stats.observe_reset = failing_once(h.cp.stats.observe_reset)  # type: ignore[method-assign]
        job = await h.submit(command=("exit", "3"), max_retries=1)
        done = await h.finish(job, timeout=30.0)
        assert done.state is JobState.FAILED and done.retries == 1 and len(done.attempts) == 2, done
        assert started == [a.id for a in done.attempts]
        assert done.attempts[0].pods[0] in h.backend.deleted  # its reset never proved it clean
    finally:
        await h.stop()


async def test_a_retry_whose_commit_answer_was_lost_still_runs_exactly_once_more() -> None:
    """The outcome landed but the store's answer did not: the next try loses the version race and adopts the
    QUEUED row, so the executor never hands it off."""
    h = await Harness([cpu_pool()]).start()
    try:
        started = _launches(h)
        lost = h.lose_first_commit_answer(lambda j: j.state is JobState.QUEUED)
        job = await h.submit(command=("exit", "3"), max_retries=1)
        done = await h.finish(job, timeout=30.0)
        assert len(lost) == 1
        assert done.state is JobState.FAILED and done.retries == 1 and len(done.attempts) == 2, done
        assert started == [a.id for a in done.attempts]
    finally:
        await h.stop()


async def test_a_stale_hand_off_of_a_job_running_again_never_starts_it_twice() -> None:
    """A QUEUED copy handed to the queue after the job was bound again (a late retry hand-off, a retried submit)."""
    h = await Harness([cpu_pool()]).start()
    try:
        started = _launches(h)
        job = await h.submit(command=("sleep", "5"))
        assert job.state is JobState.QUEUED  # the row as submitted
        await h.until(lambda: job.id in h.cp.executor.launched)
        h.cp.dispatcher.enqueue(job)  # the stale copy
        await h.run_for(1.0)
        assert job.id not in h.cp.dispatcher.queued
        done = await h.finish(job, timeout=30.0)
        assert done.state is JobState.SUCCEEDED and len(done.attempts) == 1, done
        assert started == [done.attempts[0].id]
    finally:
        await h.stop()


async def test_a_re_attached_attempt_whose_retry_hand_off_raises_runs_exactly_once_more() -> None:
    """After a restart: recovery re-attaches the running attempt; it times out, retries, and the hand-off raises."""
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    job = await h.submit(command=("sleep", "1000"), timeout_s=5.0, max_retries=1)
    await h.until(lambda: job.id in h.cp.executor.launched)
    await h.stop()
    again = h.restarted([cpu_pool(max_count=1, step=1)])
    try:
        started = _launches(again)
        again.cp.executor.requeue = failing_once(again.cp.executor.requeue)  # type: ignore[method-assign]
        await again.start()
        assert again.cp.recovery is not None and again.cp.recovery.reattached == [job.id]
        done = await again.finish(job, timeout=120.0)
        assert done.state is JobState.FAILED and done.retries == 1 and len(done.attempts) == 2, done
        assert started == [done.attempts[1].id]  # the first attempt ran before the restart, once
    finally:
        await again.stop()
