"""action logs and alarms: the per-cluster action log, and named alarms set through the API

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('action_logs',
    sa.Column('id', _ID, autoincrement=True, nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('timestamp', sa.Float(), nullable=False),
    sa.Column('log_level', sa.String(length=8), nullable=False),
    sa.Column('resource_arn', sa.String(length=512), nullable=False),
    sa.Column('action_source_id', sa.String(length=512), nullable=False),
    sa.Column('event_name', sa.String(length=128), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.Column('daemon_name', sa.String(length=255), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_action_logs_cluster', 'action_logs', ['cluster_name', 'id'])
    op.create_index('ix_action_logs_daemon', 'action_logs', ['cluster_name', 'daemon_name', 'id'])
    op.create_table('alarms',
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), server_default='', nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('entered_alarm_at', sa.Float(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )


def downgrade() -> None:
    op.drop_table('alarms')
    op.drop_index('ix_action_logs_daemon', table_name='action_logs')
    op.drop_index('ix_action_logs_cluster', table_name='action_logs')
    op.drop_table('action_logs')
