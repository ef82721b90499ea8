"""chaos orders: faults an operator asked a host's agent to inject (`shoal chaos`), and the
sequence of each host's latest order

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'chaos_orders',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('cluster_name', sa.String(length=255), nullable=False),
        sa.Column('host_arn', sa.String(length=512), nullable=False),
        sa.Column('seq', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('order_doc', sa.Text(), nullable=False),
        sa.Column('result', sa.Text(), nullable=True),
        sa.Column('requested_at', sa.Float(), nullable=False),
        sa.Column('done_at', sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_chaos_orders_host', 'chaos_orders', ['host_arn', 'seq'])
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.add_column(sa.Column('orders_seq', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.drop_column('orders_seq')
    op.drop_index('ix_chaos_orders_host', table_name='chaos_orders')
    op.drop_table('chaos_orders')
