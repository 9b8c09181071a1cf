"""Each node's record per task type (attempts and successes), kept with its episodes, so that
an announcer ranks the nodes it asks by their record on the task's type. Filled from the
episodes already stored.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from alembic import op
import sqlalchemy as sa

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'bidding_node_records',
        sa.Column('node', sa.String(32), primary_key=True),
        sa.Column('task_type', sa.String(64), primary_key=True),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('successes', sa.Integer(), nullable=False),
    )
    op.execute(
        "INSERT INTO bidding_node_records (node, task_type, attempts, successes) "
        "SELECT node, task_type, COUNT(*), SUM(CASE WHEN success THEN 1 ELSE 0 END) "
        "FROM bidding_episodes WHERE NOT lost GROUP BY node, task_type"
    )


def downgrade() -> None:
    op.drop_table('bidding_node_records')
