"""The job store's tables as SQLAlchemy Core metadata: what the store queries against.

The DDL itself lives in Alembic revisions (`migrations/versions/`), which never import this module;
`tests/integration/test_store.py` checks that the two describe the same schema on every backend.
Keys compare byte-wise everywhere (PostgreSQL collation "C", a binary collation on MySQL, SQLite's
default), so ids sort and page exactly like Python strings and idempotency keys are case-sensitive.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from broker.jobs import TIMING_FIELDS

ID_LENGTH = 64
"""Longest job id; attempt ids add `:<n>`."""
ATTEMPT_ID_LENGTH = ID_LENGTH + 16
NAME_LENGTH = 255
"""Longest caller, pool, queue, lease tag and idempotency key."""
STATE_LENGTH = 16
ERROR_CLASS_LENGTH = 128

VERSION_TABLE = "firepool_alembic_version"
"""Alembic's bookkeeping table; prefixed so Firepool can share a database with other schemas."""


def key_type(length: int) -> sa.types.TypeEngine[str]:
    """A string compared byte-wise on every backend (MySQL gets a binary collation per table)."""
    return sa.String(length).with_variant(postgresql.VARCHAR(length, collation="C"), "postgresql")


def long_text() -> sa.types.TypeEngine[str]:
    """Text of any length (JSON documents, error messages); LONGTEXT on MySQL, whose TEXT stops at 64 KiB."""
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


MYSQL_TABLE_OPTIONS: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

metadata = sa.MetaData()

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", key_type(ID_LENGTH), primary_key=True),
    sa.Column("caller", key_type(NAME_LENGTH), nullable=False),
    sa.Column("pool", key_type(NAME_LENGTH), nullable=False),
    sa.Column("state", sa.String(STATE_LENGTH), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("priority", sa.Integer(), nullable=False),
    sa.Column("queue", key_type(NAME_LENGTH), nullable=False),
    sa.Column("lease_tag", key_type(NAME_LENGTH), nullable=False),
    sa.Column("idempotency_key", key_type(NAME_LENGTH), nullable=True),
    sa.Column("pods", sa.Integer(), nullable=False),
    sa.Column("retries", sa.Integer(), nullable=False),
    sa.Column("max_retries", sa.Integer(), nullable=False),
    sa.Column("exit_code", sa.Integer(), nullable=True),
    sa.Column("error_class", sa.String(ERROR_CLASS_LENGTH), nullable=True),
    sa.Column("error_message", long_text(), nullable=True),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    sa.Column("spec", long_text(), nullable=False),
    sa.Column("pods_bound", long_text(), nullable=False),
    sa.Column("acquisition", long_text(), nullable=False),
    sa.Column("dropped_env", long_text(), nullable=False),
    *(sa.Column(name, sa.Double(), nullable=True) for name in TIMING_FIELDS),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.UniqueConstraint("caller", "idempotency_key", name="uq_jobs_caller_idempotency_key"),
    sa.Index("ix_jobs_caller_id", "caller", "id"),
    sa.Index("ix_jobs_state_id", "state", "id"),  # 0004_ui_indexes: the dashboard pages by state (0006: the only state index)
    sa.Index("ix_jobs_pool_id", "pool", "id"),
    **MYSQL_TABLE_OPTIONS,
)

attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column("id", key_type(ATTEMPT_ID_LENGTH), primary_key=True),
    sa.Column("job_id", key_type(ID_LENGTH), sa.ForeignKey("jobs.id", name="fk_attempts_job_id",
                                                            ondelete="CASCADE"), nullable=False),
    sa.Column("n", sa.Integer(), nullable=False),
    sa.Column("pods", long_text(), nullable=False),
    sa.Column("state", sa.String(STATE_LENGTH), nullable=False),
    sa.Column("launched_at", sa.Double(), nullable=True),
    sa.Column("first_instruction_at", sa.Double(), nullable=True),
    sa.Column("finished_at", sa.Double(), nullable=True),
    sa.Column("exit_code", sa.Integer(), nullable=True),
    sa.Column("error_class", sa.String(ERROR_CLASS_LENGTH), nullable=True),
    sa.Column("message", long_text(), nullable=True),
    sa.Column("timings", long_text(), nullable=True),
    sa.Index("ix_attempts_job_id_n", "job_id", "n"),
    **MYSQL_TABLE_OPTIONS,
)

EVENT_KIND_LENGTH = 64

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double(), nullable=False),
    sa.Column("kind", sa.String(EVENT_KIND_LENGTH), nullable=False),
    sa.Column("subject", key_type(NAME_LENGTH), nullable=False),
    sa.Column("why", long_text(), nullable=False),
    sa.Column("cost_gpu_s", sa.Double(), nullable=True),
    sa.Column("caller", key_type(NAME_LENGTH), nullable=True),
    sa.Column("detail", long_text(), nullable=False),
    sa.Index("ix_events_at", "at"),
    sa.Index("ix_events_caller_id", "caller", "id"),
    **MYSQL_TABLE_OPTIONS,
)
"""The fleet's event log (broker.events): preemptions, reservation alerts, hold breaks, budget throttling."""
quarantine = sa.Table(
    "quarantine",
    metadata,
    sa.Column("key", key_type(NAME_LENGTH), primary_key=True),
    sa.Column("kind", sa.String(STATE_LENGTH), nullable=False),
    sa.Column("node", key_type(NAME_LENGTH), nullable=False),
    sa.Column("failures", sa.Integer(), nullable=False),
    sa.Column("reason", long_text(), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.Column("quarantined_at", sa.Double(), nullable=True),
    sa.Column("released_at", sa.Double(), nullable=True),
    sa.Column("released_by", key_type(NAME_LENGTH), nullable=True),
    **MYSQL_TABLE_OPTIONS,
)
"""Devices and nodes with hardware-class failures (broker.health.quarantine), kept across restarts."""

DIGEST_LENGTH = 80
"""A `sha256:<hex>` or `jwt:<hex>` digest (71 characters), with room."""

ui_sessions = sa.Table(
    "ui_sessions",
    metadata,
    sa.Column("id_digest", key_type(DIGEST_LENGTH), primary_key=True),
    sa.Column("caller", key_type(NAME_LENGTH), nullable=False),
    sa.Column("token_digest", key_type(DIGEST_LENGTH), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("last_seen", sa.Double(), nullable=False),
    sa.Column("expires_at", sa.Double(), nullable=False),
    sa.Index("ix_ui_sessions_token_digest", "token_digest"),
    **MYSQL_TABLE_OPTIONS,
)
"""Dashboard sessions (broker.ui.session), by the digest of their id; 0007_ui_sessions."""

leadership = sa.Table(
    "leadership",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("term", sa.BigInteger(), nullable=False),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("url", sa.String(1024), nullable=False),
    sa.Column("beat", sa.BigInteger(), nullable=False),
    sa.Column("since", sa.Double(), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)
"""One row (id 1): the leading broker, its term and heartbeat (broker.store.leadership); 0008_leadership."""
