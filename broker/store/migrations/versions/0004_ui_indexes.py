"""Dashboard indexes: the Jobs page pages newest-first by id within a state or a pool.

Revision ID: 0004_ui_indexes
Revises: 0003_events
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0004_ui_indexes"
down_revision = "0003_events"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_id", "jobs", ["state", "id"])
    op.create_index("ix_jobs_pool_id", "jobs", ["pool", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_pool_id", table_name="jobs")
    op.drop_index("ix_jobs_state_id", table_name="jobs")
