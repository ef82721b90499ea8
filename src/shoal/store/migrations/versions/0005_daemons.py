"""daemons: daemon task definitions, daemons, their capacity providers, revisions and
deployments, and the daemon a task belongs to

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('daemon_task_definitions',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('family', sa.String(length=255), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('registered_at', sa.Float(), nullable=False),
    sa.Column('delete_requested_at', sa.Float(), nullable=True),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('arn'),
    sa.UniqueConstraint('family', 'revision', name='uq_daemon_task_definition_revision')
    )
    op.create_index('ix_daemon_task_definitions_status_family', 'daemon_task_definitions',
                    ['status', 'family', 'revision'])
    op.create_table('daemons',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('task_definition_arn', sa.String(length=512), nullable=False),
    sa.Column('revision_arn', sa.String(length=512), nullable=False),
    sa.Column('deployment_arn', sa.String(length=512), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('arn'),
    sa.UniqueConstraint('cluster_name', 'name', name='uq_daemons_cluster_name')
    )
    op.create_index('ix_daemons_cluster_status', 'daemons', ['cluster_name', 'status'])
    op.create_index('ix_daemons_task_definition', 'daemons', ['task_definition_arn'])
    op.create_table('daemon_capacity_providers',
    sa.Column('daemon_arn', sa.String(length=512), nullable=False),
    sa.Column('capacity_provider_name', sa.String(length=255), nullable=False),
    sa.PrimaryKeyConstraint('daemon_arn', 'capacity_provider_name')
    )
    op.create_index('ix_daemon_capacity_providers_provider', 'daemon_capacity_providers',
                    ['capacity_provider_name'])
    op.create_table('daemon_revisions',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('daemon_arn', sa.String(length=512), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('arn')
    )
    op.create_index('ix_daemon_revisions_daemon', 'daemon_revisions', ['daemon_arn', 'created_at'])
    op.create_table('daemon_deployments',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('daemon_arn', sa.String(length=512), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('arn')
    )
    op.create_index('ix_daemon_deployments_daemon', 'daemon_deployments', ['daemon_arn', 'created_at'])
    op.create_index('ix_daemon_deployments_cluster_status', 'daemon_deployments', ['cluster_name', 'status'])
    # Daemon tasks are ordinary tasks; DescribeDaemon counts the hosts that run one.
    op.add_column('tasks', sa.Column('daemon_name', sa.String(length=255), nullable=True))
    op.create_index('ix_tasks_daemon', 'tasks', ['cluster_name', 'daemon_name'])


def downgrade() -> None:
    op.drop_index('ix_tasks_daemon', table_name='tasks')
    with op.batch_alter_table('tasks') as batch:
        batch.drop_column('daemon_name')
    op.drop_index('ix_daemon_deployments_cluster_status', table_name='daemon_deployments')
    op.drop_index('ix_daemon_deployments_daemon', table_name='daemon_deployments')
    op.drop_table('daemon_deployments')
    op.drop_index('ix_daemon_revisions_daemon', table_name='daemon_revisions')
    op.drop_table('daemon_revisions')
    op.drop_index('ix_daemon_capacity_providers_provider', table_name='daemon_capacity_providers')
    op.drop_table('daemon_capacity_providers')
    op.drop_index('ix_daemons_task_definition', table_name='daemons')
    op.drop_index('ix_daemons_cluster_status', table_name='daemons')
    op.drop_table('daemons')
    op.drop_index('ix_daemon_task_definitions_status_family', table_name='daemon_task_definitions')
    op.drop_table('daemon_task_definitions')
