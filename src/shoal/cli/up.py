"""`shoal up`: a working cluster on this machine in one command.

It runs the control plane (SQLite under the data dir) and one agent for this machine (its real
GPUs if it has any), which joins cluster `default` through the self-managed capacity provider
`local`, the cluster's default strategy. Each `--simulate TYPE:N` adds a managed capacity
provider `sim-<type>` whose local provisioner keeps at least N simulated hosts of that type.
The export lines are printed once every host is ACTIVE, so the commands after them work at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from shoal.cli.server import DEFAULT_PORT, _serve, capacity_controller
from shoal.config import Settings, load_or_create_credentials, load_or_create_join_token, load_or_create_secret

CLUSTER, LOCAL_PROVIDER = "default", "local"
READY_TIMEOUT = 120.0


def provider_name(instance_type: str) -> str:
    return "sim-" + instance_type.replace(".", "-")


def _parse_simulate(values: list[str]) -> dict[str, int]:
    from shoal import catalog

    wanted: dict[str, int] = {}
    for value in values:
        name, _, count = value.partition(":")
        try:
            catalog.get(name)
            n = int(count or 1)
            if n < 1:
                raise ValueError
        except ValueError:
            raise typer.BadParameter(f"expected TYPE:COUNT with COUNT ≥ 1, got {value!r}", param_hint="--simulate")
        except KeyError as err:
            raise typer.BadParameter(str(err), param_hint="--simulate") from None
        if name in wanted:
            raise typer.BadParameter(f"{name} is given twice (one --simulate per instance type)",
                                     param_hint="--simulate")
        wanted[name] = n
    return wanted


def _client(endpoint: str, key_id: str, secret: str):
    import boto3

    return boto3.client("ecs", endpoint_url=endpoint, region_name="local", aws_access_key_id=key_id,
                        aws_secret_access_key=secret)


def _ensure_cluster(ecs, simulate: dict[str, int]) -> None:
    """Cluster `default`, provider `local` as its default strategy, one managed provider per
    simulated type. Idempotent: a restart finds them and only adjusts the minimum host counts."""
    ecs.create_cluster(clusterName=CLUSTER)  # returns the existing cluster if there is one
    existing = {p["name"]: p for p in ecs.describe_capacity_providers()["capacityProviders"]}
    if LOCAL_PROVIDER not in existing:
        ecs.create_capacity_provider(name=LOCAL_PROVIDER, autoScalingGroupProvider={
            "autoScalingGroupArn": "arn:shoal:autoscaling:local:000000000000:autoScalingGroup:local"})
    names = [LOCAL_PROVIDER]
    for instance_type, count in simulate.items():
        name = provider_name(instance_type)
        names.append(name)
        tags = [{"key": "shoal:min-hosts", "value": str(count)}]
        if name in existing:
            ecs.tag_resource(resourceArn=existing[name]["capacityProviderArn"], tags=tags)
            continue
        ecs.create_capacity_provider(name=name, cluster=CLUSTER, tags=tags, managedInstancesProvider={
            "infrastructureRoleArn": "arn:shoal:iam::000000000000:role/shoal-local",
            "instanceLaunchTemplate": {
                "ec2InstanceProfileArn": "arn:shoal:iam::000000000000:instance-profile/shoal-local",
                "networkConfiguration": {"subnets": []},
                "instanceRequirements": {"vCpuCount": {"min": 1}, "memoryMiB": {"min": 1},
                                         "allowedInstanceTypes": [instance_type]}}})
    current = ecs.describe_clusters(clusters=[CLUSTER])["clusters"][0]["capacityProviders"]
    ecs.put_cluster_capacity_providers(
        cluster=CLUSTER, capacityProviders=sorted({*current, *names}),
        defaultCapacityProviderStrategy=[{"capacityProvider": LOCAL_PROVIDER, "weight": 1}])


def _active_hosts(ecs) -> dict[str, int]:
    """ACTIVE hosts with a connected agent, per capacity provider."""
    arns = ecs.list_container_instances(cluster=CLUSTER, status="ACTIVE")["containerInstanceArns"]
    counts: dict[str, int] = {}
    for i in range(0, len(arns), 100):
        for host in ecs.describe_container_instances(cluster=CLUSTER, containerInstances=arns[i:i + 100])[
                "containerInstances"]:
            if host["agentConnected"]:
                name = host.get("capacityProviderName", "")
                counts[name] = counts.get(name, 0) + 1
    return counts


def _start_local_agent(data_dir: Path, endpoint: str, join_token: str) -> subprocess.Popen:
    agent_dir = data_dir / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "agent.log", "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "shoal", "agent", "--server", endpoint, "--cluster", CLUSTER,
         "--capacity-provider", LOCAL_PROVIDER, "--data-dir", str(agent_dir)],
        env={**os.environ, "SHOAL_JOIN_TOKEN": join_token}, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True)  # Ctrl-C reaches `shoal up`, which then stops the agent itself


def _retire_launched_hosts(settings: Settings, capacity) -> None:
    """On the way out: the simulated machines go away with `shoal up`, and their records say so
    (the next `shoal up` launches new ones rather than waiting for these to be found lost)."""
    from sqlalchemy import select

    from shoal.api.operations import run_unit
    from shoal.control.capacity import retire_host
    from shoal.domain.arns import ArnFactory
    from shoal.store.db import Store
    from shoal.store.tables import container_instances as cis

    ids = [host.host_id for host in capacity.provisioner.list()]
    if not ids:
        return
    for host_id in ids:
        capacity.provisioner.terminate(host_id)
    store = Store(settings.database_url)
    try:
        arns = store.read_sync(lambda conn: conn.execute(select(cis.c.arn).where(
            cis.c.ec2_instance_id.in_(ids), cis.c.status != "INACTIVE")).scalars().all())
        factory = ArnFactory(settings.region, settings.account)
        for arn in arns:
            store.submit(lambda conn, arn=arn: run_unit(conn, factory, lambda ctx: retire_host(ctx, arn, vanished=True))
                         ).result()
    finally:
        store.close()


def up(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULT_PORT,
    data_dir: Annotated[Path, typer.Option(help="Where the store, credentials, agent and hosts live.",
                                           envvar="SHOAL_DATA_DIR")] = Path(".shoal"),
    simulate: Annotated[Optional[list[str]], typer.Option(
        help="Also keep N simulated hosts of an instance type, e.g. p6-b200.48xlarge:2 (repeatable).")] = None,
) -> None:
    """Run shoal on this machine: the control plane, an agent for this machine, simulated hosts."""
    wanted = _parse_simulate(simulate or [])
    data_dir = data_dir.resolve()
    key_id, secret = load_or_create_credentials(data_dir)
    settings = Settings(data_dir=data_dir, credentials={key_id: secret},
                        join_token=load_or_create_join_token(data_dir),
                        webhook_secret=load_or_create_secret(data_dir, "webhook-secret"))
    capacity = capacity_controller(settings, "local", None, None, None, scale_in_after=300.0)
    agent: list[subprocess.Popen] = []

    def prepare(endpoint: str) -> None:
        try:
            ecs = _client(endpoint, key_id, secret)
            _ensure_cluster(ecs, wanted)
            agent.append(_start_local_agent(data_dir, endpoint, settings.join_token))
            needed = {LOCAL_PROVIDER: 1, **{provider_name(t): n for t, n in wanted.items()}}
            deadline = time.monotonic() + READY_TIMEOUT
            while True:
                counts = _active_hosts(ecs)
                if all(counts.get(name, 0) >= n for name, n in needed.items()):
                    break
                if agent[0].poll() is not None or time.monotonic() > deadline:
                    print(f"shoal up: hosts did not become ACTIVE (have {counts}, want {needed}); "
                          f"see {data_dir / 'agent.log'} and {data_dir / 'hosts'}", file=sys.stderr, flush=True)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                time.sleep(0.2)
        except Exception as err:  # the server keeps running; say what failed
            print(f"shoal up: setting up the cluster failed: {err}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        hosts = ", ".join(f"{n} × {name}" for name, n in sorted(counts.items()))
        task = json.dumps([{"name": "hello", "command": ["sh", "-c", "echo hello from shoal; sleep 5"],
                            "memory": 64}])
        print(f"export SHOAL_ENDPOINT={endpoint}\n"
              f"export AWS_ACCESS_KEY_ID={key_id}\n"
              f"export AWS_SECRET_ACCESS_KEY={secret}\n"
              f"export AWS_DEFAULT_REGION=local\n"
              f"# cluster {CLUSTER}: {hosts} ACTIVE. Run a task:\n"
              f"aws ecs --endpoint-url \"$SHOAL_ENDPOINT\" register-task-definition --family hello "
              f"--container-definitions '{task}'\n"
              f"TASK=$(aws ecs --endpoint-url \"$SHOAL_ENDPOINT\" run-task --task-definition hello "
              f"--query 'tasks[0].taskArn' --output text)\n"
              f"sleep 1; shoal logs --data-dir {data_dir} \"$TASK\"\n"
              f"# events: shoal events list; store: {settings.database_url}; Ctrl-C stops\n"
              f"# the whole GPU story (daemons, MPS, faults, repair) on simulated p6-b200 hosts: "
              f"{Path(sys.executable).with_name('shoal')} demo", flush=True)

    def ready(bound: int) -> None:
        threading.Thread(target=prepare, args=(f"http://127.0.0.1:{bound}",), daemon=True).start()

    try:
        _serve(settings, "127.0.0.1", port, ready, capacity)
    except KeyboardInterrupt:  # uvicorn has already shut down gracefully
        pass
    finally:
        for proc in agent:  # its tasks run on under their shims; the next `shoal up` adopts them
            proc.terminate()
            proc.wait(10)
        _retire_launched_hosts(settings, capacity)
