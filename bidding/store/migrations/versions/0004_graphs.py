"""AITP task graphs: a task decomposed into subtasks (bidding.graphs), and its steps.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('bidding_graphs',
    sa.Column('graph_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('spec', JSONType, nullable=False),
    sa.Column('input', JSONType, nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('cost_limit', sa.Float(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('touched_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('result', JSONType, nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('failed_step', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('graph_id')
    )
    op.create_index('ix_bidding_graphs_state_touched', 'bidding_graphs',
                    ['state', 'touched_at'], unique=False)
    op.create_table('bidding_graph_steps',
    sa.Column('graph_id', sa.String(length=64), nullable=False),
    sa.Column('step_id', sa.String(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('capability', sa.String(length=255), nullable=False),
    sa.Column('task_name', sa.String(length=255), nullable=False),
    sa.Column('task_id', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('input', JSONType, nullable=True),
    sa.Column('output', JSONType, nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('announced_at', sa.Float(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('budget', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['graph_id'], ['bidding_graphs.graph_id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('graph_id', 'step_id'),
    sa.UniqueConstraint('task_id')
    )


def downgrade() -> None:
    op.drop_table('bidding_graph_steps')
    op.drop_index('ix_bidding_graphs_state_touched', table_name='bidding_graphs')
    op.drop_table('bidding_graphs')
