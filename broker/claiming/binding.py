"""Binding a claimed job: its claim committed durably (the job RUNNING on its pods, a new attempt made), then the job
handed to the executor; a claim whose commit loses gives its pods back.

Two ways in. A queued job a dispatcher pass claimed commits its claim as a version-checked write of its QUEUED row
(`bind`). A new job claimed at its submit is inserted already bound, so its insert's commit is its claim's
(`insert`): one commit before the hand-off instead of two. Either way no user code runs before the commit, and
only a bind whose own commit stored its attempt starts it. When a commit's answer is lost (a database restarting)
the row may have landed anyway: a queued job's row is read back and re-queued when it was stored RUNNING and never
launched; a submit's is remembered (`unsure`) and re-queued when the caller's retry finds it by its key.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from broker.claiming.jobbook import Abort, JobBook
from broker.claiming.tracker import Lease, Tracker
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.jobs import Acquisition, Attempt, AttemptState, ErrorClass, Job, JobState, attempt_id, transition
from broker.stats import Stats
from broker.tasks import Supervisor
from broker.warmth.pooling import PoolController

if TYPE_CHECKING:
    from broker.running.executing import Executor

log = logging.getLogger("firepool.dispatching")


class Binder:
    def __init__(self, *, clock: Clock, book: JobBook, tracker: Tracker, controller: PoolController,
                 tasks: Supervisor, stats: Stats, adopt: Callable[[Job], bool], wake: Callable[[], None]) -> None:
        """`adopt` queues a job's QUEUED row in the dispatcher (False when it takes it not); `wake` asks for a pass."""
        self.clock = clock
        self.book = book
        self.tracker = tracker
        self.controller = controller
        self.tasks = tasks
        self.stats = stats
        self.adopt = adopt
        self.wake = wake
        self.executor: Executor | None = None
        self.binding: set[str] = set()
        """Jobs claimed whose claim is committing now."""
        self.unsure: set[str] = set()
        """Jobs whose bound insert failed: the row may have landed RUNNING, its attempt never launched."""

    async def bind(self, job_id: str, lease: Lease, claimed_at: float) -> None:
        """Commit a queued job's claim durably, then hand the job to the executor; undo the claim if it loses."""
        made: list[Job] = []

        def bind(job: Job) -> Job:
            if job.state is not JobState.QUEUED:
                raise Abort
            made.append(self.bound(job, lease, claimed_at))
            return made[-1]

        store_failed = False
        try:
            committed = await self.book.write(job_id, bind)
        except FirepoolError as exc:
            log.warning("committing %s failed, pods returned, job stays queued: %s", job_id, exc)
            committed, store_failed = None, True
        if committed is None or committed is not (made[-1] if made else None):
            # Lost: a version race or a store error (None), or the row was no longer QUEUED (a row that is
            # RUNNING now is another attempt's, never this claim's to start or to re-queue).
            self._unbind(job_id)
            current = self.book.live.get(job_id)
            if committed is None and current is not None and current.state is JobState.RUNNING \
                    and self.executor is not None and job_id not in self.executor.launched:
                current = await self._requeue_unlaunched(current)
            if current is not None:
                self.adopt(current)
            if not store_failed:
                self.wake()  # a lost race: the pods may suit another job now
            # A store that is down is tried again by the next event or the fallback tick, not at once:
            # waking here spun claim -> failed commit -> claim hundreds of times a second.
            return
        self.binding.discard(job_id)
        await self._start(committed, lease)

    async def insert(self, job: Job, lease: Lease, claimed_at: float, insert: Callable[[Job], Awaitable[Job]]) -> Job:
        """Insert a new job claimed at its submit already bound, and start it. Returns what `insert` stored: the job,
        or its idempotency key's first job (this claim is then undone). Raises what `insert` raised."""
        self.binding.add(job.id)
        try:
            stored = await insert(self.bound(job, lease, claimed_at))
        except BaseException:
            self._unbind(job.id)  # the store failed: no wake (see `bind`), and the submit fails
            self.unsure.add(job.id)  # stored anyway if only the answer was lost: never started here
            raise
        if stored.id != job.id:
            self._unbind(job.id)
            self.wake()  # the pods may suit another job now
            return stored
        self.binding.discard(job.id)
        self.tasks.spawn(f"start {job.id}", self._start(stored, lease))
        return stored

    def landed(self, job: Job) -> bool:
        """`job` is the row a bound insert stored although its answer was lost: re-queue it (True), or it is not."""
        if job.id not in self.unsure or job.state is not JobState.RUNNING:
            return False
        self.unsure.discard(job.id)
        self.tasks.spawn(f"requeue {job.id}", self._requeue_landed(job))
        return True

    def bound(self, job: Job, lease: Lease, claimed_at: float) -> Job:
        """The job as its claim commits it: RUNNING on the lease's pods, with a new attempt."""
        now = self.clock.now()
        names = tuple(p.name for p in lease.pods)
        n = len(job.attempts)  # every execution gets a new id, retries and recovery re-queues alike
        attempt = Attempt(id=attempt_id(job.id, n), job_id=job.id, n=n, pods=names)
        return transition(job, JobState.RUNNING, now, attempts=job.attempts_with(attempt), pods=names,
                          acquisition=tuple(Acquisition(p.name, p.path, p.reason) for p in lease.pods),
                          timings={"claimed_at": claimed_at, "committed_at": now})

    def _unbind(self, job_id: str) -> None:
        """A claim whose commit did not store it: its pods go back."""
        self.binding.discard(job_id)
        self.tracker.unclaim(job_id, self.clock.now())

    async def _start(self, committed: Job, lease: Lease) -> None:
        """Hand a job whose claim committed to the executor."""
        self.controller.forget_single_use(committed.id)
        assert self.executor is not None
        for p in lease.pods:
            self.stats.acquisitions[(p.pool, p.path)] += 1
        try:
            await self.executor.start(committed, lease)
        except Exception as exc:  # a bug on the launch path must not leave the job RUNNING for ever
            log.exception("running %s failed inside the broker; ending its attempt", committed.id)
            await self.executor.abort(committed, lease, exc)

    async def _requeue_landed(self, job: Job) -> None:
        requeued = await self._requeue_unlaunched(job)
        if requeued is not None and self.adopt(requeued):
            self.wake()

    async def _requeue_unlaunched(self, job: Job) -> Job | None:
        """A row RUNNING that no executor of ours launched: an earlier commit of ours landed although the
        store's answer was lost (a database restarting). Its attempt never ran: it is lost, the job queued."""
        now = self.clock.now()

        def requeue(current: Job) -> Job:
            attempt = current.current_attempt
            if current.state is not JobState.RUNNING or attempt is None or attempt.state is not AttemptState.LAUNCHING:
                raise Abort
            lost = attempt.move(AttemptState.LOST, finished_at=now, error_class=ErrorClass.POD_LOST,
                                message="its commit's answer was lost; it never ran")
            return transition(current.with_attempt(lost), JobState.QUEUED, now, pods=())

        try:
            requeued = await self.book.write(job.id, requeue)
        except FirepoolError as exc:
            log.warning("re-queueing %s after a lost commit answer failed: %s", job.id, exc)
            return None
        if requeued is not None and requeued.state is JobState.QUEUED:
            log.warning("%s was committed RUNNING although its commit failed; re-queued (it never ran)", job.id)
        return requeued
