"""The job book serializes writes to one job, first come first served, without a lock object per job."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.claiming.jobbook import JobBook
from broker.clock import VirtualClock
from broker.jobs import Job, JobSpec, JobState
from broker.ports.store import MemoryJobStore


class BlockingStore(MemoryJobStore):
    """The memory store behind a worker thread, as the SQL store is: every commit is a real await."""

    blocking = True  # type: ignore[misc]


def _book() -> tuple[JobBook, Job]:
    store = BlockingStore()
    job = store.insert(
        Job(
            id="j-1",
            caller="alice",
            spec=JobSpec(pool="cpu", command=("true",)),
            state=JobState.QUEUED,
            version=1,
        )
    )
    book = JobBook(store, VirtualClock())
    book.adopt(job)
    return book, job


def _stamp(seen: list[int], name: str) -> Any:
    def change(current: Job) -> Job:
        seen.append(current.version)
        return current.stamp(**{name: float(current.version)})

    return change


async def test_writes_to_one_job_take_turns_each_seeing_the_last_commit() -> None:
    book, _ = _book()
    seen: list[int] = []
    results = await asyncio.gather(*(book.write("j-1", _stamp(seen, "claimed_at")) for _ in range(3)))
    assert seen == [1, 2, 3]  # in arrival order, each on the row the previous writer committed
    assert [r.version for r in results if r is not None] == [2, 3, 4]
    assert book._turns == {}  # nothing per job is kept once nobody writes it


async def test_a_writer_cancelled_while_it_waits_does_not_hold_up_the_next() -> None:
    book, _ = _book()
    seen: list[int] = []
    first = asyncio.ensure_future(book.write("j-1", _stamp(seen, "claimed_at")))
    second = asyncio.ensure_future(book.write("j-1", _stamp(seen, "committed_at")))
    third = asyncio.ensure_future(book.write("j-1", _stamp(seen, "handed_off_at")))
    await asyncio.sleep(0)  # all three arrived: the first writes, two wait
    second.cancel()
    done = await asyncio.wait_for(asyncio.gather(first, second, third, return_exceptions=True), 5.0)
    assert isinstance(done[1], asyncio.CancelledError)
    assert seen == [1, 2]  # the cancelled change never ran
    assert book.live["j-1"].version == 3 and "committed_at" not in book.live["j-1"].timings
    assert book._turns == {}


async def test_a_writer_cancelled_as_its_turn_comes_hands_the_turn_on() -> None:
    book, _ = _book()
    seen: list[int] = []
    first = asyncio.ensure_future(book.write("j-1", _stamp(seen, "claimed_at")))
    second = asyncio.ensure_future(book.write("j-1", _stamp(seen, "committed_at")))
    third = asyncio.ensure_future(book.write("j-1", _stamp(seen, "handed_off_at")))
    await asyncio.sleep(0)
    hand_on = book._pass_turn

    def then_cancel_the_next(job_id: str) -> None:
        hand_on(job_id)
        if not second.done():
            second.cancel()  # its turn is set but it has not run yet

    book._pass_turn = then_cancel_the_next  # type: ignore[method-assign]
    done = await asyncio.wait_for(asyncio.gather(first, second, third, return_exceptions=True), 5.0)
    assert isinstance(done[1], asyncio.CancelledError)
    assert seen == [1, 2]  # the third wrote after the first: the turn did not die with the second
    assert book._turns == {}
