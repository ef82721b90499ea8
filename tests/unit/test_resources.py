"""shoal.scheduler.resources: what a task needs, what a host has left, and how GPUs are shared.

Pure functions: task definitions go through the same validation and task documents through the
same constructor as on the server, so the shapes are the real ones.
"""

from __future__ import annotations

import copy

import pytest

from shoal.domain import task_definitions
from shoal.domain.tasks import new_task
from shoal.scheduler.resources import (ALL_GPUS, DEDICATED, IDLE, MPS, Demand, HostCapacity, allocation, demand,
                                       gpu_devices, remaining_resources, usage)

GPU_A, GPU_B = "GPU-aaaaaaaa", "GPU-bbbbbbbb"
MPS_ATTRIBUTE = "ecs.capability.gpu-sharing-mps"


# --- helpers -------------------------------------------------------------------------------------

def definition(*containers: dict, **task_level) -> dict:
    """A registered task definition's document (validated and defaulted as RegisterTaskDefinition does)."""
    doc = task_definitions.validate({"family": "fam", "containerDefinitions": list(containers), **task_level})
    return {**doc, "family": "fam", "revision": 1,
            "taskDefinitionArn": "arn:shoal:ecs:local:000000000000:task-definition/fam:1"}


def task_for(td: dict, overrides: dict | None = None, group: str | None = None) -> dict:
    return new_task(task_arn="arn:shoal:ecs:local:000000000000:task/c/t1", cluster_arn="arn:c", task_definition=td,
                    container_arns=[f"arn:container/{i}" for i in range(len(td["containerDefinitions"]))],
                    overrides=overrides or {}, last_status="PENDING", launch_type="EC2", group=group,
                    started_by=None, tags=[], now=0.0)


def need(*containers: dict, overrides: dict | None = None, **task_level) -> Demand:
    td = definition(*containers, **task_level)
    return demand(task_for(td, overrides), td)


def gpu(value: str) -> list[dict]:
    return [{"type": "GPU", "value": value}]


