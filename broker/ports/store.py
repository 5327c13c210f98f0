"""The job store port: durable jobs and attempts, every write conditional on the row version.

`commit` is the one write path after insert. Each write names the version it expects; a write whose row
moved on loses and the store reports it as False, never as an exception. Several writes in one call
share one transaction (group commit), each still checked on its own; new jobs may ride in the same
transaction (`inserts`), so a busy broker pays no commit of its own per submit. A new job whose idempotency key
its caller already used (before, or earlier in the batch) is not stored: the call answers with the first job.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from broker.events import Event
from broker.jobs import Job, JobState


class JobStore(Protocol):
    blocking: bool
    """True when calls do I/O and belong on a worker thread."""

    def insert(self, job: Job) -> Job:
        """Store a new job; when the caller already has a job with this idempotency key, return that one."""
        ...

    def get(self, job_id: str) -> Job | None: ...

    def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        """The jobs of these ids that exist, in any order (unknown ids are left out)."""
        ...

    def list_jobs(self, *, caller: str | None = None, states: Iterable[JobState] | None = None,
                  limit: int = 100, before: str | None = None, pool: str | None = None,
                  lease_tag: str | None = None) -> list[Job]:
        """Newest first; `before` pages by job id."""
        ...

    def commit(self, writes: Sequence[tuple[Job, int]], inserts: Sequence[Job] = ()) -> list[bool]:
        """`commit_group`'s wins of the writes."""
        ...

    def commit_group(self, writes: Sequence[tuple[Job, int]],
                     inserts: Sequence[Job] = ()) -> tuple[list[bool], list[Job]]:
        """Write each job iff its row still has the expected version, and store `inserts`; one transaction for all.
        Returns the writes' wins and, per insert, the job stored for it: itself, or — when the caller already
        has a job with its idempotency key, or an earlier insert of the batch has it — that first job, and the
        insert stores nothing. A duplicate id fails the whole call."""
        ...

    def add_events(self, events: Sequence[Event]) -> list[Event]:
        """Append events (broker.events); returns them with the ids the store gave them, in order."""
        ...

    def list_events(self, *, after_id: int | None = None, since: float | None = None, caller: str | None = None,
                    limit: int = 100) -> list[Event]:
        """Oldest first: ids above `after_id`, at or after `since`, about `caller` when given."""
        ...

    def close(self) -> None: ...


class MemoryJobStore:
    """The in-memory store for unit tests and the simulator; same semantics as the SQL store."""

    blocking = False

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._by_key: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self.commits = 0
        self._events: list[Event] = []

    def insert(self, job: Job) -> Job:
        with self._lock:
            key = job.spec.idempotency_key
            if key is not None and (job.caller, key) in self._by_key:
                return self._jobs[self._by_key[(job.caller, key)]]
            if job.id in self._jobs:
                raise ValueError(f"duplicate job id {job.id}")
            self._jobs[job.id] = job
            if key is not None:
                self._by_key[(job.caller, key)] = job.id
            return job

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        return [self._jobs[i] for i in dict.fromkeys(job_ids) if i in self._jobs]

    def list_jobs(self, *, caller: str | None = None, states: Iterable[JobState] | None = None,
                  limit: int = 100, before: str | None = None, pool: str | None = None,
                  lease_tag: str | None = None) -> list[Job]:
        wanted = set(states) if states is not None else None
        jobs = sorted(self._jobs.values(), key=lambda j: j.id, reverse=True)
        return [j for j in jobs
                if (caller is None or j.caller == caller) and (wanted is None or j.state in wanted)
                and (before is None or j.id < before) and (pool is None or j.spec.pool == pool)
                and (lease_tag is None or j.spec.lease_tag == lease_tag)][:limit]

    def commit(self, writes: Sequence[tuple[Job, int]], inserts: Sequence[Job] = ()) -> list[bool]:
        return self.commit_group(writes, inserts)[0]

    def commit_group(self, writes: Sequence[tuple[Job, int]],
                     inserts: Sequence[Job] = ()) -> tuple[list[bool], list[Job]]:
        with self._lock:
            if len({j.id for j in inserts}) < len(inserts) or any(j.id in self._jobs for j in inserts):
                raise ValueError("duplicate job id in a batch of inserts")
            self.commits += 1
            stored = []
            for job in inserts:
                key = job.spec.idempotency_key
                first = self._by_key.get((job.caller, key)) if key is not None else None
                if first is not None:
                    stored.append(self._jobs[first])
                    continue
                self._jobs[job.id] = job
                if key is not None:
                    self._by_key[(job.caller, key)] = job.id
                stored.append(job)
            won = []
            for job, expected in writes:
                current = self._jobs.get(job.id)
                ok = current is not None and current.version == expected
                if ok:
                    self._jobs[job.id] = dataclasses.replace(job)
                won.append(ok)
            return won, stored

    def add_events(self, events: Sequence[Event]) -> list[Event]:
        with self._lock:
            stored = [dataclasses.replace(e, id=len(self._events) + i + 1) for i, e in enumerate(events)]
            self._events.extend(stored)
            return stored

    def list_events(self, *, after_id: int | None = None, since: float | None = None, caller: str | None = None,
                    limit: int = 100) -> list[Event]:
        return [e for e in self._events
                if (after_id is None or e.id > after_id) and (since is None or e.at >= since)
                and (caller is None or e.caller == caller)][:max(0, limit)]

    def close(self) -> None:
        pass
