"""Quarantine: hardware-failure counts and quarantines of devices and nodes, kept across restarts.

Revision ID: 0005_quarantine
Revises: 0004_ui_indexes
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision = "0005_quarantine"
down_revision = "0004_ui_indexes"
branch_labels = None
depends_on = None


def _key(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(postgresql.VARCHAR(length, collation="C"), "postgresql")


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
        "quarantine",
        sa.Column("key", _key(255), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("node", _key(255), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.Column("quarantined_at", sa.Double(), nullable=True),
        sa.Column("released_at", sa.Double(), nullable=True),
        sa.Column("released_by", _key(255), nullable=True),
        **_table_options(),
    )


def downgrade() -> None:
    op.drop_table("quarantine")
