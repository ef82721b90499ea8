"""cgroup limits for task containers run as plain processes, on cgroup v2, v1 or a hybrid of both.

GPU hosts are mostly pure v2 (/sys/fs/cgroup is cgroup2 with memory, cpu and pids); some (our CI)
are hybrid: each v1 controller has its own hierarchy and cgroup2 (/sys/fs/cgroup/unified) has no
resource controller, only `cgroup.kill`. `detect()` picks, per resource, a mechanism that is usable
*and writable* (v2 preferred). `ContainerCgroup.create()` makes `<hierarchy>/<parent>/<name>` where
needed and writes the limits; `enforced()` says which really apply. Where nothing is writable the
object is inert (methods are no-ops, `enforced()` all False): nothing pretends to enforce.

Joining: limits must apply from the workload's first instruction (v1 memory charges do not move
with a process), so the workload joins between fork and exec: `Popen(..., preexec_fn=
cg.preexec_fn())`, or `preexec_join(paths)()` / `join_self(cg)` in a shim just before it execs.
The join raises on failure, so a launch fails rather than running unconfined. File I/O only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
V1_CONTROLLERS = frozenset(
    "cpu cpuacct cpuset memory devices freezer net_cls net_prio blkio perf_event hugetlb pids "
    "rdma misc".split()
)
# resource -> (controller, v2 file, v1 file): the file that proves the controller works in a child.
_RESOURCES = {
    "memory": ("memory", "memory.max", "memory.limit_in_bytes"),
    "cpu": ("cpu", "cpu.weight", "cpu.shares"),
    "pids": ("pids", "pids.max", "pids.max"),
}
LIMITS = ("memory", "memory_reservation", "cpu", "pids", "kill")


@dataclass(frozen=True)
class Mechanism:
    """How one resource is controlled: `kind` is "v2", "v1" or "none"; `hierarchy` the mount point
    of the hierarchy that carries it; `writable` whether a probe child cgroup could use it."""

    kind: str = "none"
    hierarchy: Path | None = None
    writable: bool = False

    def __str__(self) -> str:
        where = f" at {self.hierarchy}" + ("" if self.writable else " (not writable)")
        return self.kind + ("" if self.kind == "none" else where)


@dataclass(frozen=True)
class Layout:
    v2_mount: Path | None
    v2_controllers: frozenset[str]
    v1_mounts: dict[str, Path]
    memory: Mechanism = Mechanism()
    cpu: Mechanism = Mechanism()
    pids: Mechanism = Mechanism()
    kill: Mechanism = Mechanism()  # v2: cgroup.kill; v1: the freezer

    def describe(self) -> dict[str, str]:
        return {r: str(getattr(self, r)) for r in ("memory", "cpu", "pids", "kill")}


def parse_mountinfo(text: str) -> tuple[Path | None, dict[str, Path]]:
    """The (first) cgroup2 mount point and the mount point of each v1 controller. A line reads
    `id parent maj:min root mountpoint opts [optional...] - fstype source superopts`; v1
    controllers are named in the super options (co-mounts like "cpu,cpuacct" share a path)."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        # mountinfo escapes space, tab, newline and backslash as \ooo.
        mnt = Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
        if tail[0] == "cgroup2" and v2 is None:
            v2 = mnt
        elif tail[0] == "cgroup":
            for opt in tail[2].split(","):
                if opt in V1_CONTROLLERS:
                    v1.setdefault(opt, mnt)
    return v2, v1


def _write(path: Path, value: str | int) -> None:
    # One write() per value: cgroup files parse each write as a whole.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def remove_dir(path: Path) -> bool:
    """rmdir a cgroup; False if it still holds processes or children (EBUSY) or cannot go."""
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _enable(hierarchy: Path, parent_name: str, controller: str) -> None:
    """v2 only: a controller's files appear in a child only when every ancestor from the mount
    root down lists it in cgroup.subtree_control. This fails (EBUSY) where the mount root is a
    non-root cgroup that holds processes (the "no internal processes" rule, e.g. inside a
    container with a private cgroup namespace), and (ENOENT) where the controller is bound to v1."""
    for d in (hierarchy, hierarchy / parent_name):
        sc = d / "cgroup.subtree_control"
        if controller not in sc.read_text().split():
            _write(sc, "+" + controller)


def _make(mech: Mechanism, parent_name: str, name: str, controller: str | None) -> Path:
    assert mech.hierarchy is not None
    (mech.hierarchy / parent_name).mkdir(exist_ok=True)
    if mech.kind == "v2" and controller:
        _enable(mech.hierarchy, parent_name, controller)
    leaf = mech.hierarchy / parent_name / name
    leaf.mkdir(exist_ok=True)  # exist_ok: an agent restarted after a crash reuses its cgroup
    return leaf


