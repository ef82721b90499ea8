"""Table definitions (SQLAlchemy Core).

Each resource is stored as its wire document (`doc`, JSON text in botocore's shape, timestamps
as epoch seconds) plus the columns that lookups and filters need. Describe calls then return the
document as is, and list calls never parse JSON. `version` is the optimistic-concurrency counter,
and the same value as the resource's `version` field where ECS has one.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)

metadata = MetaData()

clusters = Table(
    "clusters",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("arn", String(512), nullable=False, unique=True),
    Column("status", String(32), nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
)

capacity_providers = Table(
    "capacity_providers",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("arn", String(512), nullable=False, unique=True),
    Column("status", String(32), nullable=False),
    Column("kind", String(32), nullable=False),  # MANAGED_INSTANCES | EC2_AUTOSCALING
    Column("cluster_name", String(255)),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
)

task_definition_families = Table(
    "task_definition_families",
    metadata,
    Column("family", String(255), primary_key=True),
    Column("last_revision", Integer, nullable=False),
)

task_definitions = Table(
    "task_definitions",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("family", String(255), nullable=False),
    Column("revision", Integer, nullable=False),
    Column("status", String(32), nullable=False),
    Column("doc", Text, nullable=False),
    UniqueConstraint("family", "revision", name="uq_task_definition_revision"),
    Index("ix_task_definitions_status_family", "status", "family", "revision"),
)

tasks = Table(
    "tasks",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("cluster_name", String(255), nullable=False),
    Column("last_status", String(32), nullable=False),
    Column("desired_status", String(32), nullable=False),
    Column("family", String(255), nullable=False),
    Column("started_by", String(128)),
    Column("service_name", String(255)),
    Column("launch_type", String(32)),
    Column("container_instance_arn", String(512)),
    Column("created_at", Float, nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    # What placement needs and the Task shape has no field for: the capacity provider
    # strategy, placement constraints and strategies of the RunTask call (JSON).
    Column("placement", Text),
    # The daemon a daemon task belongs to (its startedBy is the daemon's ARN, its group
    # "daemon:<name>"); NULL for every other task. DescribeDaemon counts hosts by it.
    Column("daemon_name", String(255)),
    # The host's desired_seq when this task's desired state on its host last changed (placed
    # there, or asked to stop): a poll with cursor N gets the tasks above N (shoal.api.agent.desired).
    Column("host_seq", Integer),
    Index("ix_tasks_cluster_desired", "cluster_name", "desired_status", "created_at"),
    Index("ix_tasks_cluster_last", "cluster_name", "last_status"),
    Index("ix_tasks_instance", "container_instance_arn", "host_seq"),
    Index("ix_tasks_service", "cluster_name", "service_name", "started_by"),
    Index("ix_tasks_daemon", "cluster_name", "daemon_name"),
)

container_instances = Table(
    "container_instances",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("cluster_name", String(255), nullable=False),
    Column("ec2_instance_id", String(64), nullable=False),
    Column("status", String(32), nullable=False),
    Column("capacity_provider_name", String(255)),
    Column("registered_at", Float, nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    # sha256 of the per-host credential the agent got for its join token (hex); never the token.
    Column("agent_token_hash", String(64)),
    # What placement gave each task on this host (JSON {taskArn: allocation}); the document's
    # remainingResources and gpuDevices are always recomputed from it, so they cannot drift.
    Column("allocations", Text, nullable=False, server_default="{}"),
    # Moves (under the row lock, so in commit order) with every change of what the host's
    # agent should run; its long-poll asks for what changed since the value it last saw.
    Column("desired_seq", Integer, nullable=False, server_default="0"),
    # The desired_seq of the host's latest chaos order (0: none ever): a poll looks for orders
    # only when this is past its cursor.
    Column("orders_seq", Integer, nullable=False, server_default="0"),
    UniqueConstraint("agent_token_hash", name="uq_container_instances_agent_token_hash"),
    # With the ARN and version: placement compares every host's version with its table
    # (shoal.scheduler.placement) from this index alone, not from the rows and their documents.
    Index("ix_container_instances_cluster_status", "cluster_name", "status", "arn", "version"),
    Index("ix_container_instances_ec2", "ec2_instance_id"),
)

# ECS services (REPLICA). `doc` is the Service shape (counts are filled in when it is read);
# `state` is what the service scheduler keeps for itself and the Service shape has no field for
# (JSON: deployment bookkeeping, the last COMPLETED deployment, which episodes were announced).
services = Table(
    "services",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("cluster_name", String(255), nullable=False),
    Column("status", String(32), nullable=False),  # ACTIVE | DRAINING | INACTIVE
    Column("launch_type", String(32)),
    Column("scheduling_strategy", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    Column("state", Text, nullable=False, server_default="{}"),
    UniqueConstraint("cluster_name", "name", name="uq_services_cluster_name"),
    Index("ix_services_cluster_status", "cluster_name", "status"),
)

# One row per service deployment (the ServiceDeployment shape), newest first by `created_at`.
service_deployments = Table(
    "service_deployments",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("service_arn", String(512), nullable=False),
    Column("cluster_name", String(255), nullable=False),
    Column("status", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    Index("ix_service_deployments_service", "service_arn", "created_at"),
)

# Daemon task definitions (the DaemonTaskDefinition shape in `doc`, tags included). Revisions
# are never removed, only marked DELETE_IN_PROGRESS / DELETED, so the next revision of a family
# is its highest plus one; the unique constraint settles two registrations racing for it.
daemon_task_definitions = Table(
    "daemon_task_definitions",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("family", String(255), nullable=False),
    Column("revision", Integer, nullable=False),
    Column("status", String(32), nullable=False),  # ACTIVE | DELETE_IN_PROGRESS | DELETED
    Column("registered_at", Float, nullable=False),
    Column("delete_requested_at", Float),
    Column("doc", Text, nullable=False),
    UniqueConstraint("family", "revision", name="uq_daemon_task_definition_revision"),
    Index("ix_daemon_task_definitions_status_family", "status", "family", "revision"),
)

# Managed daemons: one row per daemon of a cluster (ACTIVE | DELETE_IN_PROGRESS). `doc` holds
# the stored part of the DaemonDetail shape plus tags; its counts are computed when it is read.
# The columns name what the daemon runs now: its current revision (task definition, critical,
# tag settings) and its latest deployment (deployment configuration).
daemons = Table(
    "daemons",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("cluster_name", String(255), nullable=False),
    Column("status", String(32), nullable=False),
    Column("task_definition_arn", String(512), nullable=False),
    Column("revision_arn", String(512), nullable=False),
    Column("deployment_arn", String(512), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    UniqueConstraint("cluster_name", "name", name="uq_daemons_cluster_name"),
    Index("ix_daemons_cluster_status", "cluster_name", "status"),
    Index("ix_daemons_task_definition", "task_definition_arn"),
)

# The capacity providers a daemon runs on (by provider name): which daemons a host of a
# provider must run, and ListDaemons' capacityProviderArns filter.
daemon_capacity_providers = Table(
    "daemon_capacity_providers",
    metadata,
    Column("daemon_arn", String(512), primary_key=True),
    Column("capacity_provider_name", String(255), primary_key=True),
    Index("ix_daemon_capacity_providers_provider", "capacity_provider_name"),
)

# Immutable snapshots of a daemon's settings, one per CreateDaemon/UpdateDaemon (the
# DaemonRevision shape).
daemon_revisions = Table(
    "daemon_revisions",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("daemon_arn", String(512), nullable=False),
    Column("cluster_name", String(255), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("doc", Text, nullable=False),
    Index("ix_daemon_revisions_daemon", "daemon_arn", "created_at"),
)

# What the daemon scheduler keeps per (daemon, host) (shoal.control.daemons): the task it
# started there last, the start failures in a row and when the next start may happen, whether
# the current failure episode has been announced, and when the first start was tried (the
# start timeout counts from it).
daemon_hosts = Table(
    "daemon_hosts",
    metadata,
    Column("daemon_arn", String(512), primary_key=True),
    Column("host_arn", String(512), primary_key=True),
    Column("cluster_name", String(255), nullable=False),
    Column("task_arn", String(512)),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("retry_at", Float, nullable=False, server_default="0"),
    Column("impaired", Boolean, nullable=False, server_default=false()),
    Column("first_start_at", Float, nullable=False),
    Column("revision_arn", String(512)),  # the daemon revision its task there runs
    Index("ix_daemon_hosts_cluster", "cluster_name"),
)

# Repairs of managed hosts (shoal.control.repair), one row per host: WAITING on the rate limit,
# DRAINING (the replacement launched, tasks moving), DONE (the host terminated). `reruns` maps each
# standalone task re-run elsewhere to its copy (JSON).
host_repairs = Table(
    "host_repairs",
    metadata,
    Column("host_arn", String(512), primary_key=True),
    Column("cluster_name", String(255), nullable=False),
    Column("provider", String(255), nullable=False),
    Column("host_id", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("done_at", Float),
    Column("replacement_host_id", String(64)),
    Column("reruns", Text, nullable=False, server_default="{}"),
    Index("ix_host_repairs_provider_state", "provider", "state"),
)

# One row per daemon deployment (the DaemonDeployment shape), started by CreateDaemon,
# UpdateDaemon or DeleteDaemon and advanced by the daemon reconciler.
daemon_deployments = Table(
    "daemon_deployments",
    metadata,
    Column("arn", String(512), primary_key=True),
    Column("daemon_arn", String(512), nullable=False),
    Column("cluster_name", String(255), nullable=False),
    Column("status", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    Column("bake_started_at", Float),  # when every host ran the new revision: the bake time runs from here
    Column("rollback_failures", Integer, nullable=False, server_default="0"),  # start failures since the rollback began
    Index("ix_daemon_deployments_daemon", "daemon_arn", "created_at"),
    Index("ix_daemon_deployments_cluster_status", "cluster_name", "status"),
)

# The transactional outbox. `seq` orders events within one writer; `txid` is the writing
# transaction's id on PostgreSQL (0 on SQLite, whose single writer already commits in `seq`
# order). Readers page by (txid, seq) and never past the oldest transaction still in flight,
# so a late commit below the cursor cannot be skipped. See shoal.events.outbox.
events = Table(
    "events",
    metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("txid", BigInteger, nullable=False, server_default="0"),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("detail_type", String(128), nullable=False),
    Column("time", String(40), nullable=False),
    Column("envelope", Text, nullable=False),
    Index("ix_events_order", "txid", "seq"),
)

# Remembered answers for requests that carry a clientToken.
idempotency = Table(
    "idempotency",
    metadata,
    Column("scope", String(320), primary_key=True),  # "<Operation>:<clientToken>"
    Column("request_hash", String(64), nullable=False),
    Column("response", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

# EventBridge rules (event bus "default" only). `pattern` is the rule's EventPattern as given.
event_rules = Table(
    "event_rules",
    metadata,
    Column("bus", String(255), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("arn", String(512), nullable=False, unique=True),
    Column("state", String(64), nullable=False),
    Column("pattern", Text),
    Column("version", Integer, nullable=False),
    Column("doc", Text, nullable=False),  # the DescribeRule shape
)

event_targets = Table(
    "event_targets",
    metadata,
    Column("rule_arn", String(512), primary_key=True),
    Column("target_id", String(64), primary_key=True),
    Column("doc", Text, nullable=False),  # the Target shape, as PutTargets gave it
)

# What the router decided must reach a target, until it has (at least once). One row per
# (event, rule, target); `order_key` (the event's first resource, else its source) keeps each
# target's events about one resource in order: only the oldest pending row per key is sent.
event_deliveries = Table(
    "event_deliveries",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False),
    Column("rule_arn", String(512), nullable=False),
    Column("target_id", String(64), nullable=False),
    Column("order_key", String(512), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_error", Text),
    UniqueConstraint("event_id", "rule_arn", "target_id", name="uq_event_deliveries"),
    Index("ix_event_deliveries_due", "next_attempt_at"),
    Index("ix_event_deliveries_order", "rule_arn", "target_id", "order_key", "id"),
)

# Where the router has read the outbox up to (one row per router, name "rules").
event_cursors = Table(
    "event_cursors",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("cursor", String(64), nullable=False),
)

# Durable named queues: a `queue:` target, and dead-letter queues. A message is invisible until
# `visible_at` after it has been received, and is gone once acknowledged.
queue_messages = Table(
    "queue_messages",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("queue", String(80), nullable=False),
    Column("event_id", String(64), nullable=False),
    Column("body", Text, nullable=False),
    Column("attributes", Text, nullable=False, server_default="{}"),
    Column("created_at", Float, nullable=False),
    Column("visible_at", Float, nullable=False),
    Column("receipt", String(64)),
    Column("receive_count", Integer, nullable=False, server_default="0"),
    Index("ix_queue_messages_queue", "queue", "visible_at", "id"),
)

# The per-cluster action log: what shoal did and why (shoal.events.action_log). Written in the
# transaction of the action it describes; read oldest first by `id`. `daemon_name` is set on the
# entries about one daemon, for `shoal actions list --daemon`.
action_logs = Table(
    "action_logs",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("cluster_name", String(255), nullable=False),
    Column("timestamp", Float, nullable=False),
    Column("log_level", String(8), nullable=False),  # INFO | WARN | ERROR
    Column("resource_arn", String(512), nullable=False),
    Column("action_source_id", String(512), nullable=False),
    Column("event_name", String(128), nullable=False),
    Column("detail", Text, nullable=False),  # JSON object
    Column("daemon_name", String(255)),
    Index("ix_action_logs_cluster", "cluster_name", "id"),
    Index("ix_action_logs_daemon", "cluster_name", "daemon_name", "id"),
)

# Faults an operator asked a host's agent to inject (`shoal chaos`, shoal.control.chaos). An
# order travels in the host's poll answers like a task: stamped with the host's desired_seq.
# status: PENDING until the agent reports DONE or FAILED (`result` says what it did or why not).
chaos_orders = Table(
    "chaos_orders",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("cluster_name", String(255), nullable=False),
    Column("host_arn", String(512), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("order_doc", Text, nullable=False),  # JSON: what to inject
    Column("result", Text),
    Column("requested_at", Float, nullable=False),
    Column("done_at", Float),
    Index("ix_chaos_orders_host", "host_arn", "seq"),
)

# Named shoal alarms, set through the API (shoal.control.alarms); daemon deployments watch them.
# `entered_alarm_at` is when the alarm last went into ALARM from another state: a deployment
# trips on an alarm that entered ALARM after it started, even if it is OK again by the time the
# reconciler looks.
alarms = Table(
    "alarms",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("state", String(32), nullable=False),  # ALARM | OK | INSUFFICIENT_DATA
    Column("reason", Text, nullable=False, server_default=""),
    Column("updated_at", Float, nullable=False),
    Column("entered_alarm_at", Float),
    Column("version", Integer, nullable=False),
)
