"""Leadership: one row naming the broker that leads this store, its term (only grows) and its heartbeat.

Revision ID: 0008_leadership
Revises: 0007_ui_sessions
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0008_leadership"
down_revision = "0007_ui_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    options: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"} \
        if op.get_bind().dialect.name in ("mysql", "mariadb") else {}
    table = op.create_table(
        "leadership",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("url", sa.String(1024), nullable=False),
        sa.Column("beat", sa.BigInteger(), nullable=False),
        sa.Column("since", sa.Double(), nullable=False),
        **options,
    )
    op.bulk_insert(table, [{"id": 1, "term": 0, "holder": "", "url": "", "beat": 0, "since": 0.0}])


def downgrade() -> None:
    op.drop_table("leadership")
