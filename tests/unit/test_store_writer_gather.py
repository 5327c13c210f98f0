"""The store writer's gather: a group waits for more writes only while some are still on their way."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from broker.claiming import storewriter
from broker.claiming.admission import admit
from broker.claiming.storewriter import StoreWriter
from broker.jobs import Job, JobSpec, JobState
from tests.unit.harness import Harness, cpu_pool


def _writer(groups: list[int], gate: threading.Event) -> StoreWriter:
    def commit(writes: Sequence[tuple[Job, int]], inserts: Sequence[Job]) -> tuple[list[bool], list[Job]]:
        gate.wait(5)
        groups.append(len(writes) + len(inserts))
        return [True] * len(writes), list(inserts)

    return StoreWriter(commit)


def _row() -> Job:
    return admit(JobSpec(pool="cpu", command=("true",)), "alice", {"cpu": cpu_pool()}, time.time(), None)


async def test_a_group_gathers_until_the_writes_left_to_come_have_come(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storewriter, "GATHER_S", 30.0)  # only `settled` can end this gather within the test
    settled = [False]
    groups: list[int] = []
    gate = threading.Event()
    writer = _writer(groups, gate)
    writer.settled = lambda: settled[0]
    loop = asyncio.get_running_loop()
    first, second, third = (loop.create_future() for _ in range(3))
    writer.put([(_row(), 0, first)])
    await asyncio.sleep(0.05)  # the first group is committing, held at the gate
    writer.put([(_row(), 0, second)])  # came in meanwhile: the next group gathers, something still runs
    gate.set()
    assert await first is True
    await asyncio.sleep(0.05)
    assert not second.done()
    settled[0] = True  # the last write that was coming
    writer.put([(_row(), 0, third)])
    assert await asyncio.wait_for(asyncio.gather(second, third), 5) == [True, True]
    assert groups == [1, 2]
    await asyncio.to_thread(writer.close)


async def test_a_group_whose_writers_are_all_that_is_coming_commits_without_a_gather(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storewriter, "GATHER_S", 30.0)
    groups: list[int] = []
    gate = threading.Event()
    writer = _writer(groups, gate)
    writer.settled = lambda: True
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    writer.put([(_row(), 0, first)])
    await asyncio.sleep(0.05)
    writer.put([(_row(), 0, second)])
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [True, True]
    assert groups == [1, 1]
    await asyncio.to_thread(writer.close)


async def test_the_executor_is_settled_only_with_no_attempt_running_and_every_pod_back() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        executor = h.cp.executor
        assert executor.settled()
        job = await h.submit(command=("sleep", "2"))
        await h.run_for(1.0)
        assert h.store.get(job.id).state is JobState.RUNNING and not executor.settled()  # type: ignore[union-attr]
        await h.run_for(2.0)
        assert h.store.get(job.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
        assert executor.settled() and executor.returning == 0
    finally:
        await h.stop()
