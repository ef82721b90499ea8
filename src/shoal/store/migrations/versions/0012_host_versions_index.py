"""the index of hosts by cluster and status also holds their ARN and version: placement's
catch-up reads every host's version from the index alone, not from thousands of host rows

Revision ID: 0012
Revises: 0011
"""
from alembic import op


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index('ix_container_instances_cluster_status', table_name='container_instances')
    op.create_index('ix_container_instances_cluster_status', 'container_instances',
                    ['cluster_name', 'status', 'arn', 'version'])


def downgrade() -> None:
    op.drop_index('ix_container_instances_cluster_status', table_name='container_instances')
    op.create_index('ix_container_instances_cluster_status', 'container_instances', ['cluster_name', 'status'])
