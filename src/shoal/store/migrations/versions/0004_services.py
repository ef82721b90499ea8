"""services: services, their deployments, and a tasks index by service

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('services',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('launch_type', sa.String(length=32), nullable=True),
    sa.Column('scheduling_strategy', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.Column('state', sa.Text(), server_default='{}', nullable=False),
    sa.PrimaryKeyConstraint('arn'),
    sa.UniqueConstraint('cluster_name', 'name', name='uq_services_cluster_name')
    )
    op.create_index('ix_services_cluster_status', 'services', ['cluster_name', 'status'])
    op.create_table('service_deployments',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('service_arn', sa.String(length=512), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('arn')
    )
    op.create_index('ix_service_deployments_service', 'service_deployments', ['service_arn', 'created_at'])
    # The service scheduler reads a service's tasks, and a deployment's, on every pass.
    op.create_index('ix_tasks_service', 'tasks', ['cluster_name', 'service_name', 'started_by'])


def downgrade() -> None:
    op.drop_index('ix_tasks_service', table_name='tasks')
    op.drop_index('ix_service_deployments_service', table_name='service_deployments')
    op.drop_table('service_deployments')
    op.drop_index('ix_services_cluster_status', table_name='services')
    op.drop_table('services')
