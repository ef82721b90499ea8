"""host repairs: the start-before-stop repairs of managed hosts

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('host_repairs',
    sa.Column('host_arn', sa.String(length=512), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('provider', sa.String(length=255), nullable=False),
    sa.Column('host_id', sa.String(length=64), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('done_at', sa.Float(), nullable=True),
    sa.Column('replacement_host_id', sa.String(length=64), nullable=True),
    sa.Column('reruns', sa.Text(), server_default='{}', nullable=False),
    sa.PrimaryKeyConstraint('host_arn')
    )
    op.create_index('ix_host_repairs_provider_state', 'host_repairs', ['provider', 'state'])


def downgrade() -> None:
    op.drop_index('ix_host_repairs_provider_state', table_name='host_repairs')
    op.drop_table('host_repairs')
