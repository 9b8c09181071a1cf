"""Parking: a task the sweepers' scans keep failing on (an announcement this version cannot
read) is set aside with its reason, so that it cannot hide the tasks behind it
(``bidding.lifecycle.parking``): the consecutive failed passes on it, and why it was parked.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from alembic import op
import sqlalchemy as sa

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('bidding_announcements') as batch:
        # 0: every row written before this ran had no failure counted.
        batch.add_column(sa.Column('scan_failures', sa.Integer(), server_default='0',
                                   nullable=False))
        batch.add_column(sa.Column('parked', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.drop_column('parked')
        batch.drop_column('scan_failures')