def _probe(mech: Mechanism, parent_name: str, controller: str | None, fname: str,
           value: str | None) -> bool:
    """Create a throwaway child under the parent and write the controlling file: the only reliable
    test (a root that can mkdir may still be refused a controller, or a file may be missing)."""
    assert mech.hierarchy is not None
    parent = mech.hierarchy / parent_name
    made_parent = not parent.exists()
    try:
        leaf = _make(mech, parent_name, f".probe-{os.getpid()}", controller)
        try:
            f = leaf / fname
            _write(f, f.read_text().strip() if value is None else value)
            return True
        finally:
            leaf.rmdir()
    except OSError:
        return False
    finally:
        if made_parent:
            remove_dir(parent)


def detect(root: Path = Path("/"), *, mountinfo: str | None = None, parent_name: str = "shoal",
           probe: bool = True) -> Layout:
    """Find the cgroup mounts (from `mountinfo`, or `<root>/proc/self/mountinfo`; mount points are
    taken relative to `root`, so tests can feed a fake tree) and pick a mechanism per resource.
    With `probe`, each candidate is tried by creating a child under `<hierarchy>/<parent_name>`;
    without it the preferred candidate is reported with writable=False."""
    if mountinfo is None:
        mountinfo = (root / "proc/self/mountinfo").read_text()
    v2, v1 = parse_mountinfo(mountinfo)
    rebase = lambda p: root / p.relative_to("/")  # noqa: E731
    v2 = rebase(v2) if v2 else None
    v1 = {c: rebase(p) for c, p in v1.items()}
    try:
        ctrls = frozenset((v2 / "cgroup.controllers").read_text().split()) if v2 else frozenset()
    except OSError:
        ctrls = frozenset()

    def pick(cands: list[tuple[Mechanism, str | None, str, str | None]]) -> Mechanism:
        if probe:
            for mech, ctl, fname, value in cands:
                if _probe(mech, parent_name, ctl, fname, value):
                    return Mechanism(mech.kind, mech.hierarchy, True)
        return cands[0][0] if cands else Mechanism()

    mechs = {}
    for res, (ctl, f2, f1) in _RESOURCES.items():
        cands = []
        if v2 and ctl in ctrls:  # a controller is on v2 only if the v2 root offers it
            cands.append((Mechanism("v2", v2), ctl, f2, None))
        if ctl in v1:
            cands.append((Mechanism("v1", v1[ctl]), None, f1, None))
        mechs[res] = pick(cands)
    kill = []
    if v2:  # cgroup.kill (Linux 5.14+) needs no controller: it works even in the hybrid layout
        kill.append((Mechanism("v2", v2), None, "cgroup.kill", "1"))
    if "freezer" in v1:
        kill.append((Mechanism("v1", v1["freezer"]), None, "freezer.state", "THAWED"))
    return Layout(v2, ctrls, v1, kill=pick(kill), **mechs)


def cpu_shares(units: int) -> int:
    """ECS cpu units are v1 cpu.shares; below 2 (the kernel minimum; 0 would mean "default 1024"
    to docker) the ECS agent uses 2."""
    return min(max(units, 2), 262144)


def cpu_weight(units: int) -> int:
    """v2 cpu.weight from shares, as runc converts: [2, 262144] maps linearly onto [1, 10000]."""
    return 1 + ((cpu_shares(units) - 2) * 9999) // 262142


