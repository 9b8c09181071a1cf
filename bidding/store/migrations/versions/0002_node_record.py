"""Nodes keep their record: finished attempts and successes (for the candidates' prior score).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from alembic import op
import sqlalchemy as sa

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('bidding_nodes') as batch:
        batch.add_column(sa.Column('attempts', sa.Integer(), server_default='0', nullable=False))
        batch.add_column(sa.Column('successes', sa.Integer(), server_default='0', nullable=False))
    # Nodes that already have episodes start from them.
    op.execute(
        "UPDATE bidding_nodes SET "
        "attempts = (SELECT count(*) FROM bidding_episodes e WHERE e.node = bidding_nodes.name), "
        "successes = (SELECT count(*) FROM bidding_episodes e "
        "WHERE e.node = bidding_nodes.name AND e.success)"
    )


def downgrade() -> None:
    with op.batch_alter_table('bidding_nodes') as batch:
        batch.drop_column('successes')
        batch.drop_column('attempts')
