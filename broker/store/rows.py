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


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""One encoder: `json.dumps` with options builds a new one per call, and a write encodes three documents."""
_TIMINGS = frozenset(TIMING_FIELDS)
_NO_TIMINGS: dict[str, Any] = dict.fromkeys(TIMING_FIELDS)


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _verbatim(value: str) -> bool:
    """JSON writes `value` as itself between quotes (ensure_ascii off): no quote, no backslash, and no control
    character (isprintable is stricter than JSON needs: a string it refuses goes through the encoder)."""
    return value.isprintable() and '"' not in value and "\\" not in value


def _names(values: tuple[str, ...]) -> str:
    """`_dumps(list(values))` for a tuple of strings, without the encoder's fixed cost (~2 µs a call, three calls a
    write) when no name needs escaping, as pod names never do."""
    if all(map(_verbatim, values)):
        return '["' + '","'.join(values) + '"]' if values else "[]"
    return _dumps(list(values))


def _acquisition(acquisition: tuple[Acquisition, ...]) -> str:
    """`_dumps([a.to_json() for a in acquisition])`, written directly when no value needs escaping."""
    parts = []
    for a in acquisition:
        if not (_verbatim(a.pod) and _verbatim(a.path) and (a.reason is None or _verbatim(a.reason))):
            return _dumps([a.to_json() for a in acquisition])
        reason = "null" if a.reason is None else f'"{a.reason}"'
        parts.append(f'{{"pod":"{a.pod}","path":"{a.path}","reason":{reason}}}')
    return "[" + ",".join(parts) + "]"


def _check_lengths(row: Mapping[str, Any], what: str) -> None:
    for name, limit in _LIMITS.items():
        value = row.get(name)
        if isinstance(value, str) and len(value) > limit:
            raise InvalidRequest(f"{what} {name} is longer than {limit} characters",
                                 {"field": name, "max_length": limit})


FIXED_COLUMNS = ("id", "caller", "pool", "priority", "queue", "lease_tag", "idempotency_key", "pods", "max_retries",
                 "spec")
"""The columns that come from a job's id, caller and spec alone."""
_FIXED: dict[str, tuple[JobSpec, str, dict[str, Any]]] = {}
_FIXED_KEPT = 8192


def _fixed_columns(job: Job) -> dict[str, Any]:
    """The columns that come from the job's id, caller and spec, encoded and length-checked once per spec:
    every write of a job rewrites its row, and a job's versions share one frozen `JobSpec` object, so
    encoding it again (asdict deep-copies) and checking the same names again is waste."""
    hit = _FIXED.get(job.id)
    if hit is not None and hit[0] is job.spec and hit[1] == job.caller:
        return hit[2]
    spec = job.spec
    fixed = {
        "id": job.id, "caller": job.caller, "pool": spec.pool, "priority": spec.priority, "queue": spec.queue,
        "lease_tag": spec.lease_tag, "idempotency_key": spec.idempotency_key, "pods": spec.pods,
        "max_retries": spec.max_retries, "spec": _dumps(spec.to_json()),
    }
    assert tuple(fixed) == FIXED_COLUMNS
    _check_lengths(fixed, "job")
    if len(_FIXED) >= _FIXED_KEPT:
        _FIXED.clear()
    _FIXED[job.id] = (spec, job.caller, fixed)
    return fixed


def job_row(job: Job, now: float) -> dict[str, Any]:
    """Every column of `job`'s row; `created_at` is set by the caller's statement only on insert."""
    if not _TIMINGS.issuperset(job.timings):
        unknown = set(job.timings) - _TIMINGS
        raise ValueError(f"job {job.id}: unknown timing fields {sorted(unknown)}")
    error_class = job.error_class
    if error_class is not None and len(error_class) > schema.ERROR_CLASS_LENGTH:
        _check_lengths({"error_class": error_class}, "job")
    row: dict[str, Any] = {
        **_fixed_columns(job),
        "state": str(job.state),
        "version": job.version,
        "retries": job.retries,
        "exit_code": job.exit_code,
        "error_class": error_class,
        "error_message": job.error_message,
        "cancel_requested": bool(job.cancel_requested),
        # Most of these are empty on most writes: "[]" without a trip through the encoder.
        "pods_bound": _names(job.pods),
        "acquisition": _acquisition(job.acquisition),
        "dropped_env": _dumps([dict(d) for d in job.dropped_env]) if job.dropped_env else "[]",
        "created_at": now,
        "updated_at": now,
    }
    row.update(_NO_TIMINGS)  # every timing column, then the job's (all of them named in TIMING_FIELDS)
    row.update(job.timings)
    return row


def attempt_rows(job: Job) -> list[dict[str, Any]]:
    rows = []
    for a in job.attempts:
        if a.job_id != job.id:
            raise ValueError(f"attempt {a.id} belongs to job {a.job_id}, not {job.id}")
        if len(a.id) > schema.ATTEMPT_ID_LENGTH:
            raise InvalidRequest(f"attempt id is longer than {schema.ATTEMPT_ID_LENGTH} characters")
        row = {
            "id": a.id, "job_id": a.job_id, "n": a.n, "pods": _names(a.pods), "state": str(a.state),
            "launched_at": a.launched_at, "first_instruction_at": a.first_instruction_at,
            "finished_at": a.finished_at, "exit_code": a.exit_code, "error_class": a.error_class,
            "message": a.message, "timings": _dumps(dict(a.timings)) if a.timings else None,
        }
        if a.error_class is not None and len(a.error_class) > schema.ERROR_CLASS_LENGTH:
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
