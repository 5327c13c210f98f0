"""`SqlJobStore`: the durable `JobStore` on SQLite, MySQL/MariaDB or PostgreSQL via SQLAlchemy Core.

Errors leaving this module, all raised `from` the library error they translate (`sqlerrors.translated`):

    StoreError (503, retryable)   any SQLAlchemy / driver / Alembic / file-system failure, and a
                                  schema that is not at head
    InvalidRequest (422)          a name longer than its column (rows.py), refused the same everywhere
    ValueError                    a programming error: duplicate job id, a timing field with no column
    (a lost version race is not an error: `commit` reports it as False)

Deadlocks, serialization failures and dropped connections are retried (three tries) when they
happen before COMMIT, since the database then rolled the whole transaction back. A failure during
COMMIT is not retried: the batch may or may not have landed. Re-sending it is still safe, since a
write that did land has moved its row's version and now loses; re-read to find out.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from broker.clock import Clock, RealClock
from broker.errors import StoreError
from broker.events import Event, detail_text
from broker.jobs import Job, JobState
from broker.store import migrating, rows
from broker.store.engines import WRITE, create_store_engine, normalize_url
from broker.store.firsts import split_firsts
from broker.store.prepared import Prepared, PreparedIn, PreparedRows, attempt_upsert, job_upsert
from broker.store.schema import NAME_LENGTH, attempts, events, jobs
from broker.store.sqlerrors import transient, translated

log = logging.getLogger(__name__)

T = TypeVar("T")

TRIES = 3
_IN_CHUNK = 500
"""Ids per locking read: long IN lists stay well under every server's parameter limits."""
KEY_RACE_TRIES = 3
"""How often a group commit runs when a rival broker commits one of its idempotency keys meanwhile."""
_ROWS_KEPT = 8192
"""Rows remembered for sending only changed columns; past it the memory starts over (a write then sends its whole row)."""
_STATEMENTS_KEPT = 256
"""Prepared UPDATEs, one per set of changed columns; past it the cache starts over."""


_NEVER_UPDATED = ("id", "created_at")
_UPDATABLE = tuple(c.name for c in jobs.columns if c.name not in _NEVER_UPDATED)
_VOLATILE = tuple(name for name in _UPDATABLE if name not in rows.FIXED_COLUMNS)
"""The columns a write can change while the job's id, caller and spec stay (rows.FIXED_COLUMNS come from those)."""


