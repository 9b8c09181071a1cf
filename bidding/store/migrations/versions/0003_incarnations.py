"""Worker incarnations, the worker and incarnation of each attempt, the final result kept
in the store (so it can be written to the result backend again), and episodes lost with their
worker told apart from failed ones.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('bidding_workers',
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('node', sa.String(length=32), nullable=False),
    sa.Column('boot_id', sa.String(length=32), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('last_heartbeat', sa.Float(), nullable=False),
    sa.Column('slots', sa.Integer(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.PrimaryKeyConstraint('hostname')
    )
    op.create_index(op.f('ix_bidding_workers_node'), 'bidding_workers', ['node'], unique=False)
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.add_column(sa.Column('worker', sa.String(length=255), nullable=True))
        batch.add_column(sa.Column('boot_id', sa.String(length=32), nullable=True))
        batch.add_column(sa.Column('result', JSONType, nullable=True))
        batch.add_column(sa.Column('report_due', sa.Float(), nullable=True))
        batch.create_index(op.f('ix_bidding_announcements_report_due'), ['report_due'],
                           unique=False)
    with op.batch_alter_table('bidding_episodes') as batch:
        batch.add_column(sa.Column('lost', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('bidding_episodes') as batch:
        batch.drop_column('lost')
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.drop_index(op.f('ix_bidding_announcements_report_due'))
        batch.drop_column('report_due')
        batch.drop_column('result')
        batch.drop_column('boot_id')
        batch.drop_column('worker')
    op.drop_index(op.f('ix_bidding_workers_node'), table_name='bidding_workers')
    op.drop_table('bidding_workers')
