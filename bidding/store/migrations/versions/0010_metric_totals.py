"""Metrics that outlive retention: what the prune deletes from the message log is added here
first, so that a counter read from the store (``bidding.lifecycle.tallies``) never goes down.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

from alembic import op
import sqlalchemy as sa

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'bidding_metric_totals',
        sa.Column('sample', sa.String(length=96), primary_key=True),
        sa.Column('labels', sa.String(length=255), primary_key=True),
        sa.Column('value', sa.Float(), nullable=False, server_default='0'),
    )


def downgrade() -> None:
    op.drop_table('bidding_metric_totals')