class SqlJobStore:
    """Jobs and attempts in SQL; every job-row write is conditional on the row version."""

    blocking = True

    def __init__(self, engine: sa.Engine, *, clock: Clock | None = None) -> None:
        self._engine = engine
        self._clock = clock or RealClock()
        dialect = engine.dialect
        self._update = jobs.update().where(jobs.c.id == sa.bindparam("w_id"),
                                           jobs.c.version == sa.bindparam("w_version"))
        self._updates: dict[tuple[str, ...], Prepared | PreparedRows] = {}
        """The version-guarded UPDATE per set of columns sent, compiled once (broker.store.prepared)."""
        job_columns = [c.name for c in jobs.columns]
        # SQLite: many rows a statement and the versions in one row, so a group commit steps its driver (each step a
        # GIL release, costly beside the busy event loop) a few times instead of a few times a job.
        lite = dialect.name == "sqlite"

        def rows_at_once(prepared: Prepared) -> Prepared | PreparedRows:
            return PreparedRows.inserting(prepared) if lite else prepared

        self._upsert_attempts = rows_at_once(Prepared(attempt_upsert(dialect.name), dialect, rows.ATTEMPT_COLUMNS))
        self._upsert_jobs = (Prepared(job_upsert(), dialect, job_columns)
                             if dialect.name in ("mysql", "mariadb") else None)
        self._insert_jobs = rows_at_once(Prepared(jobs.insert(), dialect, job_columns))
        self._insert_attempts = rows_at_once(Prepared(attempts.insert(), dialect, rows.ATTEMPT_COLUMNS))
        self._update_from = lite and sqlite3.sqlite_version_info >= (3, 33)  # UPDATE ... FROM (VALUES ...)
        self._lock_one_row = lite  # BEGIN IMMEDIATE holds SQLite's write lock: the read only fetches versions
        ids_in = jobs.c.id.in_(sa.bindparam("ids", expanding=True))
        if lite:
            unit = sa.literal_column("char(31)", sa.String())  # the unit separator: never in a job id
            pairs = sa.func.group_concat(jobs.c.id.concat(unit).concat(sa.cast(jobs.c.version, sa.String)), unit)
            self._lock = PreparedIn(sa.select(pairs).where(ids_in), dialect, "ids")
        else:
            self._lock = PreparedIn(sa.select(jobs.c.id, jobs.c.version).where(ids_in).order_by(jobs.c.id)
                                    .with_for_update(), dialect, "ids")
        self._attempt_cols = [c.label(rows.ATTEMPT_PREFIX + c.name) for c in attempts.columns]
        self._written: dict[str, dict[str, Any]] = {}
        """job id -> the row this store last committed for it. A write whose row still holds that version
        (checked under the row lock) sends only the columns that differ from it: a dispatch changes about ten
        of the row's thirty-odd columns, and every column sent costs bind processing here and in the database."""

    @classmethod
    def open(cls, url: str, *, migrate: bool = True, clock: Clock | None = None) -> SqlJobStore:
        """Connect to `url`, upgrade the schema to head (or check it is there), and return the store."""
        with translated("open"):
            engine = create_store_engine(url)
            try:
                head = migrating.head_revision()
                found = migrating.current_revision(engine)
                if found is not None and found not in migrating.known_revisions():
                    raise StoreError(f"the job store's schema is at {found}, newer than this broker knows (up to "
                                     f"{head}): run a broker of the release that upgraded it",
                                     {"operation": "open", "current": found, "head": head})
                if migrate:
                    migrating.upgrade(engine)
                current = migrating.current_revision(engine)
                if current != head:
                    raise StoreError(f"job store schema is at {current}, this broker needs {head}; "
                                     "run the migrations", {"operation": "open", "current": current,
                                                            "head": head})
            except BaseException:
                engine.dispose()
                raise
        log.info("job store %s at schema %s",
                 normalize_url(url).render_as_string(hide_password=True), head)
        return cls(engine, clock=clock)

    @property
    def engine(self) -> sa.Engine:
        return self._engine

    def insert(self, job: Job) -> Job:
        row = rows.job_row(job, self._clock.now())
        attempt_rows = rows.attempt_rows(job)

        def write(conn: sa.Connection) -> None:
            conn.execute(jobs.insert(), row)
            if attempt_rows:
                conn.execute(attempts.insert(), attempt_rows)

        with translated("insert"):
            try:
                self._run(write, writes=True)
            except sa.exc.IntegrityError as exc:
                # Either (caller, idempotency_key) or the id already exists; the failed transaction is
                # gone, so look in a fresh one. A concurrent insert of the same key has committed by
                # now: PostgreSQL and InnoDB make the loser wait for it before reporting the conflict.
                existing = self._existing(job)
                if existing is not None:
                    return existing
                if self.get(job.id) is not None:
                    raise ValueError(f"duplicate job id {job.id}") from exc
                raise
        self._remember({job.id: row})
        return job

    def _existing(self, job: Job) -> Job | None:
        key = job.spec.idempotency_key
        if key is None:
            return None
        found = self._select(sa.and_(jobs.c.caller == job.caller, jobs.c.idempotency_key == key), limit=None)
        return found[0] if found else None

    def get(self, job_id: str) -> Job | None:
        with translated("get"):
            found = self._select(jobs.c.id == job_id, limit=None)
        return found[0] if found else None

    def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        """The jobs of these ids that exist, read up to `_IN_CHUNK` ids a statement (unknown ids left out)."""
        ids = sorted(set(job_ids))
        found: list[Job] = []
        with translated("get_many"):
            for i in range(0, len(ids), _IN_CHUNK):
                found += self._select(jobs.c.id.in_(ids[i:i + _IN_CHUNK]), limit=None)
        return found

    def list_jobs(self, *, caller: str | None = None, states: Iterable[JobState] | None = None,
                  limit: int = 100, before: str | None = None, pool: str | None = None,
                  lease_tag: str | None = None) -> list[Job]:
        """Newest first; `before` pages by job id."""
        where = []
        if pool is not None:
            where.append(jobs.c.pool == pool)
        if lease_tag is not None:
            where.append(jobs.c.lease_tag == lease_tag)
        if caller is not None:
            where.append(jobs.c.caller == caller)
        if states is not None:
            where.append(jobs.c.state.in_([str(s) for s in states]))
        if before is not None:
            where.append(jobs.c.id < before)
        if limit <= 0:
            return []
        with translated("list_jobs"):
            return self._select(sa.and_(sa.true(), *where), limit=limit)

    def _select(self, where: sa.ColumnElement[bool], *, limit: int | None) -> list[Job]:
        # One statement, so the job row and its attempts come from one snapshot on every backend.
        picked = sa.select(jobs).where(where).order_by(jobs.c.id.desc())
        if limit is not None:
            picked = picked.limit(limit)
        j = picked.subquery("j")
        stmt = (sa.select(j, *self._attempt_cols)
                .select_from(j.outerjoin(attempts, attempts.c.job_id == j.c.id))
                .order_by(j.c.id.desc(), attempts.c.n))

        def read(conn: sa.Connection) -> list[Job]:
            return rows.decode_joined(conn.execute(stmt).mappings())

        return self._run(read, writes=False)

    def commit(self, writes: Sequence[tuple[Job, int]], inserts: Sequence[Job] = ()) -> list[bool]:
        return self.commit_group(writes, inserts)[0]

    def commit_group(self, writes: Sequence[tuple[Job, int]],
                     inserts: Sequence[Job] = ()) -> tuple[list[bool], list[Job]]:
        """Write each job iff its row still has the expected version, and insert `inserts`; one transaction.
        Returns the writes' wins and, per insert, the job stored for it (itself, or its key's first job).

        Set-based, so a batch costs a fixed number of round trips, not one per job (group commit is
        what buys throughput, and on a busy host each round trip to the server is a context switch):

        1. one locking read of the batch's rows, `SELECT id, version ... FOR UPDATE` in id order
           (SQLite: BEGIN IMMEDIATE already holds the write lock), so no other writer moves them and
           concurrent batches lock rows in the same order and cannot deadlock each other;
        2. the version checks, per write in batch order: a write wins iff the row's version (as the
           earlier writes of this batch left it) is the one it expects; a loser affects only itself;
        3. one batched write of each winning row's final state, still guarded by `version =` the value
           read under the lock (MySQL: a multi-row upsert, which PyMySQL sends as one statement, of
           rows known to exist and locked), and one upsert of the winners' attempts;
        4. one read of the batch's idempotency keys (broker.store.firsts): a key the caller already used, or
           one met earlier in the batch, resolves to that first job and is not inserted;
        5. one multi-row INSERT of the new jobs. A rival that committed one of their keys since step 4 fails
           it, and the batch runs again (its read then finds the rival's job); a duplicate id, a programming
           error, fails the whole transaction, as `insert` reports it.
        """
        if not writes and not inserts:
            return [], []
        now = self._clock.now()
        ids = sorted({job.id for job, _ in writes})
        won = [False] * len(writes)
        committed: dict[str, dict[str, Any]] = {}
        resolved: dict[int, str | Job] = {}

        def write(conn: sa.Connection) -> list[bool]:
            committed.clear()  # a retried transaction starts over
            resolved.clear()
            won[:] = [False] * len(writes)
            version: dict[str, int] = {}
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = ids[i:i + _IN_CHUNK]
                version.update(self._versions(conn, chunk))
            locked = dict(version)
            final: dict[str, Job] = {}
            upserts: dict[str, dict[str, Any]] = {}
            for i, (job, expected) in enumerate(writes):
                if version.get(job.id) != expected:
                    continue
                won[i] = True
                version[job.id] = job.version
                final[job.id] = job
                upserts.update((a["id"], a) for a in rows.attempt_rows(job))  # a later write of the job wins
            if final:
                committed.update(self._write_rows(conn, [final[i] for i in sorted(final)], locked, now))
            if upserts:
                self._upsert_attempts.run(conn, list(upserts.values()))
            if inserts:
                fresh, firsts = split_firsts(conn, inserts)
                resolved.update(firsts)
                new_rows = [rows.job_row(job, now) for job in fresh]
                if new_rows:
                    self._insert_jobs.run(conn, new_rows)
                    committed.update((row["id"], row) for row in new_rows)
                    self._insert_attempts.run(conn, [a for job in fresh for a in rows.attempt_rows(job)])
            return won

        keyed = any(job.spec.idempotency_key is not None for job in inserts)
        with translated("commit"):
            for tries_left in range(KEY_RACE_TRIES - 1, -1, -1):
                try:
                    result = self._run(write, writes=True)
                    break
                except sa.exc.IntegrityError as exc:
                    if not inserts:
                        raise
                    if keyed and tries_left:  # a rival may have committed one of the batch's keys: look again
                        continue
                    raise ValueError("duplicate job id in a batch of inserts") from exc
            firsts = self._select(jobs.c.id.in_(sorted({r for r in resolved.values() if isinstance(r, str)})),
                                  limit=None) if resolved else []
        self._remember(committed)  # only once COMMIT returned: a row that may not have landed is not remembered
        by_id: dict[str, Job] = {job.id: job for job in firsts}
        stored = list(inserts)
        for n, first in resolved.items():
            stored[n] = first if isinstance(first, Job) else by_id.get(first) or self.insert(inserts[n])
        return result, stored

    def _versions(self, conn: sa.Connection, ids: list[str]) -> Iterable[tuple[str, int]]:
        """(id, version) of the rows of `ids` that exist, locked for this transaction."""
        found = self._lock.rows(conn, ids)
        if not self._lock_one_row:
            return ((row[0], row[1]) for row in found)
        if not found[0][0]:
            return ()
        words = found[0][0].split("\x1f")  # id, version, id, version, ...
        return ((words[i], int(words[i + 1])) for i in range(0, len(words), 2))

    def _remember(self, written: dict[str, dict[str, Any]]) -> None:
        if len(self._written) + len(written) > _ROWS_KEPT:
            self._written.clear()
        for job_id, row in written.items():
            known = self._written.get(job_id)
            if known is None or known["version"] < row["version"]:  # another thread may have remembered a later one
                self._written[job_id] = row

    def _write_rows(self, conn: sa.Connection, winners: list[Job], locked: dict[str, int],
                    now: float) -> dict[str, dict[str, Any]]:
        """Write the winners' rows (guarded by the versions read under the lock); returns them by job id."""
        full = {job.id: rows.job_row(job, now) for job in winners}
        if self._upsert_jobs is not None:  # MySQL: rows locked above and known to exist, so this only updates
            self._upsert_jobs.run(conn, list(full.values()))  # (its whole row: an upsert names every NOT NULL column)
            return full
        by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for job_id, row in full.items():
            before = self._written.get(job_id)
            if before is not None and before["version"] == locked[job_id]:  # the database holds exactly `before`
                # The same spec text object means the same rows._fixed_columns entry: those columns are unchanged.
                keys = _VOLATILE if before["spec"] is row["spec"] else _UPDATABLE
                sent = {k: row[k] for k in keys if before[k] != row[k]}
            else:
                sent = {k: row[k] for k in _UPDATABLE}
            sent["w_id"], sent["w_version"] = job_id, locked[job_id]
            by_columns.setdefault(tuple(sent), []).append(sent)  # one executemany needs one column list
        updated = sum(self._prepared_update(columns).run(conn, params) for columns, params in by_columns.items())
        if updated != len(full):  # cannot happen under the row locks; never commit a half-applied batch
            raise sa.exc.InvalidRequestError(f"group commit updated {updated} of {len(full)} locked rows")
        return full

    def _prepared_update(self, columns: tuple[str, ...]) -> Prepared | PreparedRows:
        prepared = self._updates.get(columns)
        if prepared is None:
            if len(self._updates) >= _STATEMENTS_KEPT:
                self._updates.clear()
            set_columns = [c for c in columns if c not in ("w_id", "w_version")]
            dialect = self._engine.dialect
            prepared = Prepared(self._update, dialect, set_columns)
            if self._update_from:
                prepared = PreparedRows.updating(prepared, dialect, "jobs", set_columns,
                                                 {"id": "w_id", "version": "w_version"})
            self._updates[columns] = prepared
        return prepared

    def _run(self, work: Callable[[sa.Connection], T], *, writes: bool) -> T:
        """Run `work` in one transaction, retrying transient failures that struck before COMMIT."""
        for attempt in range(1, TRIES + 1):
            committing = False
            try:
                with self._engine.connect() as conn:
                    if writes:
                        conn.execution_options(**{WRITE: True})
                    with conn.begin() as tx:
                        result = work(conn)
                        committing = True
                        tx.commit()
                    return result
            except sa.exc.DBAPIError as exc:
                if committing or attempt == TRIES or not transient(exc):
                    raise
        raise AssertionError("unreachable")

    def add_events(self, batch: Sequence[Event]) -> list[Event]:
        """Append events in one transaction; the database numbers them (ids grow with commit order)."""
        if not batch:
            return []

        def write(conn: sa.Connection) -> list[Event]:
            out = []
            for e in batch:
                row = {"at": e.at, "kind": e.kind, "subject": e.subject[:NAME_LENGTH], "why": e.why,
                       "cost_gpu_s": e.cost_gpu_s, "caller": None if e.caller is None else e.caller[:NAME_LENGTH],
                       "detail": detail_text(e.detail)}
                key = conn.execute(events.insert(), row).inserted_primary_key
                out.append(dataclasses.replace(e, id=int(key[0]) if key else 0))
            return out

        with translated("add_events"):
            return self._run(write, writes=True)

    def list_events(self, *, after_id: int | None = None, since: float | None = None, caller: str | None = None,
                    limit: int = 100) -> list[Event]:
        """Oldest first."""
        if limit <= 0:
            return []
        stmt = sa.select(events).order_by(events.c.id).limit(limit)
        if after_id is not None:  # ids are 32-bit: a bigger `after_id` is past every event
            stmt = stmt.where(events.c.id > min(after_id, 2**31 - 1))
        if since is not None:
            stmt = stmt.where(events.c.at >= since)
        if caller is not None:
            stmt = stmt.where(events.c.caller == caller)

        def read(conn: sa.Connection) -> list[Event]:
            return [Event(at=r["at"], kind=r["kind"], subject=r["subject"], why=r["why"], cost_gpu_s=r["cost_gpu_s"],
                          caller=r["caller"], detail=json.loads(r["detail"] or "{}"), id=int(r["id"]))
                    for r in conn.execute(stmt).mappings()]

        with translated("list_events"):
            return self._run(read, writes=False)

    def close(self) -> None:
        self._engine.dispose()

