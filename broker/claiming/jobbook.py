"""The job book: live jobs in memory, their versioned writes, group commit, and change notifications.

Every write to a job row goes through `write(job_id, change)`: writes to one job are serialized, the
change function sees the latest committed row, and the store applies it only if the row still has
the version the change was computed from. Writes from different jobs that arrive together share one
store transaction (group commit, on the store writer's thread), so a busy SQL store pays one commit for many
jobs; a new job joins the same transaction, and its submit returns only once that transaction committed (a repeated idempotency key returns
the caller's first job and stores nothing: the store resolves it, see `JobStore.commit_group`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from broker.claiming.storewriter import StoreWriter
from broker.clock import Clock
from broker.jobs import Job
from broker.ports.store import JobStore

T = TypeVar("T")

FINISHED_KEPT = 4096


class Abort(Exception):
    """Raised by a change function to leave the row as it is."""


class JobBook:
    def __init__(self, store: JobStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.live: dict[str, Job] = {}
        """Non-terminal jobs, as last committed."""
        self._turns: dict[str, deque[asyncio.Future[None]]] = {}
        """job id -> the writers waiting behind the one writing it now; an entry exists only while one writes."""
        self._changed: dict[str, asyncio.Event] = {}
        self.finished: OrderedDict[str, Job] = OrderedDict()
        """The last FINISHED_KEPT jobs this book saw turn terminal: a terminal row never changes again, so a
        client polling for its result reads it here, not from the store."""
        self.writer = StoreWriter(lambda writes, inserts: self.store.commit_group(writes, inserts))
        """Runs the group commits of a blocking store on its own thread (broker.claiming.storewriter)."""
        self._enders: dict[str, list[asyncio.Queue[Job]]] = {}
        """job id -> the queues of the watches (broker.intake.Watch) that want it once it is terminal."""

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call, on a worker thread when the store blocks."""
        if self.store.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def insert(self, job: Job) -> Job:
        stored: Job
        if self.store.blocking:  # group-commit it; the store answers with the job it holds for it
            stored = await self._enqueue(job, None)
        else:
            stored = await self.io(self.store.insert, job)
        if not stored.terminal:
            self.live.setdefault(stored.id, stored)
        return stored

    async def insert_many(self, jobs: list[Job]) -> list[Job]:
        """Insert a batch in one group commit (one store transaction); per job, the job stored for it."""
        if not self.store.blocking:
            return [await self.insert(job) for job in jobs]
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Job]] = [loop.create_future() for _ in jobs]
        self.writer.put([(job, None, future) for job, future in zip(jobs, futures, strict=True)])
        stored = list(await asyncio.gather(*futures))  # every future's error is retrieved, the first raised
        for job in stored:
            if not job.terminal:
                self.live.setdefault(job.id, job)
        return stored

    async def get(self, job_id: str) -> Job | None:
        job = self.live.get(job_id) or self.finished.get(job_id)
        if job is not None:
            return job
        return await self.io(self.store.get, job_id)

    async def get_many(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The jobs of these ids that exist, by id: those in memory, and the rest in one store call."""
        found: dict[str, Job] = {}
        missing = []
        for job_id in job_ids:
            job = self.live.get(job_id) or self.finished.get(job_id)
            if job is not None:
                found[job_id] = job
            else:
                missing.append(job_id)
        if missing:
            found.update((job.id, job) for job in await self.io(self.store.get_many, missing))
        return found

    def adopt(self, job: Job) -> None:
        """Take a job read from the store as the live copy (recovery, lost races)."""
        if job.terminal:
            self.live.pop(job.id, None)
            self.finished[job.id] = job
            if len(self.finished) > FINISHED_KEPT:
                self.finished.popitem(last=False)
        else:
            self.live[job.id] = job
        event = self._changed.pop(job.id, None)
        if event is not None:
            event.set()
        if job.terminal and self._enders:
            for queue in self._enders.pop(job.id, ()):
                queue.put_nowait(job)

    def watch_end(self, job_id: str, queue: asyncio.Queue[Job]) -> None:
        """Put the job into `queue` once it is terminal (once: the watch is dropped then)."""
        self._enders.setdefault(job_id, []).append(queue)

    def unwatch_end(self, job_id: str, queue: asyncio.Queue[Job]) -> None:
        queues = self._enders.get(job_id)
        if queues is not None and queue in queues:
            queues.remove(queue)
            if not queues:
                del self._enders[job_id]

    async def write(self, job_id: str, change: Callable[[Job], Job],
                    queued: Callable[[], None] | None = None) -> Job | None:
        """Apply `change` to the latest row and commit it version-checked.

        Returns the committed job, the unchanged job when `change` aborts or returns its input, or None
        when another writer moved the row first (the book then adopts the row the store holds). `queued` is
        called once the row is handed to the store: any write handed over after it commits in the same
        transaction or a later one.
        """
        waiting = self._turns.get(job_id)
        if waiting is None:  # the usual case: nobody writes this job now; no lock object, no future
            self._turns[job_id] = deque()
        else:  # FIFO behind the writer now writing it, as an asyncio.Lock would queue
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiting.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if not turn.cancelled():
                    self._pass_turn(job_id)  # it was handed the turn as it was cancelled: hand it on
                raise
        try:
            current = self.live.get(job_id) or self.finished.get(job_id)  # no coroutine for the usual case
            if current is None:
                current = await self.io(self.store.get, job_id)
            if current is None:
                return None
            try:
                updated = change(current)
            except Abort:
                return current
            if updated is current:
                return current
            if await self._commit(updated, current.version, queued):
                self.adopt(updated)
                return updated
            fresh = await self.io(self.store.get, job_id)
            if fresh is not None:
                self.adopt(fresh)
            return None
        finally:
            self._pass_turn(job_id)

    def _pass_turn(self, job_id: str) -> None:
        """The writer of `job_id` is done: wake the next one still waiting, or leave no entry behind."""
        waiting = self._turns[job_id]
        while waiting:
            turn = waiting.popleft()
            if not turn.done():  # a cancelled waiter is skipped
                turn.set_result(None)
                return
        del self._turns[job_id]

    async def _commit(self, job: Job, expected: int, queued: Callable[[], None] | None = None) -> bool:
        if not self.store.blocking:
            won = self.store.commit([(job, expected)])[0]
            if queued is not None:
                queued()
            return won
        result: bool = await self._enqueue(job, expected, queued)
        return result

    async def _enqueue(self, job: Job, expected: int | None, queued: Callable[[], None] | None = None) -> Any:
        """Wait for the group commit: a write's win (bool), or the job an insert stored (or found) for it."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.writer.put([(job, expected, future)])
        if queued is not None:
            queued()
        return await future

    async def close(self) -> None:
        """Let the writes already handed over commit, then stop the store writer."""
        await asyncio.to_thread(self.writer.close)

    async def wait_change(self, job_id: str, timeout: float) -> None:
        """Wait until the job's row changes (or `timeout` passes)."""
        event = self._changed.get(job_id)
        if event is None:
            event = self._changed[job_id] = asyncio.Event()
        await self.clock.wait(event, timeout)
