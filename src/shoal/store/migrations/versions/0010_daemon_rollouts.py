"""daemon rollouts: the revision each host's daemon task runs, when a deployment's bake began, and
the start failures of its rollback

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('daemon_hosts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('revision_arn', sa.String(length=512), nullable=True))
    with op.batch_alter_table('daemon_deployments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('bake_started_at', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('rollback_failures', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('daemon_deployments', schema=None) as batch_op:
        batch_op.drop_column('rollback_failures')
        batch_op.drop_column('bake_started_at')
    with op.batch_alter_table('daemon_hosts', schema=None) as batch_op:
        batch_op.drop_column('revision_arn')
