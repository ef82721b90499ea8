"""shoal.agent.cgroups: mountinfo parsing on sample layouts, then real limits on this kernel.

The kernel tests skip (saying why) only when `detect()` finds the controller unwritable here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from shoal.agent.cgroups import (
    ContainerCgroup, Layout, Mechanism, cpu_weight, detect, join_self, parse_mountinfo,
    remove_parent,
)

HYBRID = r"""31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /mnt/my\040disk rw - ext4 /dev/sdb1 rw
"""
PURE_V2 = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/root rw
26 22 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 26 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""


def _fake_tree(tmp_path: Path, v2_dir: str, controllers: str) -> Path:
    d = tmp_path / v2_dir.lstrip("/")
    d.mkdir(parents=True)
    (d / "cgroup.controllers").write_text(controllers + "\n")
    return tmp_path


def test_parse_hybrid_mountinfo(tmp_path: Path) -> None:
    v2, v1 = parse_mountinfo(HYBRID)
    assert v2 == Path("/sys/fs/cgroup/unified")
    assert v1["cpu"] == v1["cpuacct"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert v1["memory"] == Path("/sys/fs/cgroup/memory") and "name=systemd" not in v1
    root = _fake_tree(tmp_path, "/sys/fs/cgroup/unified", "hugetlb")
    layout = detect(root, mountinfo=HYBRID, probe=False)
    cg = root / "sys/fs/cgroup"
    assert layout.v2_controllers == {"hugetlb"}
    assert (layout.memory.kind, layout.memory.hierarchy) == ("v1", cg / "memory")
    assert (layout.cpu.kind, layout.cpu.hierarchy) == ("v1", cg / "cpu,cpuacct")
    assert (layout.pids.kind, layout.pids.hierarchy) == ("v1", cg / "pids")
    assert (layout.kill.kind, layout.kill.hierarchy) == ("v2", cg / "unified")
    assert not any(m.writable for m in (layout.memory, layout.cpu, layout.pids, layout.kill))


def test_parse_pure_v2_mountinfo(tmp_path: Path) -> None:
    v2, v1 = parse_mountinfo(PURE_V2)
    assert v2 == Path("/sys/fs/cgroup") and v1 == {}
    root = _fake_tree(tmp_path, "/sys/fs/cgroup", "cpuset cpu io memory hugetlb pids rdma misc")
    layout = detect(root, mountinfo=PURE_V2, probe=False)
    for mech in (layout.memory, layout.cpu, layout.pids, layout.kill):
        assert (mech.kind, mech.hierarchy) == ("v2", root / "sys/fs/cgroup")
    # v2 without the memory controller delegated: memory has no mechanism, nothing pretends.
    root2 = _fake_tree(tmp_path / "b", "/sys/fs/cgroup", "cpu pids")
    assert detect(root2, mountinfo=PURE_V2, probe=False).memory.kind == "none"


def test_probe_on_a_fake_tree_finds_nothing_writable_and_cgroup_is_inert(tmp_path: Path) -> None:
    # A plain directory accepts mkdir but has no controller files: the probe must say no.
    root = _fake_tree(tmp_path, "/sys/fs/cgroup", "cpu memory pids")
    layout = detect(root, mountinfo=PURE_V2)
    assert not any(m.writable for m in (layout.memory, layout.cpu, layout.pids, layout.kill))
    assert list((root / "sys/fs/cgroup").iterdir()) == [root / "sys/fs/cgroup/cgroup.controllers"]
    cg = ContainerCgroup.create(layout, "p", "c", memory_mib=64, memory_reservation_mib=32,
                                cpu_units=512, pids_max=5)
    assert cg.enforced() == dict.fromkeys(cg.enforced(), False) and len(cg.enforced()) == 5
    cg.add(os.getpid())
    cg.preexec_fn()()
    assert cg.kill() is False and cg.oom_killed() is False and cg.remove() is True
    assert Layout(None, frozenset(), {}).describe() == dict.fromkeys(
        ("memory", "cpu", "pids", "kill"), "none")


def test_cpu_weight_matches_runc() -> None:
    assert [cpu_weight(u) for u in (0, 2, 1024, 262144, 10**6)] == [1, 1, 39, 10000, 10000]


# --- the real kernel -------------------------------------------------------------------------

PARENT = f"shoal-test-{os.getpid()}"


@pytest.fixture(scope="module")
def layout():
    lay = detect(parent_name=PARENT)
    yield lay
    remove_parent(lay, PARENT)
    for hierarchy in {lay.v2_mount, *lay.v1_mounts.values()} - {None}:
        assert not (hierarchy / PARENT).exists(), "leftover cgroup"


def need(layout: Layout, *resources: str) -> None:
    for r in resources:
        if not getattr(layout, r).writable:
            pytest.skip(f"cgroup {r} is not writable here ({getattr(layout, r)})")


def run_in(cg: ContainerCgroup, argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, preexec_fn=cg.preexec_fn(), capture_output=True, timeout=15, **kw)


def test_memory_limit_oom_kills_only_the_big_allocation(layout: Layout) -> None:
    need(layout, "memory")
    cg = ContainerCgroup.create(layout, PARENT, "mem", memory_mib=64, memory_reservation_mib=16)
    try:
        assert cg.enforced()["memory"] and cg.enforced()["memory_reservation"]
        small = run_in(cg, [sys.executable, "-c", "b = b'x' * (20 * 1024 * 1024)\n"
                            "print(open('/proc/self/cgroup').read())"])
        assert small.returncode == 0, small.stderr
        assert f"/{PARENT}/mem" in small.stdout.decode()  # joined between fork and exec
        assert not cg.oom_killed()
        big = run_in(cg, [sys.executable, "-c", "b = b'x' * (200 * 1024 * 1024)"])
        assert big.returncode in (-9, 137), big
        assert cg.oom_killed()
    finally:
        assert cg.remove()


def test_pids_max_stops_a_fork_bomb_lite(layout: Layout) -> None:
    need(layout, "pids")
    cg = ContainerCgroup.create(layout, PARENT, "pids", pids_max=5)
    try:
        assert cg.enforced()["pids"]
        p = subprocess.Popen(["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait"],
                             preexec_fn=lambda: join_self(cg), stderr=subprocess.PIPE)
        # sh gives up at the first failed fork; the sleeps it did start keep stderr open.
        assert p.wait(timeout=4) != 0
        assert 0 < len(cg.pids()) <= 5
        assert cg.kill()  # the sleeps that did start
        with p.stderr:
            assert b"fork" in p.stderr.read().lower()
    finally:
        cg.kill()
        assert cg.remove()


@pytest.mark.parametrize("via", ["detected", "v1-freezer"])
def test_kill_takes_down_a_process_tree(layout: Layout, via: str) -> None:
    if via == "v1-freezer":  # also exercise the fallback where the host has it
        if "freezer" not in layout.v1_mounts:
            pytest.skip("no v1 freezer hierarchy here")
        layout = replace(layout, kill=Mechanism("v1", layout.v1_mounts["freezer"], True))
    need(layout, "kill")
    cg = ContainerCgroup.create(layout, PARENT, "kill")
    assert cg.enforced()["kill"]
    p = subprocess.Popen(["sh", "-c", "sleep 30 & sh -c 'sleep 30 & wait' & wait"],
                         preexec_fn=cg.preexec_fn())
    try:
        deadline = time.monotonic() + 5
        while len(cg.pids()) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(cg.pids()) >= 3
        assert cg.kill()
        assert p.wait(timeout=5) == -9
        assert cg.pids() == set()
    finally:
        p.kill()
        p.wait()
    assert cg.remove() and not any(d.exists() for d in cg.paths)


def test_shim_style_join_add_and_remove_busy(layout: Layout) -> None:
    need(layout, "kill")
    cg = ContainerCgroup.create(layout, PARENT, "busy", cpu_units=512, pids_max=10)
    assert cg.enforced()["cpu"] == layout.cpu.writable
    # A shim handed the paths joins itself, then would exec the workload.
    code = ("import sys; from pathlib import Path; from shoal.agent.cgroups import preexec_join\n"
            "preexec_join(map(Path, sys.argv[1:]))(); print(open('/proc/self/cgroup').read())")
    r = subprocess.run([sys.executable, "-c", code, *map(str, cg.paths)], capture_output=True)
    assert r.returncode == 0 and r.stdout.decode().count(f"/{PARENT}/busy") == len(cg.paths), r
    p = subprocess.Popen(["sleep", "30"])
    try:
        cg.add(p.pid)
        assert cg.pids() == {p.pid}
        assert cg.remove() is False  # busy: left in place, no error
        assert all(d.exists() for d in cg.paths)
    finally:
        assert cg.kill()
        p.wait()
    assert cg.remove()
