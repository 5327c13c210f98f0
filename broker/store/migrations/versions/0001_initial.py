"""Jobs and attempts.

Revision ID: 0001
Revises:
Create Date: 2025-11-29

Revisions never import broker.store.schema: each one freezes the DDL of its day. Keys compare byte-wise
on every backend (collation "C" on PostgreSQL, a binary no-pad collation on MySQL/MariaDB where the
server has one), so ids page like Python strings and idempotency keys are case- and space-sensitive.
Floats are double precision everywhere; JSON documents and messages are unbounded text (LONGTEXT on
MySQL).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TIMING_FIELDS = (
    "submitted_at", "queued_at", "claimed_at", "committed_at",
    "handed_off_at", "first_instruction_at", "finished_at",
)


def _key(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(postgresql.VARCHAR(length, collation="C"), "postgresql")


def _long_text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def _table_options() -> dict[str, Any]:
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return {}
    # Prefer NO PAD: with PAD SPACE collations 'k' and 'k ' would collide as idempotency keys.
    available = set(bind.exec_driver_sql(
        "SELECT collation_name FROM information_schema.collations"
        " WHERE collation_name IN ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin')").scalars())
    collation = next((c for c in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin") if c in available), "utf8mb4_bin")
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}


def upgrade() -> None:
    options = _table_options()
    op.create_table(
        "jobs",
        sa.Column("id", _key(64), primary_key=True),
        sa.Column("caller", _key(255), nullable=False),
        sa.Column("pool", _key(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("queue", _key(255), nullable=False),
        sa.Column("lease_tag", _key(255), nullable=False),
        sa.Column("idempotency_key", _key(255), nullable=True),
        sa.Column("pods", sa.Integer(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(128), nullable=True),
        sa.Column("error_message", _long_text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("spec", _long_text(), nullable=False),
        sa.Column("pods_bound", _long_text(), nullable=False),
        sa.Column("acquisition", _long_text(), nullable=False),
        sa.Column("dropped_env", _long_text(), nullable=False),
        *(sa.Column(name, sa.Double(), nullable=True) for name in TIMING_FIELDS),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.UniqueConstraint("caller", "idempotency_key", name="uq_jobs_caller_idempotency_key"),
        **options,
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_caller_id", "jobs", ["caller", "id"])
    op.create_table(
        "attempts",
        sa.Column("id", _key(80), primary_key=True),
        sa.Column("job_id", _key(64), sa.ForeignKey("jobs.id", name="fk_attempts_job_id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("pods", _long_text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("launched_at", sa.Double(), nullable=True),
        sa.Column("first_instruction_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(128), nullable=True),
        sa.Column("message", _long_text(), nullable=True),
        **options,
    )
    op.create_index("ix_attempts_job_id_n", "attempts", ["job_id", "n"])


def downgrade() -> None:
    op.drop_table("attempts")
    op.drop_table("jobs")
