"""Taking jobs in: admission, the package check, one group commit, the hand-off to the dispatcher.

A single submit that finds nothing queued and an idle pod for it is claimed before it is stored, and stored bound:
its insert's commit is its claim's, one commit before the hand-off instead of two (`Dispatcher.insert_bound`).

A batch (`submit_many`) is the same path for many jobs at once: every item is admitted before any is stored
(all or nothing: the first bad item's error names its `index`), then all of them join one store
transaction, then each is handed to the dispatcher as a single submit's would be. Owner holds, tags, gangs,
single use and idempotency keys work per item (a key repeated within the batch resolves to the first job,
as across requests). `watch` follows a set of a caller's jobs and hands each one over once it is terminal,
in the order they end, so a client collects a thousand results over one stream instead of a request each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Protocol

from broker.claiming.admission import admit
from broker.claiming.jobbook import JobBook
from broker.clock import Clock
from broker.errors import FirepoolError, InvalidRequest, NotFound, PackageError
from broker.fleet.quotas import QuotaTree
from broker.jobs import Job, JobSpec
from broker.pools import Catalog
from broker.running.packages import PackageStore

MAX_BATCH = 1000
"""Jobs in one `POST /v1/jobs:batch`: a bigger fan-out is several batches (the SDK splits it)."""
MAX_WATCH = 10_000
"""Job ids one `POST /v1/jobs:watch` follows."""


class Queue(Protocol):
    """The dispatcher as the intake sees it: where admitted jobs go, and which it already holds."""

    @property
    def queued(self) -> Collection[str]: ...

    @property
    def binding(self) -> Collection[str]: ...

    def enqueue(self, job: Job) -> None: ...

    async def insert_bound(self, job: Job, insert: Callable[[Job], Awaitable[Job]]) -> Job | None: ...


class Ceilings(Protocol):
    """The pool controller's reading of how many pods one node (domain) of each pool holds, for admission."""

    @property
    def set_ceilings(self) -> Mapping[str, Mapping[str, int]]: ...

    @property
    def set_largest(self) -> Mapping[str, Mapping[str, str]]: ...


class Intake:
    def __init__(self, *, clock: Clock, catalog: Catalog, book: JobBook, queue: Queue, ceilings: Ceilings,
                 quota_tree: Callable[[], QuotaTree | None], runs_images: bool,
                 packages: PackageStore | None) -> None:
        self.clock = clock
        self.catalog = catalog
        self.book = book
        self.queue = queue
        self.ceilings = ceilings
        self.quota_tree = quota_tree
        self.runs_images = runs_images
        self.packages = packages

    def _admit(self, caller: str, spec: JobSpec) -> Job:
        return admit(spec, caller, self.catalog.pools, self.clock.now(), self.quota_tree(),
                     runs_images=self.runs_images, set_ceilings=self.ceilings.set_ceilings,
                     set_largest=self.ceilings.set_largest)

    async def submit(self, caller: str, spec: JobSpec) -> tuple[Job, bool]:
        """Admit and store a job; (job, created). The same idempotency key returns the first job."""
        job = self._admit(caller, spec)
        await self._check_packages(caller, [spec])
        stored = await self.queue.insert_bound(job, self.book.insert)  # claimed and stored in one commit
        if stored is None:  # no pod for it now: stored QUEUED, the dispatcher claims it
            stored = await self.book.insert(job)
        return stored, self._hand_off(job, stored)

    async def submit_many(self, caller: str, specs: Sequence[JobSpec]) -> list[tuple[Job, bool]]:
        """Admit every item, then store them in one transaction: [(job, created)] in the items' order."""
        if not 1 <= len(specs) <= MAX_BATCH:
            raise InvalidRequest(f"a batch holds 1 to {MAX_BATCH} jobs, not {len(specs)}",
                                 {"field": "jobs", "limit": MAX_BATCH})
        jobs = []
        for index, spec in enumerate(specs):
            try:
                jobs.append(self._admit(caller, spec))
            except FirepoolError as exc:
                raise _at(exc, index) from None
        await self._check_packages(caller, specs)
        stored = await self.book.insert_many(jobs)
        return [(s, self._hand_off(j, s)) for j, s in zip(jobs, stored, strict=True)]

    def _hand_off(self, job: Job, stored: Job) -> bool:
        """Give a stored job to the dispatcher; whether it was created (not an earlier job of its key)."""
        created = stored.id == job.id
        if created or (stored.id not in self.queue.queued and stored.id not in self.queue.binding):
            # A retried submit whose first insert landed although its answer was lost (a database
            # restarting) finds its job in the store but never handed to the dispatcher (which takes only
            # a QUEUED row, or one its own bound insert stored unknowingly).
            self.queue.enqueue(self.book.live.get(stored.id, stored))
        return created

    async def _check_packages(self, caller: str, specs: Sequence[JobSpec]) -> None:
        """A job may name only a package its caller uploaded: refused at submit, not at launch."""
        first: dict[str, int] = {}
        for index, spec in enumerate(specs):
            digest = spec.extra.get("package")
            if digest is not None:
                first.setdefault(str(digest), index)
        for digest, index in first.items():
            error = None
            if self.packages is None:
                error = PackageError("this broker has no package store", {"package": digest})
            elif not await asyncio.to_thread(self.packages.exists, caller, digest):
                error = PackageError(f"no package {digest}: upload it with PUT /v1/packages/{digest} first",
                                     {"package": digest})
            if error is not None:
                raise error if len(specs) == 1 else _at(error, index)

    async def owned(self, caller: str, job_id: str) -> Job:
        """The caller's job; NotFound for an unknown id and for another caller's alike."""
        return _mine(caller, job_id, await self.book.get(job_id) if _plausible_id(job_id) else None)

    async def watch(self, caller: str, ids: Sequence[str]) -> Watch:
        """Follow the caller's jobs `ids` (NotFound for any that is not theirs, before anything is followed)."""
        if not 1 <= len(ids) <= MAX_WATCH:
            raise InvalidRequest(f"watch 1 to {MAX_WATCH} jobs, not {len(ids)}", {"field": "ids", "limit": MAX_WATCH})
        wanted = list(dict.fromkeys(ids))
        found = await self.book.get_many([job_id for job_id in wanted if _plausible_id(job_id)])
        return Watch(self.book, [_mine(caller, job_id, found.get(job_id)) for job_id in wanted])


