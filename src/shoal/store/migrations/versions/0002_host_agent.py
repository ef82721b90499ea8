"""host agent: per-host credentials and placement allocations

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.add_column(sa.Column('agent_token_hash', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('allocations', sa.Text(), nullable=False, server_default='{}'))
        batch_op.create_unique_constraint('uq_container_instances_agent_token_hash', ['agent_token_hash'])


def downgrade() -> None:
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.drop_constraint('uq_container_instances_agent_token_hash', type_='unique')
        batch_op.drop_column('allocations')
        batch_op.drop_column('agent_token_hash')
