"""event rules: rules, targets, deliveries, the router's cursor, durable queues

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('event_rules',
    sa.Column('bus', sa.String(length=255), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('state', sa.String(length=64), nullable=False),
    sa.Column('pattern', sa.Text(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('bus', 'name'),
    sa.UniqueConstraint('arn')
    )
    op.create_table('event_targets',
    sa.Column('rule_arn', sa.String(length=512), nullable=False),
    sa.Column('target_id', sa.String(length=64), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('rule_arn', 'target_id')
    )
    op.create_table('event_deliveries',
    sa.Column('id', _ID, autoincrement=True, nullable=False),
    sa.Column('event_id', sa.String(length=64), nullable=False),
    sa.Column('rule_arn', sa.String(length=512), nullable=False),
    sa.Column('target_id', sa.String(length=64), nullable=False),
    sa.Column('order_key', sa.String(length=512), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('next_attempt_at', sa.Float(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('event_id', 'rule_arn', 'target_id', name='uq_event_deliveries')
    )
    op.create_index('ix_event_deliveries_due', 'event_deliveries', ['next_attempt_at'])
    op.create_index('ix_event_deliveries_order', 'event_deliveries', ['rule_arn', 'target_id', 'order_key', 'id'])
    op.create_table('event_cursors',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('cursor', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('queue_messages',
    sa.Column('id', _ID, autoincrement=True, nullable=False),
    sa.Column('queue', sa.String(length=80), nullable=False),
    sa.Column('event_id', sa.String(length=64), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('attributes', sa.Text(), server_default='{}', nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('visible_at', sa.Float(), nullable=False),
    sa.Column('receipt', sa.String(length=64), nullable=True),
    sa.Column('receive_count', sa.Integer(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_queue_messages_queue', 'queue_messages', ['queue', 'visible_at', 'id'])


def downgrade() -> None:
    op.drop_index('ix_queue_messages_queue', table_name='queue_messages')
    op.drop_table('queue_messages')
    op.drop_table('event_cursors')
    op.drop_index('ix_event_deliveries_order', table_name='event_deliveries')
    op.drop_index('ix_event_deliveries_due', table_name='event_deliveries')
    op.drop_table('event_deliveries')
    op.drop_table('event_targets')
    op.drop_table('event_rules')