def mps(memory: int) -> list[dict]:
    return [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": memory}}}]


def registered(cpu: int = 4096, memory: int = 8192, ports: tuple[str, ...] = ("22",), udp: tuple[str, ...] = (),
               gpus: tuple[str, ...] = ()) -> list[dict]:
    out = [{"name": "CPU", "type": "INTEGER", "integerValue": cpu},
           {"name": "MEMORY", "type": "INTEGER", "integerValue": memory},
           {"name": "PORTS", "type": "STRINGSET", "stringSetValue": list(ports)},
           {"name": "PORTS_UDP", "type": "STRINGSET", "stringSetValue": list(udp)}]
    if gpus:
        out.append({"name": "GPU", "type": "STRINGSET", "stringSetValue": list(gpus)})
    return out


def host(gpus: tuple[str, ...] = (), gpu_memory: int = 24576, **resources) -> HostCapacity:
    return HostCapacity("arn:host", registered(gpus=gpus, **resources),
                        [{"gpuId": g, "totalMemoryInMiB": gpu_memory} for g in gpus], {})


def take(capacity: HostCapacity, d: Demand, key: str) -> dict[str, list[str]]:
    """Place `d` on `capacity` as placement does: fit, then record the allocation."""
    alloc, ids, reason = capacity.fit(d)
    assert reason is None and alloc is not None, reason
    capacity.allocations[key] = alloc
    return ids


def value(resources: list[dict], name: str):
    r = next(r for r in resources if r["name"] == name)
    return r.get("integerValue", r.get("stringSetValue"))


def device(capacity: HostCapacity, gpu_id: str) -> dict:
    return next(d for d in capacity.devices_now() if d["gpuId"] == gpu_id)


# --- demand --------------------------------------------------------------------------------------

def test_task_level_cpu_and_memory_reserve_that_much_whatever_the_containers_say():
    d = need({"name": "a", "image": "x", "cpu": 128, "memory": 256},
             {"name": "b", "image": "x", "cpu": 64, "memoryReservation": 64}, cpu="1 vCPU", memory="2 GB")
    assert (d.cpu, d.memory) == (1024, 2048)


def test_without_task_level_figures_the_containers_add_up_memory_before_reservation():
    d = need({"name": "a", "image": "x", "cpu": 256, "memory": 512, "memoryReservation": 128},
             {"name": "b", "image": "x", "cpu": 128, "memoryReservation": 256},
             {"name": "c", "image": "x", "memory": 64})
    # a: hard limit 512 (its reservation is not added); b: reservation 256; c: no cpu → 0.
    assert (d.cpu, d.memory) == (384, 832)


def test_container_overrides_change_the_container_figures():
    d = need({"name": "a", "image": "x", "cpu": 256, "memory": 512},
             overrides={"containerOverrides": [{"name": "a", "cpu": 512, "memory": 1024}]})
    assert (d.cpu, d.memory) == (512, 1024)


def test_task_level_overrides_win():
    d = need({"name": "a", "image": "x", "cpu": 256, "memory": 512}, overrides={"cpu": "2048", "memory": "4096"})
    assert (d.cpu, d.memory) == (2048, 4096)


def test_ports_tcp_and_udp_a_container_port_without_host_port_is_a_host_port():
    d = need({"name": "a", "image": "x", "memory": 64, "portMappings": [
        {"containerPort": 80, "hostPort": 8080}, {"containerPort": 9090}, {"containerPort": 53, "protocol": "udp"}]},
        {"name": "b", "image": "x", "memory": 64, "portMappings": [{"containerPort": 81, "hostPort": 8081,
                                                                    "protocol": "tcp"}]})
    assert sorted(d.ports) == ["8080", "8081", "9090"]
    assert d.udp_ports == ("53",)
    assert not d.whole_gpus and not d.mps_memory and d.required_attributes == ()


def test_whole_gpus_per_container_and_all():
    d = need({"name": "a", "image": "x", "memory": 64, "resourceRequirements": gpu("2")},
             {"name": "b", "image": "x", "memory": 64, "resourceRequirements": gpu("ALL")},
             {"name": "c", "image": "x", "memory": 64})
    assert d.whole_gpus == {"a": 2, "b": ALL_GPUS}
    assert d.mps_memory == {} and d.required_attributes == ()


def test_mps_memory_per_container_and_the_capability_it_requires():
    d = need({"name": "a", "image": "x", "memory": 64, "resourceRequirements": mps(4096)},
             {"name": "b", "image": "x", "memory": 64, "resourceRequirements": mps(2048)})
    assert d.mps_memory == {"a": 4096, "b": 2048}
    assert sum(d.mps_memory.values()) == 6144
    assert d.whole_gpus == {}
    assert d.required_attributes == (MPS_ATTRIBUTE,)


def test_group_defaults_to_the_family():
    td = definition({"name": "a", "image": "x", "memory": 64})
    assert demand(task_for(td), td).group == "family:fam"
    assert demand(task_for(td, group="service:web"), td).group == "service:web"


# --- fit: reasons ----------------------------------------------------------------------------------

def test_fit_at_the_exact_boundary_and_the_first_reason_past_it():
    capacity = host(cpu=1024, memory=2048)
    assert capacity.fit(Demand(cpu=1024, memory=2048))[2] is None
    assert capacity.fit(Demand(cpu=1025, memory=2048)) == (None, {}, "RESOURCE:CPU")
    assert capacity.fit(Demand(cpu=1024, memory=2049)) == (None, {}, "RESOURCE:MEMORY")
    assert capacity.fit(Demand(cpu=9999, memory=9999))[2] == "RESOURCE:CPU"  # CPU is checked first


def test_fit_counts_what_is_already_allocated():
    capacity = host(cpu=1024, memory=2048)
    take(capacity, Demand(cpu=1000, memory=1000), "t1")
    assert capacity.fit(Demand(cpu=25, memory=10))[2] == "RESOURCE:CPU"
    assert capacity.fit(Demand(cpu=24, memory=1049))[2] == "RESOURCE:MEMORY"
    assert capacity.fit(Demand(cpu=24, memory=1048))[2] is None


def test_ports_reserved_by_the_host_taken_by_a_task_or_asked_twice():
    capacity = host(ports=("22",), udp=("53",))
    assert capacity.fit(Demand(cpu=0, memory=0, ports=("22",)))[2] == "RESOURCE:PORTS"
    assert capacity.fit(Demand(cpu=0, memory=0, ports=("80", "80")))[2] == "RESOURCE:PORTS"
    assert capacity.fit(Demand(cpu=0, memory=0, udp_ports=("53",)))[2] == "RESOURCE:PORTS_UDP"
    assert capacity.fit(Demand(cpu=0, memory=0, ports=("53",)))[2] is None  # tcp and udp are separate
    take(capacity, Demand(cpu=0, memory=0, ports=("8080",), udp_ports=("5000",)), "t1")
    assert capacity.fit(Demand(cpu=0, memory=0, ports=("8080",)))[2] == "RESOURCE:PORTS"
    assert capacity.fit(Demand(cpu=0, memory=0, udp_ports=("5000",)))[2] == "RESOURCE:PORTS_UDP"
    assert capacity.fit(Demand(cpu=0, memory=0, ports=("8081",), udp_ports=("8080",)))[2] is None


def test_whole_gpus_need_idle_gpus():
    assert host().fit(Demand(cpu=0, memory=0, whole_gpus={"a": 1}))[2] == "RESOURCE:GPU"  # no GPU at all
    capacity = host(gpus=(GPU_A, GPU_B))
    assert capacity.fit(Demand(cpu=0, memory=0, whole_gpus={"a": 3}))[2] == "RESOURCE:GPU"
    assert capacity.fit(Demand(cpu=0, memory=0, whole_gpus={"a": 1, "b": 2}))[2] == "RESOURCE:GPU"
    ids = take(capacity, Demand(cpu=0, memory=0, whole_gpus={"a": 1}), "t1")
    assert len(ids["a"]) == 1 and ids["a"][0] in (GPU_A, GPU_B)
    assert capacity.fit(Demand(cpu=0, memory=0, whole_gpus={"a": 2}))[2] == "RESOURCE:GPU"
    assert capacity.fit(Demand(cpu=0, memory=0, whole_gpus={"a": ALL_GPUS}))[2] == "RESOURCE:GPU"
    other = take(capacity, Demand(cpu=0, memory=0, whole_gpus={"a": 1}), "t2")
    assert other["a"] != ids["a"]
    assert capacity.fit(Demand(cpu=0, memory=0, whole_gpus={"a": 1}))[2] == "RESOURCE:GPU"


def test_all_gpus_takes_every_gpu_and_each_container_gets_its_own():
    capacity = host(gpus=(GPU_A, GPU_B))
    ids = take(capacity, Demand(cpu=0, memory=0, whole_gpus={"a": ALL_GPUS}), "t1")
    assert sorted(ids["a"]) == [GPU_A, GPU_B]
    assert {d["sharingMode"] for d in capacity.devices_now()} == {DEDICATED}

    capacity = host(gpus=(GPU_A, GPU_B))
    ids = take(capacity, Demand(cpu=0, memory=0, whole_gpus={"a": 1, "b": 1}), "t1")
    assert sorted(ids["a"] + ids["b"]) == [GPU_A, GPU_B]


def test_mps_shares_one_gpu_by_memory():
    capacity = host(gpus=(GPU_A,), gpu_memory=24576)
    for key in ("t1", "t2"):
        assert take(capacity, Demand(cpu=0, memory=0, mps_memory={"a": 8192}), key) == {"a": [GPU_A]}
    dev = device(capacity, GPU_A)
    assert (dev["sharingMode"], dev["containerCount"], dev["remainingMemoryInMiB"]) == (MPS, 2, 24576 - 16384)
    assert capacity.fit(Demand(cpu=0, memory=0, mps_memory={"a": 12288}))[2] == "RESOURCE:GPU"
    assert capacity.fit(Demand(cpu=0, memory=0, whole_gpus={"a": 1}))[2] == "RESOURCE:GPU"
    # Exactly what is left still fits.
    assert take(capacity, Demand(cpu=0, memory=0, mps_memory={"a": 8192}), "t3") == {"a": [GPU_A]}
    assert device(capacity, GPU_A)["remainingMemoryInMiB"] == 0


def test_all_mps_containers_of_a_task_land_on_one_gpu_and_their_sum_must_fit():
    capacity = host(gpus=(GPU_A, GPU_B), gpu_memory=10000)
    # 6000 + 6000 fits on no single GPU even though each container would fit alone.
    assert capacity.fit(Demand(cpu=0, memory=0, mps_memory={"a": 6000, "b": 6000}))[2] == "RESOURCE:GPU"
    ids = take(capacity, Demand(cpu=0, memory=0, mps_memory={"a": 3000, "b": 2000}), "t1")
    assert ids["a"] == ids["b"] and len(ids["a"]) == 1
    dev = device(capacity, ids["a"][0])
    assert (dev["sharingMode"], dev["containerCount"], dev["remainingMemoryInMiB"]) == (MPS, 2, 5000)


def test_mps_never_on_a_dedicated_gpu_and_whole_gpus_never_on_a_shared_one():
    capacity = host(gpus=(GPU_A, GPU_B))
    whole = take(capacity, Demand(cpu=0, memory=0, whole_gpus={"a": 1}), "whole")["a"][0]
    shared = take(capacity, Demand(cpu=0, memory=0, mps_memory={"a": 1024}), "mps")["a"][0]
    assert shared != whole
    assert (device(capacity, whole)["sharingMode"], device(capacity, shared)["sharingMode"]) == (DEDICATED, MPS)
    assert capacity.fit(Demand(cpu=0, memory=0, whole_gpus={"a": 1}))[2] == "RESOURCE:GPU"

    capacity = host(gpus=(GPU_A, GPU_B))
    shared = take(capacity, Demand(cpu=0, memory=0, mps_memory={"a": 1024}), "mps")["a"][0]
    whole = take(capacity, Demand(cpu=0, memory=0, whole_gpus={"a": 1}), "whole")["a"][0]
    assert shared != whole
    assert capacity.fit(Demand(cpu=0, memory=0, mps_memory={"a": 1024}))[1] == {"a": [shared]}


def test_mps_prefers_a_gpu_already_shared_so_idle_gpus_stay_whole():
    capacity = host(gpus=(GPU_A, GPU_B))
    first = take(capacity, Demand(cpu=0, memory=0, mps_memory={"a": 4096}), "t1")["a"][0]
    assert take(capacity, Demand(cpu=0, memory=0, mps_memory={"a": 4096}), "t2") == {"a": [first]}
    idle = GPU_B if first == GPU_A else GPU_A
    assert device(capacity, idle)["sharingMode"] == IDLE
    assert take(capacity, Demand(cpu=0, memory=0, whole_gpus={"a": 1}), "t3") == {"a": [idle]}


def test_mps_picks_the_fullest_shared_gpu_that_fits():
    capacity = host(gpus=(GPU_A, GPU_B), gpu_memory=10000)
    capacity.allocations["x"] = allocation(Demand(cpu=0, memory=0), {GPU_A: {"mode": "mps", "containers": 1,
                                                                              "memory": 2000}})
    capacity.allocations["y"] = allocation(Demand(cpu=0, memory=0), {GPU_B: {"mode": "mps", "containers": 1,
                                                                              "memory": 7000}})
    assert capacity.fit(Demand(cpu=0, memory=0, mps_memory={"a": 3000}))[1] == {"a": [GPU_B]}
    assert capacity.fit(Demand(cpu=0, memory=0, mps_memory={"a": 3001}))[1] == {"a": [GPU_A]}


# --- gpu_devices ---------------------------------------------------------------------------------

def test_gpu_devices_modes_counts_and_memory():
    devices = [{"gpuId": g, "totalMemoryInMiB": 24576} for g in (GPU_A, GPU_B, "GPU-c")]
    allocations = {
        "t1": allocation(Demand(cpu=0, memory=0), {GPU_A: {"mode": "whole", "containers": 1}}),
        "t2": allocation(Demand(cpu=0, memory=0), {GPU_B: {"mode": "mps", "containers": 2, "memory": 8192}}),
        "t3": allocation(Demand(cpu=0, memory=0), {GPU_B: {"mode": "mps", "containers": 1, "memory": 4096}}),
    }
    out = {d["gpuId"]: d for d in gpu_devices(devices, usage(allocations))}
    assert out[GPU_A] == {"gpuId": GPU_A, "totalMemoryInMiB": 24576, "sharingMode": DEDICATED,
                          "containerCount": 1, "remainingMemoryInMiB": 0}
    assert out[GPU_B] == {"gpuId": GPU_B, "totalMemoryInMiB": 24576, "sharingMode": MPS,
                          "containerCount": 3, "remainingMemoryInMiB": 24576 - 12288}
    assert out["GPU-c"] == {"gpuId": "GPU-c", "totalMemoryInMiB": 24576, "sharingMode": IDLE,
                            "containerCount": 0, "remainingMemoryInMiB": 24576}
    assert devices[0] == {"gpuId": GPU_A, "totalMemoryInMiB": 24576}  # the input is not changed


# --- remaining resources and release ---------------------------------------------------------------

def test_remaining_resources_subtract_cpu_memory_add_ports_and_drop_gpus():
    reg = registered(cpu=4096, memory=8192, ports=("22",), udp=("53",), gpus=(GPU_A, GPU_B))
    allocations = {
        "t1": allocation(Demand(cpu=1024, memory=2048, ports=("8080",), udp_ports=("5000",)),
                         {GPU_A: {"mode": "whole", "containers": 1}}),
        "t2": allocation(Demand(cpu=512, memory=512, ports=("9000", "100")), {}),
    }
    left = remaining_resources(reg, usage(allocations))
    assert [r["name"] for r in left] == [r["name"] for r in reg]
    assert value(left, "CPU") == 4096 - 1536
    assert value(left, "MEMORY") == 8192 - 2560
    assert value(left, "PORTS") == ["22", "100", "8080", "9000"]  # sorted as numbers
    assert value(left, "PORTS_UDP") == ["53", "5000"]
    assert value(left, "GPU") == [GPU_B]
    assert reg == registered(cpu=4096, memory=8192, ports=("22",), udp=("53",), gpus=(GPU_A, GPU_B))


def test_release_is_dropping_the_allocation_and_restores_everything():
    capacity = host(gpus=(GPU_A, GPU_B), cpu=2048, memory=4096)
    before_remaining, before_devices = capacity.remaining(), capacity.devices_now()
    assert before_remaining == capacity.registered
    take(capacity, Demand(cpu=1024, memory=1024, ports=("80",), whole_gpus={"a": 1}), "t1")
    take(capacity, Demand(cpu=512, memory=512, mps_memory={"a": 4096}), "t2")
    assert capacity.remaining() != before_remaining
    snapshot = copy.deepcopy(capacity.allocations)
    # Recording the same task again changes nothing: allocations are keyed by task.
    capacity.allocations["t1"] = snapshot["t1"]
    assert value(capacity.remaining(), "CPU") == 2048 - 1536

    del capacity.allocations["t2"]
    assert value(capacity.remaining(), "CPU") == 1024
    assert [d["sharingMode"] for d in capacity.devices_now()].count(MPS) == 0
    capacity.allocations.pop("t2", None)  # releasing twice is harmless
    del capacity.allocations["t1"]
    assert capacity.remaining() == before_remaining
    assert capacity.devices_now() == before_devices
    assert all(d["sharingMode"] == IDLE and d["remainingMemoryInMiB"] == 24576 for d in capacity.devices_now())


def test_groups_list_the_groups_of_the_tasks_on_the_host():
    capacity = host()
    take(capacity, Demand(cpu=0, memory=0, group="family:a"), "t1")
    take(capacity, Demand(cpu=0, memory=0, group="service:b"), "t2")
    assert sorted(capacity.groups()) == ["family:a", "service:b"]


@pytest.mark.parametrize("cpu, memory", [("2 vCPU", "4 GB"), ("2048", "4096")])
def test_task_level_override_units_are_what_ecs_accepts(cpu, memory):
    """RunTask's overrides.cpu/memory take the same units as the task definition."""
    d = need({"name": "a", "image": "x", "cpu": 256, "memory": 512}, overrides={"cpu": cpu, "memory": memory})
    assert (d.cpu, d.memory) == (2048, 4096)
