"""Writes the store refuses during an outage: outcomes land once it is back, claims retry without spinning."""

from __future__ import annotations

from collections.abc import Sequence

from broker.errors import StoreError
from broker.jobs import Job, JobState
from tests.unit.harness import Harness, cpu_pool


async def test_an_outcome_written_during_a_store_outage_lands_when_the_store_is_back() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.submit(command=("sleep", "2"))
        await h.run_for(1.0)
        assert h.store.get(job.id).state is JobState.RUNNING  # type: ignore[union-attr]
        original_commit = h.store.commit
        refused: list[int] = []

        def down(writes: Sequence[tuple[Job, int]]) -> list[bool]:
            refused.append(len(writes))
            raise StoreError("injected: the database is restarting")

        h.store.commit = down  # type: ignore[method-assign]
        await h.run_for(20.0)  # the job ended at 2 s; its outcome could not be written meanwhile
        assert len(refused) >= 3 and h.store.get(job.id).state is JobState.RUNNING  # type: ignore[union-attr]
        h.store.commit = original_commit  # type: ignore[method-assign]
        await h.run_for(6.0)  # within one backoff step (at most 5 s)
        done = h.store.get(job.id)
        assert done is not None and done.state is JobState.SUCCEEDED and len(done.attempts) == 1
    finally:
        await h.stop()


async def test_a_store_that_refuses_commits_is_not_hammered_by_the_dispatcher() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        job = await h.queued_for_the_pod()
        original_commit = h.store.commit
        refused: list[int] = []

        def down(writes: Sequence[tuple[Job, int]]) -> list[bool]:
            if all(j.id != job.id for j, _ in writes):
                return original_commit(writes)  # the busy job's own writes
            refused.append(len(writes))
            raise StoreError("injected: the database is restarting")

        h.store.commit = down  # type: ignore[method-assign]
        await h.run_for(6.0)  # the pod is free after 1 s: the queued job's claim is refused from then on
        assert 1 <= len(refused) <= 4, len(refused)  # the fallback tick retries, not a busy loop
        assert h.store.get(job.id).state is JobState.QUEUED  # type: ignore[union-attr]
        h.store.commit = original_commit  # type: ignore[method-assign]
        done = await h.finish(job)
        assert done.state is JobState.SUCCEEDED and h.paths(done) == ["warm"] and len(done.attempts) == 1
    finally:
        await h.stop()


async def test_a_submit_stored_before_its_answer_was_lost_runs_when_the_caller_retries_it() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        calls = h.lose_first_insert_answer()
        try:
            await h.submit(idempotency_key="k1")
        except StoreError:
            pass
        again = await h.submit(idempotency_key="k1")  # the caller retries with the same key
        assert again.id == calls[0]
        done = await h.finish(again, timeout=30.0)
        assert done.state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_claim_committed_although_its_commit_failed_is_requeued_and_runs_once() -> None:
    h = await Harness([cpu_pool(max_count=1, step=1)]).start()
    try:
        job = await h.queued_for_the_pod()
        agent = next(iter(h.backend.agents.values()))
        launches_before = len(agent.launches)
        lost = h.lose_first_commit_answer(lambda j: j.id == job.id)  # the queued job's claim
        done = await h.finish(job, timeout=30.0)
        assert lost and done.state is JobState.SUCCEEDED
        assert [a.state.value for a in done.attempts] == ["LOST", "SUCCEEDED"] and done.retries == 0
        assert [r.attempt_id for r in agent.launches[launches_before:]] == [f"{job.id}:1"]  # :0 never ran
    finally:
        await h.stop()


async def test_an_outcome_whose_row_moved_under_it_is_applied_to_the_stored_row() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        await h.run_job(lease_tag="t", command=("true",))
        lost = h.lose_first_commit_answer()  # the job's first write after its bound insert: its start
        job = await h.submit(lease_tag="t", command=("sleep", "1"))
        done = await h.finish(job, timeout=30.0)
        assert lost and done.state is JobState.SUCCEEDED and len(done.attempts) == 1
    finally:
        await h.stop()
