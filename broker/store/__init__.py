"""The durable job store: SQLite, MySQL/MariaDB or PostgreSQL through SQLAlchemy Core, schema by Alembic.

`SqlJobStore.open(url)` is the entry point; `sql` owns the store, `schema` the tables, `rows` the
row mapping, `engines` URLs and connection setup, `migrating` the Alembic upgrade.
"""

from broker.store.sql import SqlJobStore

__all__ = ["SqlJobStore"]
