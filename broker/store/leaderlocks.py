"""The store's own lock that one broker holds while it leads: the fast half of the election (broker.store.leadership).

A lock held on a dedicated database session is released by the database the moment that session ends, so a
SIGKILLed leader's lock is free within milliseconds and a standby blocked on it wakes at once:

- PostgreSQL: a session advisory lock (`pg_advisory_lock`), waited for under a `lock_timeout`;
- MariaDB/MySQL: a named lock (`GET_LOCK`, server-wide, so named after the database);
- SQLite: an exclusive `flock` on a file beside the database (all brokers of one SQLite file share its host).

A leader that is paused or cut off keeps its session, and with it the lock: `break_holder` ends that session
(`pg_terminate_backend`, `KILL CONNECTION`) once the standby has seen its heartbeat stop for a whole lease. A
file lock cannot be taken from a live process: on SQLite a paused leader keeps leading when it wakes (it was
never replaced, so nothing it does conflicts), and the standbys wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import zlib
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

POLL_S = 0.005
"""How often a file lock is tried while a standby waits (a database lock wakes its waiter itself)."""


class StoreLock(Protocol):
    def acquire(self, wait_s: float) -> bool:
        """Take the lock, waiting at most `wait_s`; True once held."""

    def check(self) -> None:
        """Raise if the lock is no longer held (its session was ended)."""

    def break_holder(self) -> bool:
        """End the session of whoever holds the lock; False where that is impossible."""

    def session(self, conn: sa.Connection) -> int:
        """The database's id of `conn`'s session (0 where sessions have none), as its driver knows it."""

    def end_blockers(self, session: int) -> int:
        """End the sessions whose transactions block `session`'s statement; how many were ended."""

    def close(self) -> None:
        """Release the lock (ending its session)."""


def lock_for(engine: sa.Engine) -> StoreLock:
    name = engine.dialect.name
    if name == "postgresql":
        return PostgresLock(engine)
    if name in ("mysql", "mariadb"):
        return MysqlLock(engine)
    return FileLock(Path(f"{engine.url.database}.leader"))


def _dedicated(engine: sa.Engine) -> Any:
    """A DBAPI connection of the engine's settings that belongs to no pool: its session is the lock's life."""
    raw = engine.raw_connection()
    driver: Any = raw.driver_connection
    raw.detach()
    if engine.dialect.name == "postgresql":
        driver.autocommit = True
    else:
        driver.autocommit(True)
    return driver


class PostgresLock:
    KEY = zlib.crc32(b"firepool.leader") & 0x7FFFFFFF
    """One advisory lock key (advisory locks are per database); below 2**31, so pg_locks shows it as objid."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.conn: Any = None

    def acquire(self, wait_s: float) -> bool:
        if self.conn is None:
            self.conn = _dedicated(self.engine)
        with self.conn.cursor() as cur:
            cur.execute(f"SET lock_timeout = '{max(1, int(wait_s * 1000))}ms'")
            try:
                cur.execute("SELECT pg_advisory_lock(%s)", (self.KEY,))
            except Exception as exc:  # psycopg's LockNotAvailable: someone holds it
                if getattr(exc, "sqlstate", None) == "55P03":
                    return False
                raise
            cur.execute("SET lock_timeout = 0")
        return True

    def check(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT 1")

    def break_holder(self) -> bool:
        with self.engine.connect() as conn:
            ended = conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = 0 AND objid = :key AND objsubid = 1"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
                {"key": self.KEY}).scalars().all()
            conn.commit()
        return any(ended)

    def session(self, conn: sa.Connection) -> int:
        return int(conn.connection.driver_connection.info.backend_pid)  # type: ignore[union-attr]

    def end_blockers(self, session: int) -> int:
        with self.engine.connect() as conn:
            ended = conn.execute(sa.text("SELECT pg_terminate_backend(b) FROM unnest(pg_blocking_pids(:pid)) AS b"),
                                 {"pid": session}).scalars().all()
            conn.commit()
        return sum(1 for e in ended if e)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a session the server already ended
                conn.close()


class MysqlLock:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.name = f"firepool.leader.{engine.url.database}"[:64]  # GET_LOCK names are server-wide, 64 at most
        self.conn: Any = None

    def acquire(self, wait_s: float) -> bool:
        if self.conn is None:
            self.conn = _dedicated(self.engine)
        with self.conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, %s)", (self.name, round(wait_s, 3)))
            (got,) = cur.fetchone()
        return bool(got == 1)

    def check(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (self.name,))
            (mine,) = cur.fetchone()
        if mine != 1:
            raise RuntimeError(f"the store lock {self.name} is no longer held by this session")

    def break_holder(self) -> bool:
        with self.engine.connect() as conn:
            holder = conn.execute(sa.text("SELECT IS_USED_LOCK(:name)"), {"name": self.name}).scalar()
            if holder is None:
                return False
            conn.exec_driver_sql(f"KILL CONNECTION {int(holder)}")
        return True

    def session(self, conn: sa.Connection) -> int:
        return int(conn.connection.driver_connection.thread_id())  # type: ignore[union-attr]

    def end_blockers(self, session: int) -> int:
        with self.engine.connect() as conn:
            blockers = conn.execute(sa.text(
                "SELECT DISTINCT b.trx_mysql_thread_id FROM information_schema.INNODB_LOCK_WAITS w"
                " JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id"
                " JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id"
                " WHERE r.trx_mysql_thread_id = :id"), {"id": session}).scalars().all()
            for thread in blockers:
                conn.exec_driver_sql(f"KILL CONNECTION {int(thread)}")
        return len(blockers)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a session the server already ended
                conn.close()


class FileLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self, wait_s: float) -> bool:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(POLL_S)

    def check(self) -> None:
        pass  # a file lock is held until this process releases it or ends

    def break_holder(self) -> bool:
        return False

    def session(self, conn: sa.Connection) -> int:
        return 0

    def end_blockers(self, session: int) -> int:
        return 0  # SQLite has one writer at a time and no sessions to end: a writer waits out busy_timeout

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