class Watch:
    """Jobs of a set as they end: `ended()` waits for the next ones (all that ended meanwhile, in order)."""

    def __init__(self, book: JobBook, jobs: Sequence[Job]) -> None:
        self.book = book
        self.pending = {job.id for job in jobs}
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._ready: list[Job] = []
        for read in jobs:  # no await from here on: a job ending now is either seen terminal here or queued
            job = book.live.get(read.id) or book.finished.get(read.id) or read
            if job.terminal:
                self._ready.append(job)
            else:
                book.watch_end(job.id, self._queue)

    async def ended(self, timeout: float) -> list[Job]:
        """The jobs that ended since the last call, waiting up to `timeout` for the first: [] if none did."""
        ready, self._ready = self._ready, []
        if not ready and self.pending:
            try:
                async with asyncio.timeout(timeout):
                    ready.append(await self._queue.get())
            except TimeoutError:
                return []
        return self._mine(ready)

    def ended_now(self) -> list[Job]:
        """The jobs that ended since the last call, without waiting."""
        ready, self._ready = self._ready, []
        return self._mine(ready)

    def _mine(self, ready: list[Job]) -> list[Job]:
        while not self._queue.empty():
            ready.append(self._queue.get_nowait())
        ended = [job for job in ready if job.id in self.pending]
        self.pending.difference_update(job.id for job in ended)
        return ended

    def close(self) -> None:
        for job_id in self.pending:
            self.book.unwatch_end(job_id, self._queue)


def _mine(caller: str, job_id: str, job: Job | None) -> Job:
    """The job when it is the caller's; NotFound for an unknown id and for another caller's alike."""
    if job is None or job.caller != caller:
        raise NotFound(f"no job {job_id!r}", {"job": job_id})
    return job


def _plausible_id(job_id: str) -> bool:
    """Job ids are short and alphanumeric: anything else cannot name a job (and is not sent to the store)."""
    return 1 <= len(job_id) <= 64 and job_id.isalnum()


def _at(exc: FirepoolError, index: int) -> FirepoolError:
    """The error of one batch item, naming its index."""
    exc.message = f"jobs[{index}]: {exc.message}"
    exc.args = (exc.message,)
    exc.details = {**exc.details, "index": index}
    return exc
