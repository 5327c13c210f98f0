"""`SqlJobStore` on SQLite, MariaDB and PostgreSQL: the shared store contract plus what only SQL has.

Every test runs once per backend against a real database; see store_databases.py for the servers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.sql.compiler import SQLCompiler

from broker.claiming.jobbook import JobBook
from broker.clock import RealClock
from broker.errors import InvalidRequest, StoreError
from broker.jobs import Attempt, AttemptState, Job, JobState, attempt_id, transition
from broker.store import SqlJobStore
from broker.store.engines import normalize_url
from broker.store.schema import VERSION_TABLE, metadata
from broker.store.sqlerrors import transient as is_transient
from tests.integration.store_databases import BACKENDS, Databases
from tests.store_contract import JobStoreContract, make_job, race

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session", params=BACKENDS)
def databases(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Databases]:
    dbs = Databases(request.param, tmp_path_factory.mktemp(request.param))
    yield dbs
    dbs.drop_all()


@pytest.fixture(scope="session")
def session_url(databases: Databases) -> str:
    """One database per backend for the whole session; the store fixture empties it per test."""
    return databases.create()


@pytest.fixture
def fresh_url(databases: Databases) -> str:
    """A database of its own, not yet migrated."""
    return databases.create()


@pytest.fixture
def store(session_url: str) -> Iterator[SqlJobStore]:
    store = SqlJobStore.open(session_url)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM attempts")
        conn.exec_driver_sql("DELETE FROM jobs")
    yield store
    store.close()


class TestSqlJobStore(JobStoreContract):
    """The contract, on each backend."""


def test_sql_store_belongs_on_a_worker_thread(store: SqlJobStore) -> None:
    assert store.blocking is True


# --- migrations ---------------------------------------------------------------------------------------


def test_opening_twice_migrates_once_and_keeps_the_data(fresh_url: str) -> None:
    first = SqlJobStore.open(fresh_url)
    first.insert(make_job("j-1"))
    first.close()
    second = SqlJobStore.open(fresh_url)
    assert second.get("j-1") == make_job("j-1")
    with second.engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar() == 1
    second.close()


def test_threads_opening_a_fresh_database_together_all_succeed(fresh_url: str) -> None:
    stores = race(6, lambda i: SqlJobStore.open(fresh_url))
    try:
        stores[0].insert(make_job("j-1"))
        assert all(s.get("j-1") is not None for s in stores)
    finally:
        for s in stores:
            s.close()


def test_processes_opening_a_fresh_database_together_all_succeed(fresh_url: str) -> None:
    # Separate processes do not share the in-process migration lock: the database must serialise them.
    code = ("import sys; from broker.store import SqlJobStore; "
            "s = SqlJobStore.open(sys.argv[1]); s.close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, fresh_url], stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors


def test_migrations_build_exactly_the_schema_the_store_queries(store: SqlJobStore) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_open_without_migrating_refuses_an_unmigrated_database(fresh_url: str) -> None:
    with pytest.raises(StoreError, match="schema is at None"):
        SqlJobStore.open(fresh_url, migrate=False)
    SqlJobStore.open(fresh_url).close()
    SqlJobStore.open(fresh_url, migrate=False).close()


# --- what SQL adds to the contract ------------------------------------------------------------------------


def test_group_commit_is_one_transaction(store: SqlJobStore) -> None:
    a, b = store.insert(make_job("j-a")), store.insert(make_job("j-b"))
    transactions: list[sa.Connection] = []
    sa.event.listen(store.engine, "commit", transactions.append)  # the store is closed after the test
    won = store.commit([(transition(a, JobState.QUEUED, at=1.0), 0), (transition(b, JobState.QUEUED, at=1.0), 0)])
    assert won == [True, True]
    assert len(transactions) == 1


def test_a_write_sends_only_the_columns_that_changed_and_the_row_reads_back_whole(store: SqlJobStore) -> None:
    job = store.insert(make_job("j-1", state=JobState.QUEUED, version=1))
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda conn, cursor, statement, *rest: statements.append(statement))
    running = transition(job, JobState.RUNNING, at=2.0, pods=("p-1",))
    assert store.commit([(running, job.version)]) == [True]
    assert store.get(job.id) == running
    updates = [s for s in statements if s.lstrip().upper().startswith("UPDATE JOBS")]
    if store.engine.dialect.name not in ("mysql", "mariadb"):  # MySQL upserts whole rows
        assert len(updates) == 1
        assert re.search(r"\bpods_bound\b", updates[0]) and not re.search(r"\bspec\b", updates[0])
    requeued = transition(running, JobState.QUEUED, at=3.0, pods=())  # back to an empty value: still sent
    assert store.commit([(requeued, running.version)]) == [True]
    assert store.get(job.id) == requeued


def test_a_row_another_broker_moved_is_written_whole(store: SqlJobStore, session_url: str) -> None:
    job = store.insert(make_job("j-1", state=JobState.QUEUED, version=1))
    running = transition(job, JobState.RUNNING, at=2.0, pods=("p-1",))
    assert store.commit([(running, job.version)]) == [True]
    other = SqlJobStore.open(session_url)
    try:  # the other broker's row differs from what this store last wrote in the columns the next write repeats
        rival = transition(running, JobState.QUEUED, at=3.0, pods=())
        assert other.commit([(rival, running.version)]) == [True]
    finally:
        other.close()
    fresh = store.get(job.id)
    assert fresh == rival
    again = transition(fresh, JobState.RUNNING, at=4.0, pods=("p-1",))
    assert store.commit([(running, running.version)]) == [False]  # the stale write still loses its version check
    assert store.commit([(again, fresh.version)]) == [True]
    assert store.get(job.id) == again


def test_a_group_commit_hands_its_rows_to_the_driver_without_sqlalchemy_building_each_parameter_set(
        store: SqlJobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-row parameter building in SQLAlchemy was the largest CPU cost of a big group commit: the store's
    statements are compiled once and their rows go to the driver as they are (broker.store.prepared)."""
    queued = [store.insert(make_job(f"j-{i:02}", state=JobState.QUEUED, version=1)) for i in range(37)]
    rival = transition(queued[7], JobState.CANCELLED, at=2.0)
    assert store.commit([(rival, queued[7].version)]) == [True]  # j-07's write below loses, alone
    built: list[int] = []
    construct = SQLCompiler.construct_params
    monkeypatch.setattr(SQLCompiler, "construct_params",
                        lambda self, *a, **kw: built.append(1) or construct(self, *a, **kw))
    running = [transition(j, JobState.RUNNING, at=3.0, pods=(f"p-{i}",)) for i, j in enumerate(queued)]
    new = [make_job(f"n-{i}", state=JobState.QUEUED, version=1) for i in range(40)]
    won = store.commit([(j, q.version) for j, q in zip(running, queued, strict=True)], new)
    assert won == [i != 7 for i in range(37)]  # 37 ids: the locking read pads its IN list to 64
    assert len(built) <= 2  # the locking read's IN list at most; before: one per row and statement (>= 80)
    stored = [*running[:7], rival, *running[8:], *new]
    assert [store.get(j.id) for j in stored] == stored


