"""Store URLs to SQLAlchemy engines: driver choice, connection pools and SQLite's pragmas.

SQLite runs in WAL mode with synchronous=FULL, a busy timeout and foreign keys on. Its transactions
are begun by us, not by the sqlite3 module: writes with BEGIN IMMEDIATE, so a writer queues for the
database lock at BEGIN (where busy_timeout applies) instead of failing when a read snapshot goes stale.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import QueuePool

WRITE = "firepool_write"
"""Execution option marking a connection whose next transaction writes (BEGIN IMMEDIATE on SQLite)."""

BUSY_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 10
POOL_SIZE = 8
MAX_OVERFLOW = 16

_DRIVERS = {
    "sqlite": "sqlite",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
}


def normalize_url(url: str) -> sa.URL:
    """Pick the supported driver for plain `mysql://` / `postgresql://` URLs; a bare path is a SQLite file."""
    if "://" not in url:
        url = "sqlite:///" + url
    parsed = make_url(url)
    scheme = parsed.drivername
    if "+" not in scheme:
        if scheme not in _DRIVERS:
            raise sa.exc.ArgumentError(f"unsupported job store URL scheme {scheme!r}")
        parsed = parsed.set(drivername=_DRIVERS[scheme])
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "mysql", "mariadb", "postgresql"):
        raise sa.exc.ArgumentError(f"unsupported job store backend {backend!r}")
    if backend in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise sa.exc.ArgumentError("the job store needs a SQLite file; use MemoryJobStore for memory")
        parsed = parsed.set(database=os.path.expanduser(database))
    return parsed


_EXTRAS = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}
"""The pyproject extra that installs each server backend's driver."""


class MissingDriver(sa.exc.ArgumentError):
    """The URL's database driver is not installed; the message names the extra that installs it."""


def require_driver(url: str | sa.URL) -> None:
    """MissingDriver (one line, naming the extra) when the driver of `url` cannot be imported; nothing
    else is touched, so this runs before a broker starts anything."""
    parsed = normalize_url(url) if isinstance(url, str) else url
    try:
        parsed.get_dialect().import_dbapi()
    except ImportError:
        backend = parsed.get_backend_name()
        extra = _EXTRAS.get(backend, backend)
        raise MissingDriver(f"a {backend} job store needs the {parsed.get_driver_name()} driver, which is not "
                            f"installed: pip install -e '.[{extra}]' in the checkout") from None


def create_store_engine(url: str) -> sa.Engine:
    """An engine for `url`, pooled for use from many threads."""
    parsed = normalize_url(url)
    require_driver(parsed)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    kwargs: dict[str, Any] = {
        "pool_size": POOL_SIZE,
        "max_overflow": MAX_OVERFLOW,
        "pool_recycle": 1800,  # below MySQL's wait_timeout and most proxies' idle limits
        "connect_args": {"connect_timeout": CONNECT_TIMEOUT_S},
    }
    if backend in ("mysql", "mariadb"):
        # Row locks only, no gap locks: the version-checked UPDATEs and attempt upserts of concurrent
        # group commits then contend on the rows they write, not on the index ranges between them.
        # (With binary logging on this needs binlog_format ROW or MIXED, the MySQL 8 / MariaDB default.)
        kwargs["isolation_level"] = "READ COMMITTED"
    return sa.create_engine(parsed, **kwargs)


def _sqlite_engine(url: sa.URL) -> sa.Engine:
    Path(url.database or "").parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url,
        poolclass=QueuePool,
        pool_size=POOL_SIZE,
        max_overflow=MAX_OVERFLOW,
        # LIFO: the store writer gets back the connection it just returned, whose page cache is warm; FIFO rotated it
        # through the pool, and each connection re-read the pages the others had written (3.8 preads a job, now 0.5).
        pool_use_lifo=True,
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # the "begin" hook below emits BEGIN itself
        cursor = dbapi_connection.cursor()
        try:
            mode = _enter_wal(cursor)
            if mode.lower() != "wal":
                raise sa.exc.OperationalError("PRAGMA journal_mode=WAL", {}, RuntimeError(
                    f"SQLite refused WAL mode (got {mode!r}); is the file on a network filesystem?"))
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        # Straight to the driver: through exec_driver_sql, SQLAlchemy's statement machinery cost a group commit
        # more than its own writes (~4 % of a batched job's broker CPU). SQLAlchemy sends no BEGIN of its own
        # here (isolation_level=None above) and commits through the same driver connection.
        # SQLAlchemy calls this hook outside its own error translation: a driver error (a lock held past the busy
        # timeout) is wrapped here, as exec_driver_sql would, so the store sees its usual OperationalError.
        statement = "BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN"
        driver = conn.connection.dbapi_connection
        assert driver is not None
        try:
            driver.execute(statement)
        except sqlite3.Error as exc:
            raise sa.exc.DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc

    return engine


def _enter_wal(cursor: sqlite3.Cursor) -> str:
    """Switch to WAL (persistent: a no-op once the file is in it) and return the mode SQLite reports.

    Switching needs the database to itself, and SQLite answers SQLITE_BUSY at once, without the busy handler,
    while another connection opening the same fresh file holds it: several brokers or threads opening a new
    database together would fail at random. Retried here until the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return str(cursor.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)
