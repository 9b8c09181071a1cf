"""What a caller passes is kept: a task's expiry, its tags (a table of their own, so that a
filter by tag is an indexed lookup on every database), who created it and the cost its winning
bid estimated; what a bidder claimed (its estimates on the bid, and the winner's claims on the
attempt's episode, so that claims can be compared with outcomes after the bids are pruned).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from alembic import op
import sqlalchemy as sa

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.add_column(sa.Column('expires_at', sa.Float(), nullable=True))
        batch.add_column(sa.Column('created_by', sa.String(length=255), nullable=True))
        batch.add_column(sa.Column('estimated_cost', sa.Float(), nullable=True))
    with op.batch_alter_table('bidding_bids') as batch:
        batch.add_column(sa.Column('estimated_cost', sa.Float(), nullable=True))
        batch.add_column(sa.Column('estimated_duration_s', sa.Float(), nullable=True))
    with op.batch_alter_table('bidding_episodes') as batch:
        batch.add_column(sa.Column('claimed_confidence', sa.Float(), nullable=True))
        batch.add_column(sa.Column('estimated_cost', sa.Float(), nullable=True))
        batch.add_column(sa.Column('estimated_duration_s', sa.Float(), nullable=True))
    op.create_table(
        'bidding_tags',
        sa.Column('task_id', sa.String(length=64),
                  sa.ForeignKey('bidding_announcements.task_id', ondelete='CASCADE'),
                  primary_key=True),
        sa.Column('tag', sa.String(length=64), primary_key=True),
    )
    op.create_index('ix_bidding_tags_tag', 'bidding_tags', ['tag'])


def downgrade() -> None:
    op.drop_index('ix_bidding_tags_tag', 'bidding_tags')
    op.drop_table('bidding_tags')
    with op.batch_alter_table('bidding_episodes') as batch:
        batch.drop_column('estimated_duration_s')
        batch.drop_column('estimated_cost')
        batch.drop_column('claimed_confidence')
    with op.batch_alter_table('bidding_bids') as batch:
        batch.drop_column('estimated_duration_s')
        batch.drop_column('estimated_cost')
    with op.batch_alter_table('bidding_announcements') as batch:
        batch.drop_column('estimated_cost')
        batch.drop_column('created_by')
        batch.drop_column('expires_at')
