"""Nodes publish whether they bid with a bidder of their own (issue 14, "auto" bid mode).

Revision ID: 0006
Revises: 0004
Create Date: 2026-11-25
"""

from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('bidding_nodes') as batch:
        # NULL is the built-in bidder: what every node that registered before this ran.
        batch.add_column(sa.Column('bidder', sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('bidding_nodes') as batch:
        batch.drop_column('bidder')
