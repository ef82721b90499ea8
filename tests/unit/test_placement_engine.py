"""Property tests of the placement engine (shoal.scheduler.engine) against the plain per-host
reference code: HostCapacity.fit for resources and query.Expr.matches for constraints.

For random fleets, task streams and placement plans: no resource or GPU memory is ever
over-committed, no constraint is ever violated, a single task is always placed when some host
is feasible (and never when none is), the incremental arrays always equal a rebuild, and the
host chosen is the one the strategies pick host by host.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from shoal.domain import query
from shoal.scheduler.engine import Decision, HostTable, Plan
from shoal.scheduler.hosts import HostInfo
from shoal.scheduler.resources import Demand, HostCapacity, overbooked

ZONES = ["az-a", "az-b", "az-c"]
TYPES = ["g6e.xlarge", "g6e.12xlarge", "c7i.large", "p5.48xlarge"]
GROUPS = ["service:web", "service:gpu", "family:batch"]
EXPRESSIONS = [
    "attribute:ecs.instance-type =~ g6e.*",
    "attribute:ecs.availability-zone in [az-a, az-b]",
    "attribute:ecs.instance-type != c7i.large && attribute:ecs.availability-zone == az-c",
    "runningTasksCount < 2",
    "task:group == service:web",
    "not_exists_placeholder",
    "attribute:team exists || agentVersion == 1.2.3",
    "(attribute:ecs.availability-zone == az-a || runningTasksCount >= 1) && attribute:team !exists",
    "task:group != family:batch",
    "ec2InstanceId =~ h-1*",
]
EXPRESSIONS[5] = "attribute:ecs.capability.gpu-sharing-mps !exists"
settings.register_profile("engine", max_examples=120, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("engine")


@st.composite
def hosts(draw) -> list[HostInfo]:
    out = []
    for i in range(draw(st.integers(1, 7))):
        gpus = draw(st.integers(0, 3))
        attributes = {"ecs.availability-zone": draw(st.sampled_from(ZONES)),
                      "ecs.instance-type": draw(st.sampled_from(TYPES))}
        if gpus and draw(st.booleans()):
            attributes["ecs.capability.gpu-sharing-mps"] = None
        if draw(st.booleans()):
            attributes["team"] = draw(st.sampled_from(["ml", "web"]))
        out.append(HostInfo(
            arn=f"arn:host/{i}", version=1, status=draw(st.sampled_from(["ACTIVE"] * 5 + ["DRAINING"])),
            connected=draw(st.booleans()) or True, provider=None,
            cpu=draw(st.sampled_from([1024, 2048, 4096])), memory=draw(st.sampled_from([2048, 4096, 8192])),
            ports=frozenset(draw(st.sets(st.sampled_from(["22", "80", "8080"]), max_size=1))), udp_ports=frozenset(),
            gpus=[(f"GPU-{i}-{g}", draw(st.sampled_from([8192, 24576]))) for g in range(gpus)],
            attributes=attributes, registered_at=1000.0 + i,
            agent_version=draw(st.sampled_from(["1.2.3", "1.3.0"])), ec2_instance_id=f"h-{i}"))
    return out


@st.composite
def demands(draw) -> Demand:
    kind = draw(st.sampled_from(["cpu", "cpu", "ports", "whole", "mps"]))
    cpu, memory = draw(st.sampled_from([0, 256, 1024, 2048])), draw(st.sampled_from([128, 1024, 3072]))
    group = draw(st.sampled_from(GROUPS))
    if kind == "ports":
        return Demand(cpu, memory, ports=(draw(st.sampled_from(["80", "8080"])),), group=group)
    if kind == "whole":
        return Demand(cpu, memory, whole_gpus={"c": draw(st.sampled_from([1, 2, -1]))}, group=group)
    if kind == "mps":
        return Demand(cpu, memory, mps_memory={"c": draw(st.sampled_from([2048, 8192, 16384]))},
                      required_attributes=("ecs.capability.gpu-sharing-mps",), group=group)
    return Demand(cpu, memory, group=group)


@st.composite
def plans(draw) -> dict:
    strategies = draw(st.lists(st.sampled_from([
        {"type": "binpack", "field": "memory"}, {"type": "binpack", "field": "cpu"},
        {"type": "spread", "field": "attribute:ecs.availability-zone"}, {"type": "spread", "field": "instanceId"},
        {"type": "random"}]), max_size=2))
    constraints = [{"type": "memberOf", "expression": e}
                   for e in draw(st.lists(st.sampled_from(EXPRESSIONS), max_size=2))]
    if draw(st.booleans()):
        constraints.append({"type": "distinctInstance"})
    return {"placementStrategy": strategies, "placementConstraints": constraints}


def registered(h: HostInfo) -> list[dict]:
    out = [{"name": "CPU", "type": "INTEGER", "integerValue": h.cpu},
           {"name": "MEMORY", "type": "INTEGER", "integerValue": h.memory},
           {"name": "PORTS", "type": "STRINGSET", "stringSetValue": sorted(h.ports)},
           {"name": "PORTS_UDP", "type": "STRINGSET", "stringSetValue": []}]
    if h.gpus:
        out.append({"name": "GPU", "type": "STRINGSET", "stringSetValue": [u for u, _ in h.gpus]})
    return out


def devices(h: HostInfo) -> list[dict]:
    return [{"gpuId": u, "totalMemoryInMiB": m} for u, m in h.gpus]


def reference_fit(h: HostInfo, need: Demand, plan: dict) -> bool:
    """Whether one task may go on this host, by the per-host reference code."""
    if h.status != "ACTIVE" or not h.connected:
        return False
    if any(name not in h.attributes for name in need.required_attributes):
        return False
    alloc, _, _ = HostCapacity(h.arn, registered(h), devices(h), h.allocations).fit(need)
    if alloc is None:
        return False
    groups = tuple(a.get("group", "") for a in h.allocations.values())
    view = query.Host(attributes=h.attributes, agent_connected=h.connected, agent_version=h.agent_version,
                      ec2_instance_id=h.ec2_instance_id, registered_at=h.registered_at,
                      running_tasks_count=len(h.allocations), task_groups=groups)
    for c in plan["placementConstraints"]:
        if c["type"] == "memberOf" and not query.parse(c["expression"]).matches(view):
            return False
        if c["type"] == "distinctInstance" and need.group in groups:
            return False
    return True


def check_table_consistent(table: HostTable) -> None:
    """Nothing over-committed, and the incremental arrays equal a table rebuilt from scratch."""
    rebuilt = HostTable()
    for h in table.hosts:
        if h is None:
            continue
        assert overbooked(registered(h), devices(h), h.allocations) is None, h.arn
        rebuilt.upsert(HostInfo(**{**h.__dict__, "allocations": dict(h.allocations)}))
    for name in ("cpu_free", "mem_free", "running", "idle_gpus", "mps_room"):
        a, b = getattr(table, name), getattr(rebuilt, name)
        for h in table.hosts:
            if h is not None:
                assert a[table.slot[h.arn]] == b[rebuilt.slot[h.arn]], (name, h.arn)
    for h in table.hosts:
        if h is not None:
            i, j = table.slot[h.arn], rebuilt.slot[h.arn]
            assert (table.gpu_free[i] == rebuilt.gpu_free[j]).all()
            assert (table.gpu_mode[i] == rebuilt.gpu_mode[j]).all()


@given(hosts(), st.lists(st.tuples(demands(), plans()), min_size=1, max_size=25), st.randoms())
def test_never_overcommits_never_violates_a_constraint_and_places_when_some_host_is_feasible(fleet, stream, rnd):
    table = HostTable(rng=random.Random(rnd.random()))
    for h in fleet:
        table.upsert(h)
    for n, (need, placement) in enumerate(stream):
        feasible = {h.arn for h in fleet if reference_fit(h, need, placement)}
        decision = table.place(f"task-{n}", need, Plan.compile(placement))
        if feasible:
            assert isinstance(decision, Decision), (decision, feasible)
            assert decision.arn in feasible
        else:
            assert isinstance(decision, str) and decision, decision
        check_table_consistent(table)


def reference_choice(fleet: list[HostInfo], feasible: set[str], strategies: list[dict], group: str) -> str:
    """The host the strategies pick, host by host: each keeps its best candidates for the next,
    and a final tie goes to the host registered first (the fleet's order)."""
    candidates = [h for h in fleet if h.arn in feasible]

    def tasks_of_group(h: HostInfo) -> int:
        return sum(a.get("group", "") == group for a in h.allocations.values())

    for s in strategies or [{"type": "fewest tasks"}]:
        field = (s.get("field") or "").lower()
        if s["type"] == "binpack":
            def key(h, resource="cpu" if field == "cpu" else "memory"):
                return getattr(h, resource) - sum(a[resource] for a in h.allocations.values())
        elif s["type"] == "spread" and field.startswith("attribute:"):
            name = field[len("attribute:"):]
            per_value: dict = {}
            for h in fleet:  # every host of the table counts, candidate or not
                value = h.attributes.get(name, "<missing>")  # hosts without it: one more value
                per_value[value] = per_value.get(value, 0) + tasks_of_group(h)

            def key(h, name=name, per_value=per_value):
                return per_value[h.attributes.get(name, "<missing>")]
        elif s["type"] == "spread":
            key = tasks_of_group
        else:
            def key(h):
                return len(h.allocations)
        best = min(key(h) for h in candidates)
        candidates = [h for h in candidates if key(h) == best]
    return candidates[0].arn


@given(hosts(), plans(), st.sampled_from(GROUPS), st.lists(demands(), min_size=1, max_size=25))
def test_the_strategies_choose_the_host_a_per_host_reference_chooses(fleet, placement, group, stream):
    """A batch as RunTask or a service places it: one plan and one group for every task."""
    placement = {**placement, "placementStrategy": [s for s in placement["placementStrategy"] if s["type"] != "random"]}
    plan = Plan.compile(placement)
    table = HostTable()
    for h in fleet:
        table.upsert(h)
    for n, need in enumerate(stream):
        need = dataclasses.replace(need, group=group)
        feasible = {h.arn for h in fleet if reference_fit(h, need, placement)}
        expected = reference_choice(fleet, feasible, placement["placementStrategy"], group) if feasible else None
        decision = table.place(f"task-{n}", need, plan)
        assert (decision.arn if isinstance(decision, Decision) else None) == expected, (placement, need)


@given(hosts(), st.lists(demands(), min_size=1, max_size=20), st.randoms())
def test_releasing_tasks_returns_the_table_to_what_a_rebuild_gives(fleet, stream, rnd):
    table = HostTable()
    for h in fleet:
        table.upsert(h)
    placed = []
    for n, need in enumerate(stream):
        decision = table.place(f"task-{n}", need, Plan.compile({}))
        if isinstance(decision, Decision):
            placed.append((decision.arn, f"task-{n}"))
    rnd.shuffle(placed)
    for arn, task in placed[: len(placed) // 2]:
        assert table.release(arn, task) is not None
        assert table.release(arn, task) is None  # twice changes nothing
    check_table_consistent(table)


@given(hosts(), st.lists(demands(), max_size=10), st.sampled_from(EXPRESSIONS))
def test_vectorised_member_of_agrees_with_the_per_host_evaluation(fleet, stream, expression):
    from shoal.scheduler.constraints import evaluate

    table = HostTable()
    for h in fleet:
        table.upsert(h)
    for n, need in enumerate(stream):
        table.place(f"task-{n}", need, Plan.compile({}))
    expr = query.parse(expression)
    got = evaluate(expr, table, np.arange(table.size))
    for h in fleet:
        view = query.Host(attributes=h.attributes, agent_connected=h.connected, agent_version=h.agent_version,
                          ec2_instance_id=h.ec2_instance_id, registered_at=h.registered_at,
                          running_tasks_count=len(h.allocations),
                          task_groups=tuple(a.get("group", "") for a in h.allocations.values()))
        assert got[table.slot[h.arn]] == expr.matches(view), (expression, h.arn)


def test_binpack_memory_takes_the_host_with_the_least_memory_left_that_fits():
    table = HostTable()
    for i, memory in enumerate([8192, 3072, 2048, 4096]):
        table.upsert(HostInfo(f"h{i}", 1, "ACTIVE", True, None, 4096, memory, frozenset(), frozenset(), [], {}))
    decision = table.place("t", Demand(256, 2560), Plan.compile({"placementStrategy": [
        {"type": "binpack", "field": "memory"}]}))
    assert decision.arn == "h1"  # 3072 is the least that still fits 2560 (2048 does not)


def test_spread_over_zones_then_binpack_balances_zones_to_within_one_task():
    table = HostTable()
    for i in range(9):
        table.upsert(HostInfo(f"h{i}", 1, "ACTIVE", True, None, 4096, 8192 + i, frozenset(), frozenset(), [],
                              {"ecs.availability-zone": ZONES[i % 3]}))
    plan = Plan.compile({"placementStrategy": [{"type": "spread", "field": "attribute:ecs.availability-zone"},
                                               {"type": "binpack", "field": "memory"}]})
    zones = [table.hosts[table.place(f"t{n}", Demand(10, 10, group="g"), plan).slot].attributes[
        "ecs.availability-zone"] for n in range(20)]
    counts = [zones.count(z) for z in ZONES]
    assert max(counts) - min(counts) <= 1, counts


def test_reasons_name_the_first_filter_that_leaves_no_host():
    table = HostTable()
    table.upsert(HostInfo("h", 1, "ACTIVE", True, None, 1024, 2048, frozenset(["80"]), frozenset(),
                          [("GPU-1", 8192)], {"ecs.instance-type": "c7i.large"}))
    assert table.place("a", Demand(2048, 10), Plan.compile({})) == "RESOURCE:CPU"
    assert table.place("b", Demand(10, 4096), Plan.compile({})) == "RESOURCE:MEMORY"
    assert table.place("c", Demand(10, 10, ports=("80",)), Plan.compile({})) == "RESOURCE:PORTS"
    assert table.place("d", Demand(10, 10, whole_gpus={"c": 2}), Plan.compile({})) == "RESOURCE:GPU"
    member_of = {"placementConstraints": [{"type": "memberOf", "expression": "attribute:ecs.instance-type =~ g6e.*"}]}
    assert table.place("e", Demand(10, 10), Plan.compile(member_of)) == "MemberOf placement constraint unsatisfied."
    distinct = Plan.compile({"placementConstraints": [{"type": "distinctInstance"}]})
    assert isinstance(table.place("f", Demand(10, 10, group="g"), distinct), Decision)
    assert table.place("g", Demand(10, 10, group="g"), distinct) == "DistinctInstance placement constraint unsatisfied."
    empty = HostTable()
    assert empty.place("h", Demand(10, 10), Plan.compile({})) == "No Container Instances were found in your cluster."


def test_capacity_provider_weights_split_a_batch_after_the_base():
    table = HostTable()
    for i in range(4):
        table.upsert(HostInfo(f"h{i}", 1, "ACTIVE", True, "cp-a" if i < 2 else "cp-b", 65536, 65536, frozenset(),
                              frozenset(), [], {}))
    plan = Plan.compile({"capacityProviderStrategy": [{"capacityProvider": "cp-a", "base": 2, "weight": 1},
                                                      {"capacityProvider": "cp-b", "weight": 3}]})
    providers = [table.hosts[table.place(f"t{n}", Demand(1, 1, group="g"), plan).slot].provider for n in range(10)]
    assert providers[:2] == ["cp-a", "cp-a"]  # the base first
    assert providers[2:].count("cp-b") == 6 and providers[2:].count("cp-a") == 2  # then 1:3
