"""Resources and warm items: what a node declares and holds warm, and what a task's attempt
holds on its node (summed over a node's unfinished attempts: what it has reserved).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('bidding_nodes') as batch:
        batch.add_column(sa.Column('resources', JSONType, nullable=True))
        batch.add_column(sa.Column('warm', JSONType, nullable=True))
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.add_column(sa.Column('resources', JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.drop_column('resources')
    with op.batch_alter_table('bidding_nodes') as batch:
        batch.drop_column('warm')
        batch.drop_column('resources')
