"""Database errors as the store reports them: `translated` turns library errors into `StoreError` (the driver's
message only: never SQLAlchemy's, which would echo the statement and a job's values), and `transient` says which
failures a transaction may simply run again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from alembic.util import CommandError

from broker.errors import StoreError

_RETRY_SQLSTATES = {"40001", "40P01"}  # PostgreSQL: serialization failure, deadlock detected
_RETRY_MYSQL_CODES = {1205, 1213}  # MySQL: lock wait timeout, deadlock


@contextlib.contextmanager
def translated(operation: str) -> Iterator[None]:
    """The one place library errors become `StoreError`."""
    try:
        yield
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"job store {operation} failed: {_describe(exc)}",
                         {"operation": operation, "cause": type(exc).__name__}) from exc
    except (CommandError, OSError) as exc:
        raise StoreError(f"job store {operation} failed: {exc}", {"operation": operation}) from exc


def _describe(exc: sa.exc.SQLAlchemyError) -> str:
    cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


def transient(exc: sa.exc.DBAPIError) -> bool:
    """A dropped connection, a serialization failure, a deadlock or a lock wait timeout: worth another try."""
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _RETRY_SQLSTATES:
        return True
    code = orig.args[0] if orig is not None and orig.args else None
    return isinstance(code, int) and code in _RETRY_MYSQL_CODES
