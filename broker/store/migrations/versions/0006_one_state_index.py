"""One index on the jobs' state: ix_jobs_state_id (state, id) serves every lookup by state that ix_jobs_state
(state) served, so the narrower one goes. Each of a job's state changes rewrote an entry in both (B14: a page
more per group commit); on MySQL and MariaDB the two were the same index, InnoDB appending the key to both.

Revision ID: 0006_one_state_index
Revises: 0005_quarantine
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0006_one_state_index"
down_revision = "0005_quarantine"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_jobs_state", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_state", "jobs", ["state"])
