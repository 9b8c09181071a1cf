"""Seed 002's watch of delegated work: each task's checking state (attempts without news, the
next check, what its schedule counts from, an escalation), the attempts each worker's heartbeat
says it runs, and each node's own checking policy (its profile's ``[checking]`` table).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.add_column(sa.Column('check_attempts', sa.Integer(), server_default='0',
                                   nullable=False))
        batch.add_column(sa.Column('next_check_time', sa.Float(), nullable=True))
        batch.add_column(sa.Column('check_since', sa.Float(), nullable=True))
        batch.add_column(sa.Column('escalated_at', sa.Float(), nullable=True))
        batch.add_column(sa.Column('escalation', sa.Text(), nullable=True))
    with op.batch_alter_table('bidding_workers') as batch:
        batch.add_column(sa.Column('running', JSONType, nullable=True))
    with op.batch_alter_table('bidding_nodes') as batch:
        batch.add_column(sa.Column('checking', JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('bidding_nodes') as batch:
        batch.drop_column('checking')
    with op.batch_alter_table('bidding_workers') as batch:
        batch.drop_column('running')
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.drop_column('escalation')
        batch.drop_column('escalated_at')
        batch.drop_column('check_since')
        batch.drop_column('next_check_time')
        batch.drop_column('check_attempts')
