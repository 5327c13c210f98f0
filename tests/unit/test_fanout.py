"""Fan-out: a batch is admitted whole or not at all, runs like single submits, and is watched as it ends; a
deep queue of like jobs costs a dispatch pass a claim per shape, not per job; the store writer groups."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from broker.claiming.admission import admit
from broker.claiming.queueing import JobQueue
from broker.claiming.storewriter import StoreWriter
from broker.claiming.tracker import Tracker
from broker.clock import VirtualClock
from broker.errors import InvalidRequest, NotFound, StoreError, UnknownPool
from broker.jobs import Job, JobSpec, JobState
from broker.ports.store import MemoryJobStore
from broker.tasks import Wakeable
from tests.unit.harness import Harness, cpu_pool


def specs(n: int, **fields: object) -> list[JobSpec]:
    return [JobSpec(pool=str(fields.get("pool", "cpu")), command=("sleep", "1"),
                    **{k: v for k, v in fields.items() if k != "pool"}) for _ in range(n)]  # type: ignore[arg-type]


async def test_a_batch_with_one_bad_item_stores_nothing_and_names_the_item() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        items = specs(3)
        items[1] = JobSpec(pool="nope", command=("true",))
        with pytest.raises(UnknownPool) as err:
            await h.cp.submit_many("alice", items)
        assert err.value.details["index"] == 1 and "jobs[1]" in err.value.message
        assert h.store.list_jobs(caller="alice") == []
        with pytest.raises(InvalidRequest):
            await h.cp.submit_many("alice", [])
    finally:
        await h.stop()


async def test_a_batch_runs_every_item_and_a_watch_hands_each_back_once_as_it_ends() -> None:
    h = await Harness([cpu_pool(max_count=2)]).start()
    try:
        done = await h.cp.submit_many("alice", specs(6))
        assert [created for _, created in done] == [True] * 6
        ids = [job.id for job, _ in done]
        watch = await h.cp.watch("alice", ids + ids[:1])  # a repeated id is watched once
        seen: list[Job] = []
        for _ in range(200):
            seen += await watch.ended(0.0)
            if not watch.pending:
                break
            await h.run_for(0.5)
        watch.close()
        assert sorted(j.id for j in seen) == sorted(ids) and {j.state for j in seen} == {JobState.SUCCEEDED}
        ends = [j.timings["finished_at"] for j in seen]
        assert ends == sorted(ends)  # in the order they ended
        again = await h.cp.watch("alice", ids)  # all ended: handed back at once
        assert len(await again.ended(0.0)) == 6 and not again.pending
    finally:
        await h.stop()


class CountingStore(MemoryJobStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def get(self, job_id: str) -> Job | None:
        self.reads.append("get")
        return super().get(job_id)

    def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        self.reads.append("get_many")
        return super().get_many(job_ids)


async def test_a_watch_of_jobs_no_longer_in_memory_reads_the_store_once() -> None:
    store = CountingStore()
    h = await Harness([cpu_pool(max_count=2)], store=store).start()
    try:
        ids = [job.id for job, _ in await h.cp.submit_many("alice", specs(5))]
        await h.until(lambda: all(job.terminal for job in store.get_many(ids)), 60)
        h.cp.book.finished.clear()  # as after a restart, or once they aged out of the book
        store.reads.clear()
        watch = await h.cp.watch("alice", ids)
        assert store.reads == ["get_many"]
        assert sorted(j.id for j in await watch.ended(0.0)) == sorted(ids) and not watch.pending
        with pytest.raises(NotFound):
            await h.cp.watch("bob", ids)
    finally:
        await h.stop()


async def test_a_watch_of_another_callers_job_is_not_found() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        (job, _), = await h.cp.submit_many("alice", specs(1))
        with pytest.raises(NotFound):
            await h.cp.watch("bob", [job.id])
    finally:
        await h.stop()


async def test_a_key_repeated_in_a_batch_or_across_batches_returns_the_first_job() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        items = [JobSpec(pool="cpu", command=("true",), idempotency_key=k) for k in ("a", "b", "a")]
        first = await h.cp.submit_many("alice", items)
        assert first[0][0].id == first[2][0].id and first[0][0].id != first[1][0].id
        again = await h.cp.submit_many("alice", items[:2])
        assert [j.id for j, _ in again] == [first[0][0].id, first[1][0].id]
        assert [created for _, created in again] == [False, False]
    finally:
        await h.stop()


async def test_a_deep_queue_of_like_jobs_costs_a_pass_one_claim_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    h = await Harness([cpu_pool(max_count=2, min_count=2)]).start()
    try:
        await h.run_for(1.0)
        claims = [0]
        real = Tracker.claim

        def counted(self: Tracker, *args: Any, **kw: Any) -> Any:
            claims[0] += 1
            return real(self, *args, **kw)

        monkeypatch.setattr(Tracker, "claim", counted)
        await h.cp.submit_many("alice", specs(300, lease_tag="a") + specs(100, lease_tag="b"))
        claims[0] = 0
        h.cp.dispatcher.dispatch_once()
        assert claims[0] <= 2 + 2  # two pods taken, then one claim per shape that came up short
        assert len(h.cp.dispatcher.queued) == 398
        assert h.cp.controller.demand["cpu"] == 398  # every queued job still counts toward the pool's demand
        reasons = h.cp.dispatcher.waiting_reason
        assert all(reasons.get(job_id) for job_id in h.cp.dispatcher.queued)
    finally:
        await h.stop()


def test_the_queue_keeps_dispatch_order_and_its_counts_as_jobs_come_and_go() -> None:
    q = JobQueue()
    pools = {"cpu": cpu_pool()}
    jobs = [admit(JobSpec(pool="cpu", command=("true",), priority=p, lease_tag=t), "alice", pools, 100.0 + i, None)
            for i, (p, t) in enumerate([(0, "a"), (5, "a"), (0, "b"), (5, "b")])]
    for job in jobs:
        q[job.id] = job
    assert [key[2] for key in q.in_order()] == [jobs[1].id, jobs[3].id, jobs[0].id, jobs[2].id]
    assert sum(q.shapes.values()) == 4 and len(q.sessions) == 2
    del q[jobs[1].id]
    q[jobs[3].id] = jobs[3]  # the same row again: nothing changes
    assert [key[2] for key in q.in_order()] == [jobs[3].id, jobs[0].id, jobs[2].id]
    assert sum(q.shapes.values()) == 3 and q.sessions[("alice", "default", "a")] == 1
    for job in jobs[2:]:
        del q[job.id]
    assert list(q.sessions) == [("alice", "default", "a")] and len(q) == 1


async def test_the_store_writer_commits_what_gathers_meanwhile_in_one_group() -> None:
    gate = threading.Event()
    groups: list[int] = []

    def commit(writes: Sequence[tuple[Job, int]], inserts: Sequence[Job]) -> tuple[list[bool], list[Job]]:
        gate.wait(5)
        groups.append(len(writes) + len(inserts))
        return [True] * len(writes), list(inserts)

    writer = StoreWriter(commit)
    loop = asyncio.get_running_loop()
    row = admit(JobSpec(pool="cpu", command=("true",)), "alice", {"cpu": cpu_pool()}, time.time(), None)
    first = loop.create_future()
    writer.put([(row, 0, first)])
    await asyncio.sleep(0.05)  # the first group is committing (held at the gate)
    later = [loop.create_future() for _ in range(5)]
    writer.put([(row, 0, f) for f in later[:4]] + [(row, None, later[4])])
    gate.set()
    assert await first is True and await asyncio.gather(*later) == [True] * 4 + [row]
    assert groups == [1, 5] and writer.commits == 2 and writer.writes == 6
    await asyncio.to_thread(writer.close)
    again = loop.create_future()
    writer.put([(row, 0, again)])  # a closed writer starts anew
    assert await again is True
    await asyncio.to_thread(writer.close)


async def test_a_failed_group_commit_reaches_every_writer_of_the_group() -> None:
    def commit(writes: Sequence[tuple[Job, int]], inserts: Sequence[Job]) -> tuple[list[bool], list[Job]]:
        raise StoreError("the database is down")

    writer = StoreWriter(commit)
    row = admit(JobSpec(pool="cpu", command=("true",)), "alice", {"cpu": cpu_pool()}, time.time(), None)
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    writer.put([(row, 0, f) for f in futures])
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, StoreError) for r in results)
    await asyncio.to_thread(writer.close)


async def test_a_nudge_waits_out_the_lazy_gap_unless_a_wake_comes_meanwhile() -> None:
    clock = VirtualClock()
    passes: list[float] = []
    loop = Wakeable(clock, 30.0, lambda: passes.append(clock.now()), min_gap=0.005, lazy_gap=0.05)
    task = asyncio.create_task(loop.run())

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    try:
        loop.wake()
        await settle()
        assert passes == [clock.now()]
        loop.nudge()  # less demand, a pod back from its reset: a pass within the lazy gap, not at once
        clock.advance(0.02)
        await settle()
        assert len(passes) == 1
        clock.advance(0.03)
        await settle()
        assert len(passes) == 2 and passes[1] - passes[0] == pytest.approx(0.05)
        loop.nudge()
        clock.advance(0.01)
        await settle()
        loop.wake()  # more demand meanwhile: the pass runs now, the min gap being over
        await settle()
        assert len(passes) == 3 and passes[2] == clock.now()
        clock.advance(1.0)
        await settle()
        assert len(passes) == 3  # nothing pending: no pass until the tick
    finally:
        task.cancel()


async def test_passes_woken_in_quick_succession_share_one_per_gap_and_a_lone_wake_runs_at_once() -> None:
    clock = VirtualClock()
    passes: list[float] = []
    loop = Wakeable(clock, 30.0, lambda: passes.append(clock.now()), min_gap=0.005)
    task = asyncio.create_task(loop.run())
    try:
        for _ in range(10):  # a fan-out: a wake every 0.5 ms
            loop.wake()
            for _ in range(5):
                await asyncio.sleep(0)
            clock.advance(0.0005)
        for _ in range(5):
            await asyncio.sleep(0)
        clock.advance(0.01)
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(passes) == 2 and passes[1] - passes[0] >= 0.005  # ten wakes, two passes
        clock.advance(1.0)
        loop.wake()
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(passes) == 3 and passes[2] == clock.now()  # after a quiet while: at once
    finally:
        task.cancel()
