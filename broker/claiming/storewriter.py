"""The job book's store writer: one thread that runs every group commit of a blocking (SQL) store.

The event loop never waits on the database, and it hands writes over without a worker-pool hop per commit
(`asyncio.to_thread` cost a thread-pool submit, a wrapped future and a wake-up per commit, ~70 futex calls a
job): the writes of one loop iteration (every task woken together) are handed over at its end under one
lock, and the writer is signalled only when it sleeps. While it commits one group the next one gathers, so a
busy broker pays one hand-off and one commit for many jobs, and a group's outcomes come back in one call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker.jobs import Job

log = logging.getLogger("firepool.jobbook")

GATHER_S = 0.010
"""While writes keep coming (some arrived while the last group committed), a group waits this long for more
before it commits: a fan-out's jobs share commits instead of paying one each. A write that found the writer
asleep (a lone job, or one job at a time: each write waits for the one before) never waits. A commit costs
~1 ms of the writer's CPU whatever it carries, plus its fsync; at 1 ms of gather a 16-pod fan-out still paid
0.8 commits a job, at 10 ms 0.2, which cut the broker's CPU a batched job by ~30 % and raised its jobs/s
(docs/benchmarks.md). Under load a transition is stored up to this much later; an idle broker's never is. A group
whose writers are all that is left to come (`StoreWriter.settled`) does not wait: on a small pool every pod would
idle through the gather, waiting for writes that no running job will make."""
GATHER_MAX = 64
"""Writes that end the wait at once."""

Commit = Callable[[Sequence[tuple[Job, int]], Sequence[Job]], tuple[list[bool], list[Job]]]
"""`JobStore.commit_group`: writes (job, expected version) and inserts -> (the writes' wins, the jobs stored)."""
Item = tuple[Job, int | None, asyncio.Future[Any]]
"""A write (job, expected version) or an insert (job, None), and the future its outcome goes to."""


class StoreWriter:
    def __init__(self, commit: Commit) -> None:
        self._commit = commit
        self._outbox: list[Item] = []
        """Writes of the loop's current iteration, not yet handed to the thread."""
        self._handing_over = False
        self._pending: list[Item] = []
        self._cond = threading.Condition(threading.Lock())
        self._asleep = False
        self._gathering = False
        self._closed = False
        self.commits = 0
        """Group commits run (one store transaction each)."""
        self.writes = 0
        """Writes and inserts they carried."""
        self.cpu_s = 0.0
        """CPU seconds the writer's thread spent committing."""
        self.settled: Callable[[], bool] = _never
        """True when no write is on its way (no attempt runs that will end with one): a gathering group commits at
        once. A hint, read on the loop at each hand-over and on the writer's thread as a group would start to
        gather, so it must be cheap and safe to read from there; a wrong answer costs a commit or a wait only."""
        self._thread: threading.Thread | None = None

    def put(self, items: Sequence[Item]) -> None:
        """Queue writes for the next group (called on the event loop). They are handed over once the loop's
        current iteration has run, so the writes of every task woken together go in one group."""
        self._outbox.extend(items)
        if not self._handing_over:
            self._handing_over = True
            asyncio.get_running_loop().call_soon(self._hand_over)

    def _hand_over(self) -> None:
        self._handing_over = False
        outbox, self._outbox = self._outbox, []
        with self._cond:
            self._pending.extend(outbox)
            if self._asleep or (self._gathering and (len(self._pending) >= GATHER_MAX or self.settled())):
                self._cond.notify()
            elif self._thread is None:
                self._thread = threading.Thread(target=self._run, name="firepool store writer", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Let the thread commit what is queued and end (a later `put` starts a new one)."""
        with self._cond:
            thread = self._thread
            if thread is None:
                return
            self._closed = True
            self._cond.notify()
        thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                busy = bool(self._pending) and self.commits > 0  # writes came in while the last group committed
                while not self._pending and not self._closed:
                    self._asleep = True
                    self._cond.wait()
                    self._asleep = False
                if not self._pending:  # closed, and nothing left to commit
                    self._thread, self._closed = None, False
                    return
                if busy and len(self._pending) < GATHER_MAX and not self.settled():
                    self._gathering = True
                    self._cond.wait(GATHER_S)
                    self._gathering = False
                batch, self._pending = self._pending, []
            writes = [(job, expected) for job, expected, _ in batch if expected is not None]
            inserts = [job for job, expected, _ in batch if expected is None]
            outcome: tuple[list[bool], list[Job]] | BaseException
            cpu = time.thread_time()
            try:
                outcome = self._commit(writes, inserts)
            except Exception as exc:  # the store's own error tree; every writer of the group sees it
                outcome = exc
            self.cpu_s += time.thread_time() - cpu
            self.commits += 1
            self.writes += len(batch)
            try:
                batch[0][2].get_loop().call_soon_threadsafe(_settle, batch, outcome)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                log.debug("a group commit finished after its event loop closed")


def _never() -> bool:
    return False


def _settle(batch: list[Item], outcome: tuple[list[bool], list[Job]] | BaseException) -> None:
    """Hand each writer its outcome: a write's win (bool), or the job an insert stored (or found) for it."""
    if isinstance(outcome, BaseException):
        for _, _, future in batch:
            if not future.done():
                future.set_exception(outcome)
        return
    won, stored = iter(outcome[0]), iter(outcome[1])
    for _, expected, future in batch:
        result = next(stored) if expected is None else next(won)
        if not future.done():
            future.set_result(result)