def test_a_boolean_and_whole_number_times_survive_the_driver_level_writes(store: SqlJobStore) -> None:
    job = store.insert(make_job("j-1", state=JobState.QUEUED, version=1))
    running = transition(job, JobState.RUNNING, at=7, pods=("p-1",), timings={"claimed_at": 7})
    cancelled = dataclasses.replace(running, cancel_requested=True)
    assert store.commit([(cancelled, job.version)]) == [True]
    got = store.get("j-1")
    assert got == cancelled and got is not None and got.cancel_requested is True
    assert got.timings["claimed_at"] == 7 and isinstance(got.timings["claimed_at"], float)


def test_a_lost_race_in_the_job_books_group_commit_affects_only_that_job(store: SqlJobStore,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [store.insert(make_job(f"j-{i}", state=JobState.QUEUED, version=1)) for i in range(8)]
    book = JobBook(store, RealClock())
    for job in jobs:
        book.adopt(job)
    rival = transition(jobs[3], JobState.CANCELLED, at=5.0)  # another writer moves j-3 behind the book's back
    assert store.commit([(rival, jobs[3].version)]) == [True]
    batches: list[int] = []
    commit_group = store.commit_group
    monkeypatch.setattr(store, "commit_group", lambda writes, inserts=(): batches.append(len(writes))
                        or commit_group(writes, inserts))

    async def bind_all() -> list[Job | None]:
        return await asyncio.gather(*(book.write(j.id, lambda cur: transition(cur, JobState.RUNNING, at=6.0,
                                                                              pods=("p",))) for j in jobs))

    results = asyncio.run(bind_all())
    assert batches == [8]  # eight writers, one transaction
    assert results[3] is None and "j-3" not in book.live  # the loser adopted the rival's terminal row
    assert store.get("j-3") == rival
    for job, result in zip(jobs, results, strict=True):
        if job.id != "j-3":
            assert result is not None and result.state is JobState.RUNNING
            assert store.get(job.id) == result == book.live[job.id]


def test_submits_join_the_job_books_group_commit_and_are_stored_when_they_return(
        store: SqlJobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keyed submits (the SDK's) too: a key repeated within the group, or one stored before, returns the first job."""
    jobs = [store.insert(make_job(f"j-{i}", state=JobState.QUEUED, version=1)) for i in range(4)]
    earlier = store.insert(make_job("j-earlier", state=JobState.QUEUED, version=1, key="old"))
    book = JobBook(store, RealClock())
    for job in jobs:
        book.adopt(job)
    batches: list[tuple[int, int]] = []
    commit_group = store.commit_group
    monkeypatch.setattr(store, "commit_group", lambda writes, inserts=(): batches.append((len(writes), len(inserts)))
                        or commit_group(writes, inserts))
    monkeypatch.setattr(store, "insert", None)  # no submit takes the single path
    new = [make_job(f"j-new{i}", state=JobState.QUEUED, version=1) for i in range(3)]
    keyed = make_job("j-keyed", state=JobState.QUEUED, version=1, key="k")
    repeats = [make_job("j-keyed-again", state=JobState.QUEUED, version=1, key="k"),
               make_job("j-old-again", state=JobState.QUEUED, version=1, key="old")]

    async def submit_and_bind() -> list[Job | None]:
        return await asyncio.gather(*(book.write(j.id, lambda cur: transition(cur, JobState.RUNNING, at=6.0,
                                                                             pods=("p",))) for j in jobs),
                                    *(book.insert(j) for j in [*new, keyed, *repeats]))

    results = asyncio.run(submit_and_bind())
    assert batches == [(4, 6)]  # four writes and six submits, one transaction
    assert results[4:] == [*new, keyed, keyed, earlier]
    for job in [*new, keyed]:
        assert store.get(job.id) == job == book.live[job.id]
    assert store.get("j-keyed-again") is None and store.get("j-old-again") is None
    assert all(results[i] is not None and results[i].state is JobState.RUNNING for i in range(4))  # type: ignore[union-attr]


def test_two_brokers_racing_one_key_store_one_job_and_the_rest_of_their_groups(
        store: SqlJobStore, session_url: str) -> None:
    """Two stores on their own engines (two brokers), group commits and single inserts of one key at once."""
    other = SqlJobStore.open(session_url)
    try:
        for round_ in range(3):
            key = f"shared-{round_}"

            def submit(i: int, round_: int = round_, key: str = key) -> Job:
                mine = store if i % 2 else other
                if i % 3 == 0:  # a keyed submit alone, as a non-blocking caller of insert() would
                    return mine.insert(make_job(f"j-{round_}-{i}", key=key))
                _, stored = mine.commit_group([], [make_job(f"j-{round_}-{i}-x"), make_job(f"j-{round_}-{i}", key=key)])
                return stored[1]

            results = race(6, submit)
            keyed = [j for j in store.list_jobs(limit=1000) if j.spec.idempotency_key == key]
            assert len(keyed) == 1 and all(r == keyed[0] for r in results)
            assert all(store.get(f"j-{round_}-{i}-x") is not None for i in range(6) if i % 3)
    finally:
        other.close()


def test_an_over_long_name_is_refused_the_same_on_every_backend(store: SqlJobStore) -> None:
    with pytest.raises(InvalidRequest, match="idempotency_key"):
        store.insert(make_job("j-1", key="k" * 256))
    assert store.get("j-1") is None


def test_a_timing_with_no_column_is_a_programming_error(store: SqlJobStore) -> None:
    job = store.insert(make_job("j-1"))
    bad = transition(job, JobState.QUEUED, at=1.0, timings={"invented_at": 2.0})
    with pytest.raises(ValueError, match="invented_at"):
        store.commit([(bad, 0)])
    assert store.get("j-1") == job


def test_sqlite_runs_in_wal_with_full_sync_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    store = SqlJobStore.open(f"sqlite:///{tmp_path}/pragmas.db")
    with store.engine.connect() as conn:
        pragmas = {p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                   for p in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")}
    store.close()
    assert pragmas == {"journal_mode": "wal", "synchronous": 2, "busy_timeout": 15000, "foreign_keys": 1}


def test_a_sqlite_write_lock_held_past_the_busy_timeout_is_a_store_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("broker.store.engines.BUSY_TIMEOUT_S", 0.1)
    url = f"sqlite:///{tmp_path}/locked.db"
    store = SqlJobStore.open(url)
    rival = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    rival.execute("BEGIN IMMEDIATE")  # another process's writer, holding the lock
    try:
        with pytest.raises(StoreError, match="database is locked") as raised:
            store.insert(make_job("j-locked"))
        assert isinstance(raised.value.__cause__, sa.exc.OperationalError)
    finally:
        rival.rollback()
        rival.close()
    assert store.insert(make_job("j-locked")).id == "j-locked"  # the lock gone, the same store writes
    store.close()


# --- errors ------------------------------------------------------------------------------------------------


def test_an_unreachable_server_is_a_store_error(databases: Databases, tmp_path: Path) -> None:
    if databases.backend == "sqlite":
        url = f"sqlite:///{tmp_path}/not-a-dir.db/x/y.db"
        (tmp_path / "not-a-dir.db").write_text("a file where a directory should be")
    else:
        url = databases.server.set(port=1, database="x").render_as_string(hide_password=False)
    with pytest.raises(StoreError) as caught:
        SqlJobStore.open(url)
    assert caught.value.retryable and caught.value.__cause__ is not None


def test_a_failing_statement_is_a_store_error_from_the_driver_error(fresh_url: str) -> None:
    store = SqlJobStore.open(fresh_url)
    try:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE attempts")
        with pytest.raises(StoreError, match="job store get failed") as caught:
            store.get("j-1")
        assert isinstance(caught.value.__cause__, sa.exc.DBAPIError)
        assert caught.value.details["operation"] == "get"
    finally:
        store.close()


@pytest.mark.parametrize("url", ["nosuchdb://x/y", "sqlite://", "sqlite:///:memory:", "://"])
def test_an_unusable_url_is_a_store_error(url: str) -> None:
    with pytest.raises(StoreError):
        SqlJobStore.open(url)


@pytest.mark.parametrize(("given", "driver"), [
    ("mysql://root@h/db", "mysql+pymysql"), ("mariadb://root@h/db", "mariadb+pymysql"),
    ("postgresql://u@h/db", "postgresql+psycopg"), ("postgres://u@h/db", "postgresql+psycopg"),
    ("mysql+pymysql://root@h/db", "mysql+pymysql"), ("sqlite:///x.db", "sqlite"), ("x.db", "sqlite"),
])
def test_plain_urls_get_the_supported_driver(given: str, driver: str) -> None:
    assert normalize_url(given).drivername == driver


def test_mysql_urls_default_to_utf8mb4() -> None:
    assert normalize_url("mysql://root@h/db").query["charset"] == "utf8mb4"


def test_store_calls_from_many_threads_share_one_store(store: SqlJobStore) -> None:
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        try:
            job = store.insert(make_job(f"j-{i:02d}"))
            assert store.commit([(transition(job, JobState.QUEUED, at=1.0), 0)]) == [True]
            store.list_jobs(limit=5)
        except BaseException as exc:  # collected, so one failure does not hide the others
            with lock:
                errors.append(exc)

    race(12, work)
    assert errors == []
    assert len(store.list_jobs(states=[JobState.QUEUED])) == 12


# --- transient failures ------------------------------------------------------------------------------------


def _fail_once(store: SqlJobStore, verb: str, error: Exception) -> list[str]:
    """Make the next statement starting with `verb` raise `error`; returns the statements run."""
    seen: list[str] = []

    def before(conn: sa.Connection, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement.split()[0])
        if statement.startswith(verb) and seen.count(verb) == 1:
            raise error

    sa.event.listen(store.engine, "before_cursor_execute", before)
    return seen


def _job_write(store: SqlJobStore) -> str:
    """The verb of a commit's job-row write: MySQL sends the batch as one multi-row upsert."""
    return "INSERT" if store.engine.dialect.name in ("mysql", "mariadb") else "UPDATE"


def test_a_dropped_connection_before_commit_is_retried(store: SqlJobStore) -> None:
    job = store.insert(make_job("j-1"))
    verb = _job_write(store)
    dropped = sa.exc.OperationalError(verb, {}, ConnectionResetError("gone"), connection_invalidated=True)
    seen = _fail_once(store, verb, dropped)
    queued = transition(job, JobState.QUEUED, at=1.0)
    assert store.commit([(queued, 0)]) == [True]
    assert seen.count(verb) == 2
    assert store.get("j-1") == queued


def test_a_non_transient_failure_is_not_retried(store: SqlJobStore) -> None:
    job = store.insert(make_job("j-1"))
    verb = _job_write(store)
    seen = _fail_once(store, verb, sa.exc.OperationalError(verb, {}, OSError("disk full")))
    with pytest.raises(StoreError, match="disk full"):
        store.commit([(transition(job, JobState.QUEUED, at=1.0), 0)])
    assert seen.count(verb) == 1
    assert store.get("j-1") == job


@pytest.mark.parametrize("databases", ["mariadb", "postgresql"], indirect=True)
def test_connections_the_server_killed_are_replaced_without_an_error(
        store: SqlJobStore, databases: Databases) -> None:
    job = store.insert(make_job("j-1"))
    databases.kill_connections(store.engine.url.database or "")
    queued = transition(job, JobState.QUEUED, at=1.0)
    assert store.commit([(queued, 0)]) == [True]
    assert store.get("j-1") == queued


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(("orig", "transient"), [
    (_PgError("40P01"), True), (_PgError("40001"), True), (_PgError("23505"), False),
    (Exception(1213, "Deadlock found"), True), (Exception(1205, "Lock wait timeout"), True),
    (Exception(1062, "Duplicate entry"), False), (Exception("database is locked"), False),
])
def test_deadlocks_and_serialization_failures_are_transient(orig: Exception, transient: bool) -> None:
    assert is_transient(sa.exc.OperationalError("UPDATE", {}, orig)) is transient


# --- dashboard sessions ------------------------------------------------------------------------------------


def test_dashboard_sessions_round_trip_and_end_with_their_token_or_expiry(store: SqlJobStore) -> None:
    from broker.ports.ui_sessions import UiSession
    from broker.store.ui_sessions import SqlSessionStore

    sessions = SqlSessionStore(store.engine)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM ui_sessions")
    kept, gone = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    rows = [UiSession("1" * 64, "alice", kept, 100.0, 100.0, 1000.0),
            UiSession("2" * 64, "bob", gone, 100.0, 100.0, 1000.0),
            UiSession("3" * 64, "alice", kept, 100.0, 100.0, 150.0),
            UiSession("4" * 64, "carol", "jwt:" + "c" * 64, 100.0, 100.0, 1000.0)]
    for row in rows:
        sessions.put(row)
    assert sessions.get("1" * 64) == rows[0] and sessions.get("f" * 64) is None
    sessions.touch("1" * 64, 160.5)
    assert sessions.get("1" * 64) == dataclasses.replace(rows[0], last_seen=160.5)
    assert sessions.delete_except({kept}, before=200.0) == 2  # bob's token left the file; the third expired
    assert [sessions.get(r.id_digest) is not None for r in rows] == [True, False, False, True]
    sessions.delete("1" * 64)
    assert sessions.get("1" * 64) is None and sessions.get("4" * 64) == rows[3]


def test_a_driver_error_on_the_direct_path_arrives_as_sqlalchemys_and_the_group_stores_nothing(
        store: SqlJobStore) -> None:
    # No cursor listener on this engine: the group's statements go straight to the driver (broker.store.prepared).
    assert not sa.event.contains(store.engine, "before_cursor_execute", lambda *a: None)
    with pytest.raises(ValueError, match="duplicate job id") as refused:  # the driver's IntegrityError, as SQLAlchemy's
        store.commit_group([], [make_job("j-1"), make_job("j-2"), make_job("j-1")])
    assert isinstance(refused.value.__cause__, sa.exc.IntegrityError)
    assert "parameters hidden" in str(refused.value.__cause__)  # job rows (an env's secrets) stay out of messages
    assert store.get("j-1") is None and store.get("j-2") is None


def test_cursor_listeners_see_every_statement_of_a_group_commit(store: SqlJobStore) -> None:
    job = store.insert(make_job("j-1"))
    seen = _fail_once(store, "NO SUCH VERB", RuntimeError("never"))  # a listener that only watches
    assert store.commit([(transition(job, JobState.QUEUED, at=1.0), 0)]) == [True]
    assert _job_write(store) in seen and "SELECT" in seen


def test_groups_larger_than_one_sqlite_statement_holds_insert_claim_and_end_every_job(store: SqlJobStore) -> None:
    # SQLite sends a group's rows as multi-row statements of at most 999 parameters (broker.store.prepared).
    n = 130
    queued = [transition(make_job(f"j-{i:03}"), JobState.QUEUED, at=1.0) for i in range(n)]
    assert store.commit_group([], queued)[1] == queued
    running = []
    for job in queued:
        attempt = Attempt(id=attempt_id(job.id, 0), job_id=job.id, n=0, pods=("cpu-1",))
        running.append(transition(job, JobState.RUNNING, 2.0, attempts=(attempt,), pods=("cpu-1",)))
    stale = dataclasses.replace(running[7], version=running[7].version + 5)  # loses its version check alone
    wins = store.commit([(job, job.version - 1) for job in running] + [(stale, stale.version - 1)])
    assert wins == [True] * n + [False]
    ended = [transition(job.with_attempt(job.attempts[0].move(AttemptState.RUNNING).move(AttemptState.SUCCEEDED)),
                        JobState.SUCCEEDED, 3.0, exit_code=0) for job in running]
    assert store.commit([(job, job.version - 1) for job in ended]) == [True] * n
    assert [store.get(job.id) for job in ended] == ended
