"""Initial schema: nodes, announcements, bids, episodes, messages, ledger.

Revision ID: 0001
Revises: 
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('bidding_announcements',
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('task_name', sa.String(length=255), nullable=False),
    sa.Column('task_type', sa.String(length=64), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('required_skills', JSONType, nullable=False),
    sa.Column('preferred_node', sa.String(length=32), nullable=True),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('deadline', sa.Float(), nullable=True),
    sa.Column('budget', sa.Float(), nullable=True),
    sa.Column('strategy', sa.String(length=255), nullable=False),
    sa.Column('spec', JSONType, nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('candidates', JSONType, nullable=False),
    sa.Column('expected_bids', sa.Integer(), nullable=False),
    sa.Column('bids_received', sa.Integer(), nullable=False),
    sa.Column('announced_at', sa.Float(), nullable=False),
    sa.Column('closes_at', sa.Float(), nullable=False),
    sa.Column('due_at', sa.Float(), nullable=True),
    sa.Column('awarded_at', sa.Float(), nullable=True),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('assigned_node', sa.String(length=32), nullable=True),
    sa.Column('winning_bid_id', sa.Integer(), nullable=True),
    sa.Column('winning_score', sa.Float(), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=True),
    sa.Column('closed_by', sa.String(length=32), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('progress', JSONType, nullable=False),
    sa.PrimaryKeyConstraint('task_id')
    )
    op.create_index(op.f('ix_bidding_announcements_announced_at'), 'bidding_announcements', ['announced_at'], unique=False)
    op.create_index('ix_bidding_announcements_node_state', 'bidding_announcements', ['assigned_node', 'state'], unique=False)
    op.create_index('ix_bidding_announcements_state_closes', 'bidding_announcements', ['state', 'closes_at'], unique=False)
    op.create_index('ix_bidding_announcements_state_due', 'bidding_announcements', ['state', 'due_at'], unique=False)
    op.create_index(op.f('ix_bidding_announcements_task_type'), 'bidding_announcements', ['task_type'], unique=False)
    op.create_table('bidding_episodes',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=32), nullable=False),
    sa.Column('task_type', sa.String(length=64), nullable=False),
    sa.Column('skills', JSONType, nullable=False),
    sa.Column('success', sa.Boolean(), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=False),
    sa.Column('cost', sa.Float(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_bidding_episodes_node_type', 'bidding_episodes', ['node', 'task_type', 'finished_at'], unique=False)
    op.create_index(op.f('ix_bidding_episodes_task_id'), 'bidding_episodes', ['task_id'], unique=False)
    op.create_index('uq_bidding_episodes_attempt', 'bidding_episodes', ['task_id', 'attempt', 'node'], unique=True)
    op.create_table('bidding_ledger',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=32), nullable=False),
    sa.Column('units', sa.Float(), nullable=False),
    sa.Column('price_per_unit', sa.Float(), nullable=False),
    sa.Column('total', sa.Float(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_bidding_ledger_task_id'), 'bidding_ledger', ['task_id'], unique=False)
    op.create_index('uq_bidding_ledger_attempt', 'bidding_ledger', ['task_id', 'attempt', 'node'], unique=True)
    op.create_table('bidding_messages',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('node', sa.String(length=32), nullable=True),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('detail', JSONType, nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_bidding_messages_kind'), 'bidding_messages', ['kind'], unique=False)
    op.create_index(op.f('ix_bidding_messages_task_id'), 'bidding_messages', ['task_id'], unique=False)
    op.create_table('bidding_nodes',
    sa.Column('name', sa.String(length=32), nullable=False),
    sa.Column('capabilities', JSONType, nullable=False),
    sa.Column('capacity', sa.Integer(), nullable=False),
    sa.Column('price_per_unit', sa.Float(), nullable=False),
    sa.Column('latency_ms', sa.Float(), nullable=False),
    sa.Column('trust', sa.Float(), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('last_heartbeat', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_index(op.f('ix_bidding_nodes_last_heartbeat'), 'bidding_nodes', ['last_heartbeat'], unique=False)
    op.create_table('bidding_bids',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=32), nullable=False),
    sa.Column('will_bid', sa.Boolean(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('capability', sa.Float(), nullable=True),
    sa.Column('experience', sa.Float(), nullable=True),
    sa.Column('load', sa.Float(), nullable=True),
    sa.Column('confidence', sa.Float(), nullable=True),
    sa.Column('cost', sa.Float(), nullable=True),
    sa.Column('latency_ms', sa.Float(), nullable=True),
    sa.Column('trust', sa.Float(), nullable=True),
    sa.Column('payload', JSONType, nullable=False),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('breakdown', JSONType, nullable=False),
    sa.Column('is_winner', sa.Boolean(), nullable=False),
    sa.Column('late', sa.Boolean(), nullable=False),
    sa.Column('bid_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['task_id'], ['bidding_announcements.task_id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_bidding_bids_task_id'), 'bidding_bids', ['task_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_bidding_bids_task_id'), table_name='bidding_bids')
    op.drop_table('bidding_bids')
    op.drop_index(op.f('ix_bidding_nodes_last_heartbeat'), table_name='bidding_nodes')
    op.drop_table('bidding_nodes')
    op.drop_index(op.f('ix_bidding_messages_task_id'), table_name='bidding_messages')
    op.drop_index(op.f('ix_bidding_messages_kind'), table_name='bidding_messages')
    op.drop_table('bidding_messages')
    op.drop_index('uq_bidding_ledger_attempt', table_name='bidding_ledger')
    op.drop_index(op.f('ix_bidding_ledger_task_id'), table_name='bidding_ledger')
    op.drop_table('bidding_ledger')
    op.drop_index('uq_bidding_episodes_attempt', table_name='bidding_episodes')
    op.drop_index(op.f('ix_bidding_episodes_task_id'), table_name='bidding_episodes')
    op.drop_index('ix_bidding_episodes_node_type', table_name='bidding_episodes')
    op.drop_table('bidding_episodes')
    op.drop_index(op.f('ix_bidding_announcements_task_type'), table_name='bidding_announcements')
    op.drop_index('ix_bidding_announcements_state_due', table_name='bidding_announcements')
    op.drop_index('ix_bidding_announcements_state_closes', table_name='bidding_announcements')
    op.drop_index('ix_bidding_announcements_node_state', table_name='bidding_announcements')
    op.drop_index(op.f('ix_bidding_announcements_announced_at'), table_name='bidding_announcements')
    op.drop_table('bidding_announcements')
