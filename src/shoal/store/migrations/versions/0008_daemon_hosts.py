"""daemon hosts: what the daemon scheduler keeps per (daemon, host)

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('daemon_hosts',
    sa.Column('daemon_arn', sa.String(length=512), nullable=False),
    sa.Column('host_arn', sa.String(length=512), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('task_arn', sa.String(length=512), nullable=True),
    sa.Column('failures', sa.Integer(), server_default='0', nullable=False),
    sa.Column('retry_at', sa.Float(), server_default='0', nullable=False),
    sa.Column('impaired', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('first_start_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('daemon_arn', 'host_arn')
    )
    op.create_index('ix_daemon_hosts_cluster', 'daemon_hosts', ['cluster_name'])


def downgrade() -> None:
    op.drop_index('ix_daemon_hosts_cluster', table_name='daemon_hosts')
    op.drop_table('daemon_hosts')
