"""The dispatcher's queue: QUEUED jobs kept in dispatch order, counted by shape and by session.

A dict of job id -> job to every reader, it also keeps its rows sorted as jobs come and go (a pass does not
sort the queue), how many jobs of each shape (broker.claiming.passing.shape) it holds, and the sessions its
jobs wait in. A dispatch pass then walks the rows in order and stops once every shape still queued came up
short and no other job is left: a fan-out of a thousand like jobs costs a pass a few claims, not a thousand.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TypeVar

from broker.claiming.passing import Shape, shape
from broker.jobs import Job, job_sort_key

Key = tuple[int, float, str]
"""Dispatch order: higher (aged) priority first, then earlier submit, then id (unique: it ends in the id)."""
Session = tuple[str, str, str]
K = TypeVar("K")


class JobQueue(MutableMapping[str, Job]):
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._keys: dict[str, Key] = {}
        self._shapes: dict[str, Shape | None] = {}
        self._rows: list[Key] = []
        """Every queued job's key, sorted."""
        self.shapes: Counter[Shape] = Counter()
        """shape -> queued jobs of it."""
        self.unshaped = 0
        """Queued jobs whose claim is their own (no shape)."""
        self.sessions: Counter[Session] = Counter()
        """(caller, queue, tag) -> queued jobs of the session that take shared pods (not their own)."""

    def __getitem__(self, job_id: str) -> Job:
        return self._jobs[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __setitem__(self, job_id: str, job: Job) -> None:
        old = self._jobs.get(job_id)
        if old is job:
            return
        if old is not None:
            del self[job_id]
        key, same = job_sort_key(job), shape(job)
        self._jobs[job_id], self._keys[job_id], self._shapes[job_id] = job, key, same
        bisect.insort(self._rows, key)
        if same is None:
            self.unshaped += 1
        else:
            self.shapes[same] += 1
        if not job.spec.own_pods:
            self.sessions[(job.caller, job.spec.queue, job.spec.lease_tag)] += 1

    def __delitem__(self, job_id: str) -> None:
        job = self._jobs.pop(job_id)
        key, same = self._keys.pop(job_id), self._shapes.pop(job_id)
        del self._rows[bisect.bisect_left(self._rows, key)]
        if same is None:
            self.unshaped -= 1
        else:
            _drop(self.shapes, same)
        if not job.spec.own_pods:
            _drop(self.sessions, (job.caller, job.spec.queue, job.spec.lease_tag))

    def in_order(self) -> list[Key]:
        """The queued jobs' keys in dispatch order (a copy: the pass may claim jobs as it walks it)."""
        return list(self._rows)

    def shape_of(self, job_id: str) -> Shape | None:
        return self._shapes.get(job_id)


class Reasons(MutableMapping[str, str]):
    """job id -> why its last claim took nothing: a job's own, or its shape's (the first of a shape to come up
    short speaks for all of them: a pass does not visit the rest)."""

    def __init__(self, queue: JobQueue) -> None:
        self.queue = queue
        self.own: dict[str, str] = {}
        self.by_shape: Mapping[Shape, str] = {}

    def __getitem__(self, job_id: str) -> str:
        reason = self.own.get(job_id)
        if reason is not None:
            return reason
        same = self.queue.shape_of(job_id)
        if same is not None and (reason := self.by_shape.get(same)) is not None:
            return reason
        raise KeyError(job_id)

    def __setitem__(self, job_id: str, reason: str) -> None:
        self.own[job_id] = reason

    def __delitem__(self, job_id: str) -> None:
        self.own.pop(job_id, None)  # a shape's reason is the shape's: nothing of the job's own to drop

    def __iter__(self) -> Iterator[str]:
        yield from self.own
        yield from (job_id for job_id in self.queue if job_id not in self.own and job_id in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _drop(counts: Counter[K], key: K) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
