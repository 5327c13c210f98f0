"""Throwaway databases for the store tests: a SQLite file, or `fp_test_<random>` on a real server.

`tests/integration/test_store.py` holds the fixtures built on `Databases`.

Servers default to MariaDB at 127.0.0.1:3306 (root, no password) and PostgreSQL at 127.0.0.1:5432
(postgres, trust auth); FIREPOOL_TEST_MYSQL_URL / FIREPOOL_TEST_PG_URL override them with a server URL
without a database name. An unreachable server fails the tests: CI must start it, never skip it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.store.engines import normalize_url

BACKENDS = ("sqlite", "mariadb", "postgresql")

SERVERS = {
    "mariadb": ("FIREPOOL_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306"),
    "postgresql": ("FIREPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432"),
}


class Databases:
    """Creates and drops databases of one backend; `create()` returns a store URL."""

    def __init__(self, backend: str, tmp: Path) -> None:
        self.backend = backend
        self._tmp = tmp
        self._made: list[str] = []
        self._admin: sa.Engine | None = None
        if backend in SERVERS:
            env, default = SERVERS[backend]
            self.server = normalize_url(os.environ.get(env) or default)
            admin = self.server.set(database="postgres" if backend == "postgresql" else None)
            self._admin = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
            try:
                with self._admin.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
            except sa.exc.DBAPIError as exc:
                self._admin.dispose()
                pytest.fail(f"{backend} is not reachable at {self.server.render_as_string()} ({exc.orig}); "
                            f"start it, or point {env} at one", pytrace=False)

    def create(self) -> str:
        name = f"fp_test_{secrets.token_hex(4)}"
        self._made.append(name)
        if self._admin is None:
            return f"sqlite:///{self._tmp / name}.db"
        with self._admin.connect() as conn:
            if self.backend == "postgresql":
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            else:
                conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        return self.server.set(database=name).render_as_string(hide_password=False)

    def kill_connections(self, database: str) -> None:
        """End every server session connected to `database`, as a failover or an idle timeout would."""
        assert self._admin is not None
        with self._admin.connect() as conn:
            if self.backend == "postgresql":
                conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                     " WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": database})
                return
            ids = conn.execute(sa.text("SELECT id FROM information_schema.processlist WHERE db = :db"),
                               {"db": database}).scalars().all()
            for session in ids:
                conn.exec_driver_sql(f"KILL {int(session)}")

    def drop_all(self) -> None:
        if self._admin is None:
            return
        with self._admin.connect() as conn:
            for name in self._made:
                if self.backend == "postgresql":
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                else:
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        self._admin.dispose()
