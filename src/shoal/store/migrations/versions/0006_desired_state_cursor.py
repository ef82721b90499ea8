"""desired-state cursor: a per-host sequence and the task's place in it, so an agent's poll
gets only what changed since its last one

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.add_column(sa.Column('desired_seq', sa.Integer(), nullable=False, server_default='0'))
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('host_seq', sa.Integer(), nullable=True))
        batch_op.drop_index('ix_tasks_instance')
        batch_op.create_index('ix_tasks_instance', ['container_instance_arn', 'host_seq'])


def downgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ix_tasks_instance')
        batch_op.create_index('ix_tasks_instance', ['container_instance_arn'])
        batch_op.drop_column('host_seq')
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.drop_column('desired_seq')
