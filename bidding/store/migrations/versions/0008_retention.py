"""Retention (``bidding.lifecycle.retention``): an index to find the oldest finished tasks of
a final state, and the federation's periodic jobs (the prune), claimed by one node at a time.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_bidding_announcements_state_finished', 'bidding_announcements',
                    ['state', 'finished_at'])
    op.create_table(
        'bidding_jobs',
        sa.Column('name', sa.String(length=64), primary_key=True),
        sa.Column('due_at', sa.Float(), nullable=False),
        sa.Column('last_by', sa.String(length=255), nullable=True),
        sa.Column('last_at', sa.Float(), nullable=True),
        sa.Column('last_result', JSONType, nullable=True),
        sa.Column('runs', sa.Integer(), server_default='0', nullable=False),
    )


def downgrade() -> None:
    op.drop_table('bidding_jobs')
    op.drop_index('ix_bidding_announcements_state_finished', 'bidding_announcements')
