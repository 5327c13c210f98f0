"""Attempt timings: phase durations (package push and unpack, dependency install) as a JSON object.

Revision ID: 0002_attempt_timings
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002_attempt_timings"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("timings", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"),
                                        nullable=True))


def downgrade() -> None:
    op.drop_column("attempts", "timings")