def preexec_join(paths: Iterable[Path]) -> Callable[[], None]:
    """A function for `subprocess.Popen(preexec_fn=...)` (or for a shim to call just before exec)
    that moves the calling process into each cgroup directory in `paths`. Paths are encoded now,
    so the child only makes syscalls (no imports, no locks) between fork and exec."""
    targets = [os.fsencode(Path(p) / "cgroup.procs") for p in paths]

    def join() -> None:
        pid = str(os.getpid()).encode()
        for t in targets:
            fd = os.open(t, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    return join


def join_self(cgroup: ContainerCgroup) -> None:
    """Move the calling process (and so its later children) into `cgroup`."""
    preexec_join(cgroup.paths)()


@dataclass
class ContainerCgroup:
    name: str
    dirs: dict[str, Path] = field(default_factory=dict)  # role ("memory", ..., "kill") -> leaf
    kinds: dict[str, str] = field(default_factory=dict)  # role -> "v2" | "v1"
    applied: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(LIMITS, False))

    @classmethod
    def create(cls, layout: Layout, parent_name: str, name: str, memory_mib: int | None = None,
               memory_reservation_mib: int | None = None, cpu_units: int | None = None,
               pids_max: int | None = None) -> ContainerCgroup:
        cg = cls(name)
        wanted = {"memory": memory_mib is not None or memory_reservation_mib is not None,
                  "cpu": cpu_units is not None, "pids": pids_max is not None, "kill": True}
        for role, want in wanted.items():
            mech: Mechanism = getattr(layout, role)
            if not (want and mech.writable):
                continue
            with contextlib.suppress(OSError):
                cg.dirs[role] = _make(mech, parent_name, name, None if role == "kill" else role)
                cg.kinds[role] = mech.kind
        mem, low = (None if v is None else v * MIB for v in (memory_mib, memory_reservation_mib))
        cpu = (None, None) if cpu_units is None else (cpu_weight(cpu_units), cpu_shares(cpu_units))
        plan = [  # (limit, role, (v2 file, value), (v1 file, value))
            # Hard limit: over it the kernel reclaims, then OOM-kills inside this cgroup only.
            ("memory", "memory", ("memory.max", mem), ("memory.limit_in_bytes", mem)),
            # ECS memoryReservation: v2 memory.low shields that much from reclaim; v1's soft limit
            # is what reclaim pushes the cgroup back to under host pressure. Swap (memory.swap.max,
            # memsw) is left as the host has it.
            ("memory_reservation", "memory", ("memory.low", low),
             ("memory.soft_limit_in_bytes", low)),
            # A relative weight, not a cap: docker's --cpu-shares for ECS container cpu units.
            ("cpu", "cpu", ("cpu.weight", cpu[0]), ("cpu.shares", cpu[1])),
            # fork() fails with EAGAIN once the cgroup holds pids_max tasks.
            ("pids", "pids", ("pids.max", pids_max), ("pids.max", pids_max)),
        ]
        for limit, role, on_v2, on_v1 in plan:
            fname, value = on_v2 if cg.kinds.get(role) == "v2" else on_v1
            if value is not None and role in cg.dirs:
                with contextlib.suppress(OSError):
                    _write(cg.dirs[role] / fname, value)
                    cg.applied[limit] = True
        cg.applied["kill"] = "kill" in cg.dirs
        return cg

    @property
    def paths(self) -> list[Path]:
        """Every leaf directory, one per hierarchy used (roles may share the v2 directory)."""
        return sorted(set(self.dirs.values()))

    def enforced(self) -> dict[str, bool]:
        return dict(self.applied)

    def preexec_fn(self) -> Callable[[], None]:
        return preexec_join(self.paths)

    def add(self, pid: int) -> None:
        """Move a running process into every hierarchy (its children follow; memory it already
        holds stays charged where it was on v1). Raises OSError, e.g. ESRCH if it has exited."""
        for d in self.paths:
            _write(d / "cgroup.procs", pid)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.paths:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def kill(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup; True once none is left (False also when inert)."""
        if not self.dirs:
            return False
        d, kind = self.dirs.get("kill"), self.kinds.get("kill")
        end = time.monotonic() + timeout
        try:
            if d and kind == "v2":  # the kernel kills the whole subtree at once, racing no fork
                _write(d / "cgroup.kill", 1)
            elif d and kind == "v1":
                # Freeze first so nothing forks or exits while the pid list is read and signalled
                # (no pid-reuse race), then thaw so the SIGKILLs are delivered.
                _write(d / "freezer.state", "FROZEN")
                while (d / "freezer.state").read_text().strip() != "FROZEN" and \
                        time.monotonic() < end:
                    time.sleep(0.01)
                self._signal_all()
                _write(d / "freezer.state", "THAWED")
        except OSError:
            pass
        while self.pids():  # signalling again is also the fallback with neither mechanism
            if time.monotonic() > end:
                return False
            self._signal_all()
            time.sleep(0.02)
        return True

    def _signal_all(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def oom_killed(self) -> bool:
        d, kind = self.dirs.get("memory"), self.kinds.get("memory")
        if d is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            text = (d / ("memory.events" if kind == "v2" else "memory.oom_control")).read_text()
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":  # v2, and v1 since Linux 4.13
                    return int(value) > 0
            # Older v1: failcnt counts hits on the limit, which reclaim often resolves: a superset.
            return int((d / "memory.failcnt").read_text()) > 0
        return False

    def remove(self) -> bool:
        """rmdir each leaf; a cgroup still holding processes (EBUSY) is left. True if all gone."""
        return all([remove_dir(d) for d in self.paths])  # a list: try every one


def remove_parent(layout: Layout, parent_name: str) -> None:
    """rmdir `<hierarchy>/<parent_name>` in every hierarchy (agent shutdown); busy ones stay."""
    for hierarchy in {layout.v2_mount, *layout.v1_mounts.values()} - {None}:
        remove_dir(hierarchy / parent_name)
