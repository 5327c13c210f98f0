"""Schema upgrades through Alembic, built in code: no alembic.ini, the revisions ship in the package.

Upgrades are serialised twice. In this process one lock covers every upgrade, because Alembic keeps
its `context`/`op` proxies in module globals. Across processes (several brokers starting together)
the database serialises them: a transaction-scoped advisory lock on PostgreSQL, a named lock on
MySQL, and BEGIN IMMEDIATE on SQLite, whose DDL then runs inside that one transaction.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from broker.store.engines import WRITE
from broker.store.schema import VERSION_TABLE

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
LOCK_NAME = "firepool.store.migrate"
LOCK_TIMEOUT_S = 120

_process_lock = threading.Lock()


def alembic_config(url: str | None = None) -> Config:
    """The Alembic config for the job store; `url` is only needed by the `alembic` command line."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def known_revisions() -> set[str]:
    return {r.revision for r in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade(engine: sa.Engine) -> None:
    """`alembic upgrade head` on `engine`'s database; a no-op when it is already there."""
    with _process_lock, engine.connect() as conn:
        conn.execution_options(**{WRITE: True})
        name = conn.dialect.name
        mysql = name in ("mysql", "mariadb")
        if mysql:
            _mysql_lock(conn)
            conn.commit()  # GET_LOCK autobegan a transaction; the named lock outlives it
        try:
            with conn.begin():
                if name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"),
                                 {"key": zlib.crc32(LOCK_NAME.encode())})
                config = alembic_config()
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
        finally:
            # Only after the commit: the version row must be visible before the next process looks.
            if mysql:
                conn.execute(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": _mysql_lock_name(conn)})
                conn.commit()


def _mysql_lock_name(conn: sa.Connection) -> str:
    database = conn.exec_driver_sql("SELECT DATABASE()").scalar() or ""
    return f"{LOCK_NAME}:{database}"[:64]


def _mysql_lock(conn: sa.Connection) -> None:
    # GET_LOCK is per connection and survives the implicit commits MySQL makes around DDL.
    got = conn.execute(sa.text("SELECT GET_LOCK(:name, :timeout)"),
                       {"name": _mysql_lock_name(conn), "timeout": LOCK_TIMEOUT_S}).scalar()
    if got != 1:
        raise sa.exc.OperationalError("SELECT GET_LOCK", {}, TimeoutError(
            f"another process held the migration lock for {LOCK_TIMEOUT_S} s"))
