"""Statements compiled once for the engine's dialect and run with plain driver parameters.

SQLAlchemy Core caches a statement's compiled form, but it still builds every parameter set of an
executemany itself: one dict per row and every value through the bind machinery, on each call. For a group
commit of a thousand rows that was the largest part of the store's CPU per job. A `Prepared` statement
is compiled once; its rows go to the driver as tuples in the statement's parameter order (qmark and
format dialects: SQLite, PyMySQL) or as the dicts the caller built (pyformat: psycopg), on the driver's own
cursor; the driver's errors still arrive as SQLAlchemy's `DBAPIError`, so the store's retry and translation apply
unchanged.

Bind processors: Boolean's (bool to 1/0 where the database has no boolean) and Double's on SQLite (int to
float) are skipped, because every driver here binds a Python bool as 1/0 or boolean and a column
declared DOUBLE stores an int as a double; any other type's processor is applied.
`PreparedIn` is the same for one statement with an expanding `IN` list (the group commit's locking read), whose
cache key SQLAlchemy would otherwise rebuild from every id on each call; `PreparedRows` sends many rows as one
statement (SQLite). All run on the driver's own cursor (`driver_run`). `job_upsert` and `attempt_upsert` build the
dialects' upserts the store prepares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from broker.store.schema import attempts, jobs

_NATIVE: tuple[type[sa.types.TypeEngine[Any]], ...] = (sa.Boolean, sa.Float)
"""Types whose values every supported driver binds as the processor would have made them (see above)."""
SQLITE_MAX_VARIABLES = 999
"""Parameters one SQLite statement may hold in every release (3.32 raised the default to 32,766)."""
_STATEMENTS_KEPT = 64


class Prepared:
    """One statement with a fixed set of bound names, ready for `run(conn, rows)`."""

    def __init__(self, stmt: ClauseElement, dialect: sa.Dialect, keys: Sequence[str] | None = None) -> None:
        compiled = stmt.compile(dialect=dialect, column_keys=list(keys) if keys is not None else None)
        assert isinstance(compiled, SQLCompiler)
        if compiled.escaped_bind_names:
            raise ValueError(f"bound names need escaping: {sorted(compiled.escaped_bind_names)}")
        self.sql = compiled.string
        self.positional = compiled.positional
        self.names: tuple[str, ...] = (
            tuple(compiled.positiontup or ()) if compiled.positional else tuple(compiled.bind_names.values())
        )
        binds = {name: bind for bind, name in compiled.bind_names.items()}
        processors: dict[str, Callable[[Any], Any]] = {}
        for name in self.names:
            kind = binds[name].type
            process = kind.dialect_impl(dialect).bind_processor(dialect)
            if process is not None and not isinstance(kind, _NATIVE):
                processors[name] = process
        self._processors = processors
        self._row: Callable[[Mapping[str, Any]], Any] | None = None
        if self.positional:
            getter = itemgetter(*self.names)
            self._row = getter if len(self.names) > 1 else (lambda row: (getter(row),))
            self._where = [(i, processors[name]) for i, name in enumerate(self.names) if name in processors]

    def params(self, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The driver's parameter sets for `rows` (each a mapping holding at least every bound name)."""
        if not self.positional:
            if not self._processors:
                return list(rows)
            return [{**row, **{n: p(row[n]) for n, p in self._processors.items()}} for row in rows]
        assert self._row is not None
        values = [self._row(row) for row in rows]
        if self._where:
            processed = []
            for vs in values:
                changed = list(vs)
                for i, process in self._where:
                    changed[i] = process(changed[i])
                processed.append(tuple(changed))
            values = processed
        return values

    def run(self, conn: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> int:
        """Execute once per row (one executemany); returns the rows the database reports changed."""
        if not rows:
            return 0
        return driver_run(conn, self.sql, self.params(rows), many=True)[0]


def _row_marks(prepared: Prepared) -> str:
    """One row of `prepared`'s qmark parameters: `(?, ?, ...)`."""
    return "(" + ", ".join("?" * len(prepared.names)) + ")"


class PreparedRows:
    """A `Prepared` statement of many rows sent as one statement a chunk of rows: `head (row), (row), ... tail`.

    For SQLite: its driver releases the GIL at every step of a statement, and beside a busy event loop each release
    and retake costs the store writer a thread hand-off (25-100 us of CPU on a shared 2-core VM, more than the row's
    own write). An executemany steps once a row; this once a chunk. Build it with `inserting` or `updating`."""

    def __init__(self, prepared: Prepared, head: str, tail: str, max_variables: int = SQLITE_MAX_VARIABLES) -> None:
        if not prepared.positional:
            raise ValueError("multi-row statements are built for positional (qmark) parameters")
        self._prepared = prepared
        self._one = _row_marks(prepared)
        self._head, self._tail = head, tail
        self._chunk = max(1, max_variables // len(prepared.names))
        self._sql: dict[int, str] = {}
        """Row count -> its statement."""

    @classmethod
    def inserting(cls, prepared: Prepared) -> PreparedRows:
        """`INSERT ... VALUES (...), (...)` (an upsert's conflict clause kept) from a one-row INSERT."""
        head, found, tail = prepared.sql.partition(f" VALUES {_row_marks(prepared)}")
        if not found or "?" in head + tail:
            raise ValueError(f"not a one-row INSERT: {prepared.sql[:80]}")
        return cls(prepared, head + " VALUES ", tail)

    @classmethod
    def updating(cls, prepared: Prepared, dialect: sa.Dialect, table: str, columns: Sequence[str],
                 where: Mapping[str, str]) -> PreparedRows:
        """SQLite's `UPDATE table SET c = v.c ... FROM (VALUES ...) AS v WHERE table.k = v.<param> ...` (3.33+) for
        an UPDATE whose parameters are `columns` and `where`'s values (the table's column each one must equal)."""
        quote = dialect.identifier_preparer.quote
        value = {name: f"v.column{i + 1}" for i, name in enumerate(prepared.names)}
        head = (f"UPDATE {quote(table)} SET " + ", ".join(f"{quote(c)} = {value[c]}" for c in columns)
                + " FROM (VALUES ")
        tail = ") AS v WHERE " + " AND ".join(f"{quote(table)}.{quote(c)} = {value[p]}" for c, p in where.items())
        if set(value) != {*columns, *where.values()}:
            raise ValueError(f"the statement's parameters {sorted(value)} are not the columns and keys given")
        return cls(prepared, head, tail)

    def run(self, conn: sa.Connection, rows: Sequence[Mapping[str, Any]]) -> int:
        """Every row, a chunk a statement; returns the rows the database reports changed."""
        changed = 0
        for start in range(0, len(rows), self._chunk):
            chunk = rows[start:start + self._chunk]
            sql = self._sql.get(len(chunk))
            if sql is None:
                if len(self._sql) >= _STATEMENTS_KEPT:
                    self._sql.clear()
                sql = self._sql[len(chunk)] = self._head + ", ".join([self._one] * len(chunk)) + self._tail
            params = tuple(chain.from_iterable(self._prepared.params(chunk)))
            changed += driver_run(conn, sql, params, many=False)[0]
        return changed


class PreparedIn:
    """A statement with one expanding `IN` parameter (`bindparam(name, expanding=True)`), compiled once."""

    def __init__(self, stmt: ClauseElement, dialect: sa.Dialect, name: str) -> None:
        compiled = stmt.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        self._compiled = compiled
        self._name = name
        self._expanded: dict[int, tuple[str, tuple[str, ...]]] = {}
        """Padded list length -> the expanded statement and its parameter names in order."""

    def rows(self, conn: sa.Connection, values: Sequence[Any]) -> list[Any]:
        """The statement's rows for these values of the `IN` list (which must not be empty).

        The list is padded to a power of two by repeating its last value (`x IN (a, b, b)` selects what
        `x IN (a, b)` does), so a handful of expanded statements serve every length; each is expanded by
        SQLAlchemy once and then only given the values."""
        size = 1 << (len(values) - 1).bit_length()
        padded = [*values, *[values[-1]] * (size - len(values))]
        expanded = self._expanded.get(size)
        if expanded is None:
            markers = [f"\x00{i}" for i in range(size)]
            state = self._compiled.construct_expanded_state({self._name: markers})
            names: tuple[str, ...] = () if self._compiled.positional else tuple(state.parameters)
            sent = (
                list(state.positional_parameters)
                if self._compiled.positional
                else list(state.parameters.values())
            )
            if sent != markers:  # the list must be the statement's only parameters, in order
                raise ValueError(f"unexpected parameters in the expanded statement: {sent[:3]}...")
            expanded = self._expanded[size] = (state.statement, names)
        statement, order = expanded
        params: Any = tuple(padded) if self._compiled.positional else dict(zip(order, padded, strict=True))
        return driver_run(conn, statement, params, many=False)[1]


def driver_run(conn: sa.Connection, sql: str, params: Any, *, many: bool) -> tuple[int, list[Any]]:
    """`sql` in `conn`'s open transaction: every row set of `params` (`many`, DML), or the one; returns the rows the
    database reports changed and the rows read.

    Straight to a cursor of the driver: `exec_driver_sql`'s statement machinery (execution context, events, result
    object) cost a group commit more than its own writes (~30 % of the store writer's CPU a commit). As
    `exec_driver_sql` would, a driver error is raised as SQLAlchemy's `DBAPIError` subclass for it, and a connection
    the driver lost is invalidated so the pool never hands it out again. An engine with cursor or error listeners
    (tracing instrumentation, tests injecting failures) gets `exec_driver_sql` itself, so they see every statement."""
    dialect = conn.dialect
    if conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute or dialect.dispatch.handle_error:
        result = conn.exec_driver_sql(sql, params)
        return result.rowcount, (list(result) if result.returns_rows else [])
    driver = conn.connection.dbapi_connection
    assert driver is not None
    cursor = driver.cursor()
    try:
        if many:
            cursor.executemany(sql, params)
            return cursor.rowcount, []
        cursor.execute(sql, params)
        return cursor.rowcount, list(cursor.fetchall())
    except dialect.loaded_dbapi.Error as exc:
        lost = bool(dialect.is_disconnect(exc, driver, cursor))
        if lost:
            conn.invalidate(exc)
        # Parameters never go into the message: they are whole job rows (a spec's env may hold a caller's secret).
        raise sa.exc.DBAPIError.instance(sql, params, exc, dialect.loaded_dbapi.Error, hide_parameters=True,
                                         connection_invalidated=lost, dialect=dialect) from exc
    finally:
        cursor.close()


def job_upsert() -> sa.Insert:
    """MySQL's update of whole job rows known to exist (the group commit's batched write)."""
    stmt = mysql.insert(jobs)
    return stmt.on_duplicate_key_update({c.name: stmt.inserted[c.name] for c in jobs.columns
                                         if c.name not in ("id", "created_at")})


def attempt_upsert(dialect: str) -> sa.Insert:
    """Insert or update attempt rows, in the dialect's own upsert."""
    mutable = [c.name for c in attempts.columns if c.name != "id"]
    if dialect in ("mysql", "mariadb"):
        stmt = mysql.insert(attempts)
        return stmt.on_duplicate_key_update({name: stmt.inserted[name] for name in mutable})
    if dialect == "postgresql":
        pg = postgresql.insert(attempts)
        return pg.on_conflict_do_update(index_elements=[attempts.c.id],
                                        set_={name: pg.excluded[name] for name in mutable})
    lite = sqlite.insert(attempts)
    return lite.on_conflict_do_update(index_elements=[attempts.c.id],
                                      set_={name: lite.excluded[name] for name in mutable})

