"""initial schema

Revision ID: 0001
Revises: 
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('capacity_providers',
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('name'),
    sa.UniqueConstraint('arn')
    )
    op.create_table('clusters',
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('name'),
    sa.UniqueConstraint('arn')
    )
    op.create_table('container_instances',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('ec2_instance_id', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('capacity_provider_name', sa.String(length=255), nullable=True),
    sa.Column('registered_at', sa.Float(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('arn'),
    sa.UniqueConstraint('id')
    )
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.create_index('ix_container_instances_cluster_status', ['cluster_name', 'status'], unique=False)
        batch_op.create_index('ix_container_instances_ec2', ['ec2_instance_id'], unique=False)

    op.create_table('events',
    sa.Column('seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('txid', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('event_id', sa.String(length=64), nullable=False),
    sa.Column('detail_type', sa.String(length=128), nullable=False),
    sa.Column('time', sa.String(length=40), nullable=False),
    sa.Column('envelope', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('seq'),
    sa.UniqueConstraint('event_id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_order', ['txid', 'seq'], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        # Each event carries the id of the transaction that wrote it; see shoal.events.outbox.
        op.execute(
            "ALTER TABLE events ALTER COLUMN txid SET DEFAULT (pg_current_xact_id()::text)::bigint"
        )

    op.create_table('idempotency',
    sa.Column('scope', sa.String(length=320), nullable=False),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('response', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('scope')
    )
    op.create_table('task_definition_families',
    sa.Column('family', sa.String(length=255), nullable=False),
    sa.Column('last_revision', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('family')
    )
    op.create_table('task_definitions',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('family', sa.String(length=255), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('arn'),
    sa.UniqueConstraint('family', 'revision', name='uq_task_definition_revision')
    )
    with op.batch_alter_table('task_definitions', schema=None) as batch_op:
        batch_op.create_index('ix_task_definitions_status_family', ['status', 'family', 'revision'], unique=False)

    op.create_table('tasks',
    sa.Column('arn', sa.String(length=512), nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('cluster_name', sa.String(length=255), nullable=False),
    sa.Column('last_status', sa.String(length=32), nullable=False),
    sa.Column('desired_status', sa.String(length=32), nullable=False),
    sa.Column('family', sa.String(length=255), nullable=False),
    sa.Column('started_by', sa.String(length=128), nullable=True),
    sa.Column('service_name', sa.String(length=255), nullable=True),
    sa.Column('launch_type', sa.String(length=32), nullable=True),
    sa.Column('container_instance_arn', sa.String(length=512), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('doc', sa.Text(), nullable=False),
    sa.Column('placement', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('arn'),
    sa.UniqueConstraint('id')
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index('ix_tasks_cluster_desired', ['cluster_name', 'desired_status', 'created_at'], unique=False)
        batch_op.create_index('ix_tasks_cluster_last', ['cluster_name', 'last_status'], unique=False)
        batch_op.create_index('ix_tasks_instance', ['container_instance_arn'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index('ix_tasks_instance')
        batch_op.drop_index('ix_tasks_cluster_last')
        batch_op.drop_index('ix_tasks_cluster_desired')

    op.drop_table('tasks')
    with op.batch_alter_table('task_definitions', schema=None) as batch_op:
        batch_op.drop_index('ix_task_definitions_status_family')

    op.drop_table('task_definitions')
    op.drop_table('task_definition_families')
    op.drop_table('idempotency')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_order')

    op.drop_table('events')
    with op.batch_alter_table('container_instances', schema=None) as batch_op:
        batch_op.drop_index('ix_container_instances_ec2')
        batch_op.drop_index('ix_container_instances_cluster_status')

    op.drop_table('container_instances')
    op.drop_table('clusters')
    op.drop_table('capacity_providers')
