"""Jobs and attempts to table rows and back, field for field.

Denormalised spec columns (pool, queue, priority, ...) exist for queries and operators; on read the
spec comes back from its JSON document alone. Timings map to one double column each, so only the
names in `TIMING_FIELDS` can be stored. Over-long names are refused here, identically on every
backend, instead of SQLite keeping them while PostgreSQL and MySQL reject them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from broker.errors import InvalidRequest
from broker.jobs import TIMING_FIELDS, Acquisition, Attempt, AttemptState, Job, JobSpec, JobState
from broker.store import schema

ATTEMPT_COLUMNS = tuple(c.name for c in schema.attempts.columns)
ATTEMPT_PREFIX = "a_"
"""Label prefix of attempt columns in the jobs-join-attempts queries."""

_LIMITS = {
    "id": schema.ID_LENGTH, "caller": schema.NAME_LENGTH, "pool": schema.NAME_LENGTH,
    "queue": schema.NAME_LENGTH, "lease_tag": schema.NAME_LENGTH, "idempotency_key": schema.NAME_LENGTH,
    "error_class": schema.ERROR_CLASS_LENGTH,
}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _check_lengths(row: Mapping[str, Any], what: str) -> None:
    for name, limit in _LIMITS.items():
        value = row.get(name)
        if isinstance(value, str) and len(value) > limit:
            raise InvalidRequest(f"{what} {name} is longer than {limit} characters",
                                 {"field": name, "max_length": limit})


_SPEC_JSON: dict[str, tuple[JobSpec, str]] = {}
_SPEC_JSON_KEPT = 8192


def _spec_json(job: Job) -> str:
    """The spec's JSON document, encoded once per spec: every write of a job rewrites its row, and a job's
    versions share one frozen `JobSpec` object, so encoding it again (asdict deep-copies) is waste."""
    hit = _SPEC_JSON.get(job.id)
    if hit is not None and hit[0] is job.spec:
        return hit[1]
    encoded = _dumps(job.spec.to_json())
    if len(_SPEC_JSON) >= _SPEC_JSON_KEPT:
        _SPEC_JSON.clear()
    _SPEC_JSON[job.id] = (job.spec, encoded)
    return encoded


def job_row(job: Job, now: float) -> dict[str, Any]:
    """Every column of `job`'s row; `created_at` is set by the caller's statement only on insert."""
    unknown = set(job.timings) - set(TIMING_FIELDS)
    if unknown:
        raise ValueError(f"job {job.id}: unknown timing fields {sorted(unknown)}")
    spec = job.spec
    row: dict[str, Any] = {
        "id": job.id,
        "caller": job.caller,
        "pool": spec.pool,
        "state": str(job.state),
        "version": job.version,
        "priority": spec.priority,
        "queue": spec.queue,
        "lease_tag": spec.lease_tag,
        "idempotency_key": spec.idempotency_key,
        "pods": spec.pods,
        "retries": job.retries,
        "max_retries": spec.max_retries,
        "exit_code": job.exit_code,
        "error_class": job.error_class,
        "error_message": job.error_message,
        "cancel_requested": bool(job.cancel_requested),
        "spec": _spec_json(job),
        # Most of these are empty on most writes: "[]" without a trip through the encoder.
        "pods_bound": _dumps(list(job.pods)) if job.pods else "[]",
        "acquisition": _dumps([a.to_json() for a in job.acquisition]) if job.acquisition else "[]",
        "dropped_env": _dumps([dict(d) for d in job.dropped_env]) if job.dropped_env else "[]",
        "created_at": now,
        "updated_at": now,
    }
    for name in TIMING_FIELDS:
        row[name] = job.timings.get(name)
    _check_lengths(row, "job")
    return row


def attempt_rows(job: Job) -> list[dict[str, Any]]:
    rows = []
    for a in job.attempts:
        if a.job_id != job.id:
            raise ValueError(f"attempt {a.id} belongs to job {a.job_id}, not {job.id}")
        if len(a.id) > schema.ATTEMPT_ID_LENGTH:
            raise InvalidRequest(f"attempt id is longer than {schema.ATTEMPT_ID_LENGTH} characters")
        row = {
            "id": a.id, "job_id": a.job_id, "n": a.n, "pods": _dumps(list(a.pods)), "state": str(a.state),
            "launched_at": a.launched_at, "first_instruction_at": a.first_instruction_at,
            "finished_at": a.finished_at, "exit_code": a.exit_code, "error_class": a.error_class,
            "message": a.message, "timings": _dumps(dict(a.timings)) if a.timings else None,
        }
        _check_lengths({"error_class": a.error_class}, "attempt")
        rows.append(row)
    return rows


def decode_attempt(row: Mapping[Any, Any]) -> Attempt:
    p = ATTEMPT_PREFIX
    return Attempt(
        id=row[p + "id"], job_id=row[p + "job_id"], n=row[p + "n"], pods=tuple(json.loads(row[p + "pods"])),
        state=AttemptState(row[p + "state"]), launched_at=row[p + "launched_at"],
        first_instruction_at=row[p + "first_instruction_at"], finished_at=row[p + "finished_at"],
        exit_code=row[p + "exit_code"], error_class=row[p + "error_class"], message=row[p + "message"],
        timings=json.loads(row[p + "timings"]) if row[p + "timings"] else {},
    )


def decode_job(row: Mapping[Any, Any], attempts: tuple[Attempt, ...]) -> Job:
    return Job(
        id=row["id"],
        caller=row["caller"],
        spec=JobSpec.from_json(json.loads(row["spec"])),
        state=JobState(row["state"]),
        version=row["version"],
        retries=row["retries"],
        exit_code=row["exit_code"],
        error_class=row["error_class"],
        error_message=row["error_message"],
        pods=tuple(json.loads(row["pods_bound"])),
        acquisition=tuple(Acquisition(**a) for a in json.loads(row["acquisition"])),
        attempts=attempts,
        dropped_env=tuple(json.loads(row["dropped_env"])),
        cancel_requested=bool(row["cancel_requested"]),
        timings={name: row[name] for name in TIMING_FIELDS if row[name] is not None},
    )


def decode_joined(rows: Iterable[Mapping[Any, Any]]) -> list[Job]:
    """Jobs from jobs-left-join-attempts rows ordered by job then attempt number; job order is kept."""
    jobs: list[Job] = []
    current: Mapping[Any, Any] | None = None
    found: list[Attempt] = []
    for row in rows:
        if current is None or row["id"] != current["id"]:
            if current is not None:
                jobs.append(decode_job(current, tuple(found)))
            current, found = row, []
        if row[ATTEMPT_PREFIX + "id"] is not None:
            found.append(decode_attempt(row))
    if current is not None:
        jobs.append(decode_job(current, tuple(found)))
    return jobs
