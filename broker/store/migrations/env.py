"""Alembic environment for the job store: runs on the caller's connection when one is handed in.

`broker.store.migrating` passes an open connection (inside its transaction and migration lock) through
`config.attributes["connection"]`; the `alembic` command line instead connects to `sqlalchemy.url`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from broker.store.schema import VERSION_TABLE, metadata

config = context.config


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    if context.is_offline_mode():
        context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                          version_table=VERSION_TABLE, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from broker.store.engines import create_store_engine  # the command line: same URLs and pragmas

    engine = create_store_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


_main()
