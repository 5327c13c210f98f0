"""Dashboard sessions: the cookie carries a random id, this table its digest, the caller and the credential
it was opened with, so a session survives a broker restart and ends when its token leaves the tokens file.

Revision ID: 0007_ui_sessions
Revises: 0006_one_state_index
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007_ui_sessions"
down_revision = "0006_one_state_index"
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
        "ui_sessions",
        sa.Column("id_digest", _key(80), primary_key=True),
        sa.Column("caller", _key(255), nullable=False),
        sa.Column("token_digest", _key(80), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        **_table_options(),
    )
    op.create_index("ix_ui_sessions_token_digest", "ui_sessions", ["token_digest"])


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_token_digest", table_name="ui_sessions")
    op.drop_table("ui_sessions")
