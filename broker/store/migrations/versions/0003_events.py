"""The event log: preemptions, reservation alerts, hold breaks, budget throttling (broker.events).

Revision ID: 0003_events
Revises: 0002_attempt_timings
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision = "0003_events"
down_revision = "0002_attempt_timings"
branch_labels = None
depends_on = None


def _key(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(postgresql.VARCHAR(length, collation="C"), "postgresql")


def _long_text() -> sa.types.TypeEngine[str]:
    return sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def _table_options() -> dict[str, Any]:
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return {}
    available = set(bind.exec_driver_sql(
        "SELECT collation_name FROM information_schema.collations"
        " WHERE collation_name IN ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin')").scalars())
    collation = next((c for c in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin") if c in available), "utf8mb4_bin")
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("subject", _key(255), nullable=False),
        sa.Column("why", _long_text(), nullable=False),
        sa.Column("cost_gpu_s", sa.Double(), nullable=True),
        sa.Column("caller", _key(255), nullable=True),
        sa.Column("detail", _long_text(), nullable=False),
        **_table_options(),
    )
    op.create_index("ix_events_at", "events", ["at"])
    op.create_index("ix_events_caller_id", "events", ["caller", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_caller_id", table_name="events")
    op.drop_index("ix_events_at", table_name="events")
    op.drop_table("events")
