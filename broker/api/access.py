"""Who may read what of a job: the one policy the REST API and the dashboard both apply.

A job has two kinds of parts. Its **metadata** (state, pool, pods, timings, acquisition, exit) is what
an operator needs to run the fleet: its owner and admin callers read it (REST's job list, the dashboard's
job pages). Its **output** (logs, a kernel's connection info with its keys) and its **controls** (cancel,
signal) are the owner's alone, admins included: a log may hold anything the job printed, and a kernel's
keys let whoever holds them run code as the caller. An operator who must act on a caller's job does so
as that caller. docs/security.md states the promise and names the tests that hold it.

Refusals are "not found", as if the job did not exist, so a caller learns nothing of others' job ids.
"""

from __future__ import annotations

import enum
from typing import Protocol

from broker.api.auth import Identity
from broker.errors import NotFound
from broker.jobs import Job


class Part(enum.Enum):
    METADATA = "metadata"
    """State, pool, pods, timings, acquisition, outcome."""
    OUTPUT = "output"
    """Logs, a kernel's connection info, cancel and signal."""


def may_read(who: Identity, owner: str, part: Part) -> bool:
    """Whether `who` may read `part` of a job of `owner`."""
    if who.caller == owner:
        return True
    return part is Part.METADATA and who.admin


def check(who: Identity, job: Job | None, job_id: str, part: Part) -> Job:
    """The job if `who` may read `part` of it; NotFound otherwise (also for a job that does not exist)."""
    if job is None or not may_read(who, job.caller, part):
        raise NotFound(f"no job {job_id!r}", {"job": job_id})
    return job


class Jobs(Protocol):
    async def get(self, job_id: str) -> Job | None: ...


async def readable_job(jobs: Jobs, who: Identity, job_id: str, part: Part) -> Job:
    """Look the job up and `check` it; an implausible id is not looked up at all."""
    found = await jobs.get(job_id) if 1 <= len(job_id) <= 64 and job_id.isalnum() else None
    return check(who, found, job_id, part)
