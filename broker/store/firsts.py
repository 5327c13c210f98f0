"""Keyed submits in the group commit: which new jobs of a batch are repeats of a job the caller already has.

A submit with an idempotency key (the SDK sends one with every submit) stores a job only the first time:
a repeat of the key returns the caller's first job and stores nothing. In a group commit
(broker.store.sql, `commit_group`) the batch's keys are looked up in one read inside its transaction; a key
found there, or met earlier in the same batch, resolves to that first job, and only the rest are inserted.
The database's unique constraint on (caller, idempotency_key) stays the arbiter: a rival broker that commits
the same key between this read and the insert fails the insert, and the store runs the batch again, whose
read then finds the rival's job.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from broker.jobs import Job
from broker.store.schema import jobs

_CHUNK = 500
"""Keys per `IN` list of the lookup (well under every database's bound-parameter limit)."""


def split_firsts(conn: sa.Connection, inserts: Sequence[Job]) -> tuple[list[Job], dict[int, str | Job]]:
    """(the jobs to insert, {index in `inserts`: the first copy's id in the store, or the batch's first job})."""
    keyed = {(j.caller, j.spec.idempotency_key) for j in inserts if j.spec.idempotency_key is not None}
    stored: dict[tuple[str, str], str] = {}
    pairs = sorted(keyed)
    for i in range(0, len(pairs), _CHUNK):  # both columns named, so the (caller, key) unique index serves it
        chunk = pairs[i : i + _CHUNK]
        where = (
            jobs.c.caller.in_(sorted({c for c, _ in chunk})),
            jobs.c.idempotency_key.in_(sorted({k for _, k in chunk})),
        )
        for job_id, caller, key in conn.execute(
            sa.select(jobs.c.id, jobs.c.caller, jobs.c.idempotency_key).where(*where)
        ):
            if (caller, key) in keyed:
                stored[(caller, key)] = job_id
    fresh: list[Job] = []
    resolved: dict[int, str | Job] = {}
    first: dict[tuple[str, str], Job] = {}
    for n, job in enumerate(inserts):
        key = job.spec.idempotency_key
        if key is None:
            fresh.append(job)
        elif (job.caller, key) in stored:
            resolved[n] = stored[(job.caller, key)]
        elif (job.caller, key) in first:
            resolved[n] = first[(job.caller, key)]
        else:
            first[(job.caller, key)] = job
            fresh.append(job)
    return fresh, resolved
