#!/usr/bin/env python3
"""Real-hardware check of shoal's MPS support (issue 6, point 5), for a machine with an NVIDIA GPU.

    .venv/bin/python tests/gpu/check_mps.py [--json FILE] [--client-python PY] [--keep]

1. Starts the real MPS control daemon on GPU 0 through shoal's own `MpsManager` (the agent's code
   path: per-GPU pipe and log dirs, CUDA_VISIBLE_DEVICES=<uuid>, EXCLUSIVE_PROCESS where allowed).
2. Runs two torch clients with the exact environment `MpsManager.client_env()` gives a task, with
   pinned-memory limits of 2048M and 4096M. Each allocates below its limit (must work) and past it
   (must fail with out-of-memory); they are listed through the daemon while attached.
3. SIGKILLs the daemon (a) under shoal's `MpsSupervisor` + `AcceleratedCompute` in this process, and
   (b) under a real `shoal agent` (NVML, the real binary) joined to a real `shoal server`:
   ACCELERATED_COMPUTE must go IMPAIRED, as read through DescribeContainerInstances, then OK again
   once the agent has restarted the daemon.

It logs each step with timings and ends with one JSON object (also written to --json FILE).
Exit status: 0 every check passed, 1 a check failed, 77 skipped (no NVIDIA driver or GPU, no
nvidia-cuda-mps-control, or no torch with CUDA: nothing was run).

`--simulate` is a self-test of this script's plumbing on a machine without a GPU:
shoal-fake-mps-control and simulated GPUs stand in for the driver. It proves nothing about MPS.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # tests.support, tests.agent_support
if importlib.util.find_spec("shoal") is None:  # a Python without the project installed: the source tree
    sys.path.insert(0, str(REPO / "src"))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))

from shoal.agent.accelerated import AWS_XIDS, AcceleratedCompute  # noqa: E402
from shoal.agent.gpu.base import Gpu  # noqa: E402
from shoal.agent.mps.manager import PID_FILE, REAL_BINARY, MpsManager  # noqa: E402
from shoal.agent.mps.supervisor import MpsSupervisor  # noqa: E402

SKIPPED = 77
# (client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in MiB, GiB that must fit, GiB that must not). B's
# allocation that fits is A's that must not: only the limit differs.
CLIENTS = (("A", 2048, 1.5, 3.0), ("B", 4096, 3.0, 6.0))
PROBE_INTERVAL = 1.0  # the agent's --mps-probe-interval here; a crash must be seen at once anyway
CRASH_DETECTED_WITHIN = 1.0  # issue 6: a daemon crash is detected in under 1 s
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}

T0 = time.time()


def say(message: str) -> None:
    print(f"[{time.time() - T0:7.2f}s] {message}", flush=True)


class _Since(logging.Formatter):  # shoal's own log lines, on the same clock as ours
    def format(self, record: logging.LogRecord) -> str:
        return f"[{record.created - T0:7.2f}s]     {record.name}: {record.getMessage()}"


class Report:
    def __init__(self, mode: str):
        self.summary: dict = {"check": "shoal MPS on real hardware (issue 6, point 5)", "mode": mode,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0)),
                              "host": {}, "steps": {}, "checks": []}

    def check(self, name: str, ok: bool | None, detail: str = "") -> bool:
        """ok None: not applicable here (--simulate without CUDA); neither a pass nor a failure."""
        self.summary["checks"].append({"check": name, "result": {True: "pass", False: "FAIL", None: "skip"}[ok],
                                       **({"detail": detail} if detail else {})})
        say(f"{ {True: 'PASS', False: 'FAIL', None: 'SKIP'}[ok] }  {name}" + (f": {detail}" if detail else ""))
        return bool(ok)

    def step(self, name: str) -> "_Step":
        return _Step(self, name)

    @property
    def ok(self) -> bool:
        results = [c["result"] for c in self.summary["checks"]]
        return "pass" in results and "FAIL" not in results


class _Step:
    """Logs a step and its duration; an exception fails the step (and is recorded), not the run."""

    def __init__(self, report: Report, name: str):
        self.report, self.name = report, name

    def __enter__(self):
        self.started = time.time()
        say(f"=== {self.name}")
        return self

    def __exit__(self, kind, error, tb):
        took = round(time.time() - self.started, 2)
        self.report.summary["steps"][self.name] = {"seconds": took, **({"error": f"{kind.__name__}: {error}"}
                                                                       if error else {})}
        if error is not None and not isinstance(error, KeyboardInterrupt):
            self.report.check(f"{self.name}: no error", False, f"{kind.__name__}: {error}")
        say(f"--- {self.name}: {took:.2f} s")
        return error is not None and not isinstance(error, KeyboardInterrupt)


# --- prerequisites ---------------------------------------------------------------------------------
TORCH_PROBE = ("import json, torch; a = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
               "'cuda': torch.version.cuda, 'available': a, 'devices': torch.cuda.device_count() if a else 0}))")


def prerequisites(check_torch: bool = True, client_python: str | None = None) -> tuple[list[str], dict]:
    """(what is missing, what was found). Cheapest first, so a machine without a driver answers in
    milliseconds; torch is probed in a subprocess (importing it here would slow the test suite, and
    initialising CUDA before the daemon starts is best kept out of this process)."""
    info: dict = {}
    try:
        import pynvml
    except ImportError:
        return ["nvidia-ml-py (pynvml) is not installed (make install)"], info
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return [f"no NVIDIA driver (NVML: {e})"], info
    missing = []
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            missing.append("no NVIDIA GPU (NVML sees none)")
        else:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            info["gpu0"] = _text(pynvml.nvmlDeviceGetName(h))
            info["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            try:
                if pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
                    missing.append("GPU 0 is in MIG mode (MPS on MIG instances is out of scope)")
            except pynvml.NVMLError:  # NotSupported: no MIG on this part
                pass
    finally:
        pynvml.nvmlShutdown()
    binary = shutil.which(REAL_BINARY)
    if binary is None:
        missing.append(f"{REAL_BINARY} is not on PATH (it comes with the NVIDIA driver's utilities)")
    info["mps_control"] = binary
    if check_torch and not missing:
        found, tried = find_torch(client_python)
        if found is None:
            missing.append(f"no torch with CUDA ({'; '.join(tried)}): `pip install torch`, or --client-python")
        else:
            info["client_python"], info["torch"] = found
    return missing, info


def _pythons(client_python: str | None) -> list[str]:
    """Where the CUDA clients may run: they need torch only, not shoal, so a system Python with
    torch will do when the project's venv has none."""
    if client_python:
        return [client_python]
    return list(dict.fromkeys(p for p in (sys.executable, shutil.which("python3")) if p))


def find_torch(client_python: str | None) -> tuple[tuple[str, dict] | None, list[str]]:
    """((the first Python whose torch sees a CUDA device, its probe) or None, what each one said)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    tried = []
    for python in _pythons(client_python):
        out = None
        try:
            out = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=180, env=env)
            probe = json.loads(out.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            why = out.stderr.strip().splitlines()[-1] if out is not None and out.stderr.strip() else repr(e)
            tried.append(f"{python}: {why[:200]}")  # e.g. ModuleNotFoundError: No module named 'torch'
            continue
        if probe["available"] and probe["devices"] > 0:
            return (python, probe), tried
        tried.append(f"{python}: torch {probe['torch']} (CUDA {probe['cuda']}) sees no CUDA device")
    return None, tried


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def compute_mode(uuid_: str) -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            mode = pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid_))
            return COMPUTE_MODES.get(mode, str(mode))
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 (informative only)
        return f"unknown ({e})"


def set_compute_mode(uuid_: str, name: str) -> str | None:
    import pynvml

    mode = {v: k for k, v in COMPUTE_MODES.items()}[name]
    try:
        pynvml.nvmlInit()
        try:
            pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid_), mode)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as e:
        return str(e)
    return None


# --- step 2: the CUDA clients ----------------------------------------------------------------------
# Runs in its own process, as an MPS client: CUDA initialisation connects to the daemon named by
# CUDA_MPS_PIPE_DIRECTORY (without one, CUDA silently runs without MPS, and no limit would hold).
# One JSON line per event on stdout; waits for a line on stdin between attaching and allocating, so
# that the parent can list both clients while they are attached.
CLIENT = r'''
import json, os, sys, time
def emit(**kw): print(json.dumps(kw), flush=True)
name, sizes = sys.argv[1], [float(x) for x in sys.argv[2:]]
try:
    import torch
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
except Exception as e:
    emit(event="ready", pid=os.getpid(), cuda=False, error=f"{type(e).__name__}: {e}"[:300])
    sys.stdin.readline(); emit(event="result", allocations=[]); sys.exit(0)
free, total = torch.cuda.mem_get_info()
emit(event="ready", pid=os.getpid(), cuda=True, torch=torch.__version__, device=torch.cuda.get_device_name(0),
     mem_get_info_mib={"free": free >> 20, "total": total >> 20})
sys.stdin.readline()
oom_type = getattr(torch.cuda, "OutOfMemoryError", ())
allocations = []
for gib in sizes:
    entry, started = {"gib": gib}, time.monotonic()
    try:
        x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
        x.fill_(1); torch.cuda.synchronize()  # touch it: a kernel writes every byte
        del x
        entry["ok"] = True
    except Exception as e:
        text = str(e)
        entry.update(ok=False, error_type=f"{type(e).__module__}.{type(e).__qualname__}",
                     oom=isinstance(e, oom_type) or "out of memory" in text.lower(),
                     error=(text.splitlines() or [""])[0][:300])
    torch.cuda.empty_cache()
    entry["seconds"] = round(time.monotonic() - started, 3)
    allocations.append(entry)
emit(event="result", allocations=allocations)
'''


async def _read_event(name: str, proc, event: str, timeout: float) -> dict:
    """Client `name`'s next JSON line of that event (anything else on stdout is skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), max(0.1, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise RuntimeError(f"client {name}: no '{event}' within {timeout:g} s") from None
        if not line:
            raise RuntimeError(f"client {name} exited (status {await proc.wait()}) before '{event}'")
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("event") == event:
            return message


async def clients_step(manager: MpsManager, gpu: Gpu, python: str, prefix: list[str], root: Path,
                       report: Report, simulate: bool) -> None:
    env = dict(os.environ)
    # The daemon was started with CUDA_VISIBLE_DEVICES=<uuid>; its clients see that GPU as device
    # 0 and must not narrow it again (an inherited "1" would point past the daemon's one device).
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = {}
    try:
        for name, limit, fits, too_big in CLIENTS:
            client_env = manager.client_env(gpu, limit)  # what the agent gives an MPS task
            say(f"client {name}: {json.dumps(client_env)}; will allocate {fits} GiB, then {too_big} GiB")
            with open(root / f"client-{name}.err", "wb") as err:
                procs[name] = await asyncio.create_subprocess_exec(
                    *prefix, python, "-c", CLIENT, name, str(fits), str(too_big), env={**env, **client_env},
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err)
        ready = dict(zip(procs, await asyncio.gather(*(_read_event(n, p, "ready", 180) for n, p in procs.items()))))
        clients_out = report.summary["clients"] = {}
        for (name, limit, fits, too_big), (_, r) in zip(CLIENTS, ready.items()):
            clients_out[name] = {"limit": f"{limit}M", "pid": r["pid"], "ready": r}
            say(f"client {name} attached: {json.dumps(r)}")
            if not r["cuda"]:
                report.check(f"client {name} initialised CUDA", None if simulate else False, r.get("error", ""))
        pids = {r["pid"] for r in ready.values()}

        # both attached: the daemon lists them (server pid → clients), as the agent reads them
        listed: dict = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            listed = await manager.clients(gpu)
            if pids <= set(sum(listed.values(), [])):
                break
            await asyncio.sleep(0.2)
        say(f"get_server_list/get_client_list: {listed}")
        report.check("both clients are listed by the daemon (get_client_list)", pids <= set(sum(listed.values(), [])),
                     f"clients {sorted(pids)}, daemon says {listed}")
        per_device = await manager.command(gpu, "get_device_client_list")
        say("get_device_client_list:\n" + per_device.rstrip())
        report.check("both clients are listed per device (get_device_client_list)",
                     pids <= {int(t) for t in re.findall(r"\b\d+\b", per_device)}, per_device.strip()[:300])
        state = await manager.server_state(gpu)
        report.summary["mps_servers"] = state.servers
        report.check("their MPS server is ACTIVE", state.status == "ACTIVE", str(state.servers))

        for p in procs.values():
            p.stdin.write(b"go\n")
            await p.stdin.drain()
        results = dict(zip(procs, await asyncio.gather(*(_read_event(n, p, "result", 180) for n, p in procs.items()))))
        for name, limit, fits, too_big in CLIENTS:
            allocations = results[name]["allocations"]
            clients_out[name]["allocations"] = allocations
            if not allocations:
                continue  # no CUDA: already reported
            small, big = allocations
            say(f"client {name}: {json.dumps(allocations)}")
            report.check(f"client {name} (limit {limit}M): {fits} GiB fits", small["ok"],
                         small.get("error", f"{small['seconds']} s"))
            report.check(f"client {name} (limit {limit}M): {too_big} GiB fails with out-of-memory",
                         not big["ok"] and big.get("oom", False),
                         "it succeeded: the limit was not enforced" if big["ok"] else
                         f"{big['error_type']}: {big['error']}")
        for p in procs.values():
            await asyncio.wait_for(p.wait(), 30)
    except BaseException:
        for name in procs:  # torch's own words on why a client failed
            say(f"client {name} stderr (tail):\n{(root / f'client-{name}.err').read_text(errors='replace')[-2000:]}")
        raise
    finally:
        for p in procs.values():
            if p.returncode is None:
                p.kill()
                await p.wait()


async def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no {what} within {timeout:g} s")


# --- step 3a: the crash under shoal's supervisor, in this process ----------------------------------
async def supervisor_step(manager: MpsManager, gpu: Gpu, data_dir: Path, report: Report) -> None:
    changes: list[tuple[float, dict]] = []
    health = AcceleratedCompute(data_dir, AWS_XIDS, lambda: changes.append((time.time(), health.check())))
    supervisor = MpsSupervisor(manager, [gpu], interval=PROBE_INTERVAL, health=health, tasks_on=lambda uuid: [])
    await supervisor.start()  # adopts the daemon of steps 1-2, then watches it
    try:
        left = await _drain_servers(manager, gpu)
        if left:
            say(f"MPS server(s) {left} still up; killing the daemon anyway (the final sweep kills them)")
        probe = await manager.probe(gpu)
        report.check("the daemon answers a probe", probe.ok, probe.error or f"{probe.elapsed * 1000:.0f} ms")
        report.check("ACCELERATED_COMPUTE is OK before the kill", health.check()["status"] == "OK",
                     json.dumps(health.check()))
        pid = manager.pid(gpu)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        say(f"SIGKILL → control daemon {pid}")
        at, check = await _until(lambda: next((c for c in changes if c[1]["status"] == "IMPAIRED"), None),
                                 10, "IMPAIRED")
        out = report.summary["in_process"] = {"killed_pid": pid, "impaired_after_s": round(at - killed, 3),
                                              "impaired": check}
        report.check(f"in process: IMPAIRED within {CRASH_DETECTED_WITHIN:g} s of the kill",
                     at - killed < CRASH_DETECTED_WITHIN, f"{(at - killed) * 1000:.0f} ms: {check.get('reason')}")
        report.check("in process: the reason names the dead daemon",
                     check.get("reason") == f"MPS control daemon process {pid} exited", str(check.get("reason")))
        at_ok, _ = await _until(lambda: next((c for c in changes if c[0] > at and c[1]["status"] == "OK"), None),
                                30, "OK after the restart")
        new = manager.pid(gpu)
        out.update(ok_again_after_s=round(at_ok - killed, 3), new_pid=new)
        report.check("in process: daemon restarted and OK again", new is not None and new != pid,
                     f"{at_ok - killed:.2f} s after the kill; daemon {pid} → {new}")
    finally:
        supervisor.close()  # lets go of the daemon; the caller stops it


async def _drain_servers(manager: MpsManager, gpu: Gpu) -> list[int]:
    """Let the kill hit the daemon alone: an MPS server would outlive it. The server leaves with its
    last client; one that lingers (the fake's do) is shut down, as no client is left to lose it.
    The servers still up after that."""
    deadline, asked = time.monotonic() + 5, False
    while servers := sorted((await manager.server_state(gpu)).servers):
        if time.monotonic() > deadline:
            if asked:
                return servers
            for pid in servers:
                say(f"MPS server {pid} outlived its clients: shutdown_server {pid}")
                await manager.command(gpu, f"shutdown_server {pid}", timeout=3)
            deadline, asked = time.monotonic() + 10, True
        await asyncio.sleep(0.2)
    return []


# --- step 3b: the crash under a real agent, seen through the ECS API -------------------------------
def agent_step(root: Path, gpus: list[Gpu], binary: str, report: Report, simulate: bool) -> None:
    from tests.agent_support import AgentProcess
    from tests.support import ServerProcess, wait_for

    gpu = gpus[0]
    (root / "server").mkdir()
    server, agent = ServerProcess(root / "server"), None
    try:
        server.start()
        say(f"shoal server on {server.endpoint} (SQLite in {root / 'server'})")
        ecs = server.client("ecs")
        ecs.create_cluster(clusterName="gpu-check")
        args = ["--mps-probe-interval", f"{PROBE_INTERVAL:g}"]
        if simulate:  # a real GPU host gets neither: NVML finds the GPUs, PATH the real binary
            spec = root / "fake-gpus.json"
            spec.write_text(json.dumps({"model": gpu.model, "count": len(gpus), "memoryMiB": gpu.memory_mib,
                                        "uuids": [g.uuid for g in gpus]}))
            args += ["--fake-gpus", str(spec)]
        agent = AgentProcess(server, root / "agent", tuple(args), cluster="gpu-check")
        say(f"shoal agent {' '.join(args)} (log: {agent.log_path})")
        agent.start().wait_active(ecs, timeout=60)

        def describe() -> dict:
            return ecs.describe_container_instances(cluster="gpu-check", containerInstances=[agent.arn],
                                                    include=["CONTAINER_INSTANCE_HEALTH"])["containerInstances"][0]

        def accelerated() -> dict:
            return next(d for d in describe()["healthStatus"]["details"] if d["type"] == "ACCELERATED_COMPUTE")

        def wait_accelerated(status: str, timeout: float) -> dict:
            return wait_for(lambda: (lambda d: d if d["status"] == status else None)(accelerated()),
                            timeout=timeout, interval=0.05, message=f"ACCELERATED_COMPUTE {status}")

        ci = describe()
        attributes = {a["name"] for a in ci["attributes"]}
        gpu_ids = [d["gpuId"] for d in ci.get("gpuDevices", [])]
        report.check("the agent registered the GPU with MPS capability",
                     gpu.uuid in gpu_ids and "ecs.capability.gpu-sharing-mps" in attributes,
                     f"gpuDevices {gpu_ids}")
        ok = wait_accelerated("OK", 30)
        report.check("agent: ACCELERATED_COMPUTE OK before the kill", True, json.dumps(ok, default=str))
        pid_file = agent.data_dir.resolve() / "mps" / gpu.uuid / "pipe" / PID_FILE
        pid = wait_for(lambda: _pid(pid_file), timeout=15, message=f"the agent's daemon ({pid_file})")
        report.summary["host"]["agent_compute_mode"] = compute_mode(gpu.uuid) if not simulate else "n/a"

        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        say(f"SIGKILL → the agent's control daemon {pid}")
        impaired = wait_accelerated("IMPAIRED", 10)
        seen = time.time() - killed
        changed = impaired.get("lastStatusChange")
        reported = changed.timestamp() - killed if hasattr(changed, "timestamp") else seen
        say(f"DescribeContainerInstances: {json.dumps(impaired, default=str)}")
        out = report.summary["agent"] = {"killed_pid": pid, "impaired_reported_after_s": round(reported, 3),
                                         "impaired_seen_by_poll_after_s": round(seen, 3),
                                         "impaired": json.loads(json.dumps(impaired, default=str))}
        report.check(f"agent: IMPAIRED within {CRASH_DETECTED_WITHIN:g} s of the kill (lastStatusChange)",
                     reported < CRASH_DETECTED_WITHIN, f"{reported * 1000:.0f} ms; seen by polling after "
                                                       f"{seen * 1000:.0f} ms")
        report.check("agent: statusReason names the dead daemon",
                     impaired.get("statusReason") == f"MPS control daemon process {pid} exited",
                     str(impaired.get("statusReason")))
        wait_accelerated("OK", 30)
        back = time.time() - killed
        new = _pid(pid_file)
        out.update(ok_again_after_s=round(back, 3), new_pid=new)
        report.check("agent: daemon restarted, ACCELERATED_COMPUTE OK again", new is not None and new != pid,
                     f"{back:.2f} s after the kill; daemon {pid} → {new}")
    except BaseException:
        if agent is not None:
            say(f"agent log (tail):\n{agent.log_tail(3000)}")
        raise
    finally:
        if agent is not None:
            agent.stop()  # its daemons outlive it by design: stop them as the agent's manager would
            asyncio.run(_stop_daemons(MpsManager(agent.data_dir, binary), gpus))
        server.stop()


def _pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


async def _stop_daemons(manager: MpsManager, gpus: list[Gpu]) -> None:
    """Quit (then signal) every daemon under the manager's data dir; restores DEFAULT compute mode."""
    for g in gpus:
        try:
            await manager.stop(g)
        except Exception as e:  # noqa: BLE001 (cleanup: the sweep below is the backstop)
            say(f"stopping the daemon of {g.uuid} under {manager.data_dir}: {e}")


def _mps_processes() -> dict[int, str]:
    """Running nvidia-cuda-mps-* processes (pid → command line)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else [b""]
        except OSError:
            continue
        if Path(argv[0].decode(errors="replace")).name.startswith("nvidia-cuda-mps"):
            found[int(proc.name)] = " ".join(a.decode(errors="replace") for a in argv if a)
    return found


def sweep(root: Path) -> list[int]:
    """SIGKILL whatever still carries our log dir (daemons and MPS servers started under `root`)."""
    marker = f"CUDA_MPS_LOG_DIRECTORY={root}/".encode()
    killed = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if marker in (proc / "environ").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed.append(int(proc.name))
            except OSError:
                pass
    return killed


# --- main ------------------------------------------------------------------------------------------
async def mps_steps(manager: MpsManager, gpu: Gpu, python: str, prefix: list[str], root: Path,
                    report: Report, simulate: bool) -> None:
    started = False
    try:
        with report.step("1. start the MPS control daemon on GPU 0 through MpsManager"):
            info = await manager.start(gpu)
            started = True
            mode = compute_mode(gpu.uuid) if not simulate else "n/a (simulated)"
            report.summary["host"]["compute_mode_under_mps"] = mode
            say(f"daemon {info.pid}, pipe dir {info.pipe_dir}, log dir {info.log_dir}, compute mode {mode}")
            if not simulate and mode != "EXCLUSIVE_PROCESS":
                say(f"note: the GPU stays {mode} (setting EXCLUSIVE_PROCESS needs root; MPS works without it)")
            environ = Path(f"/proc/{info.pid}/environ").read_bytes().split(b"\0")
            report.check("daemon runs with CUDA_VISIBLE_DEVICES=<GPU uuid> and its own pipe dir",
                         f"CUDA_VISIBLE_DEVICES={gpu.uuid}".encode() in environ
                         and f"CUDA_MPS_PIPE_DIRECTORY={info.pipe_dir}".encode() in environ, str(info.pipe_dir))
            probe = await manager.probe(gpu)
            report.check("the daemon answers a probe (get_default_active_thread_percentage)", probe.ok,
                         probe.error or f"{probe.elapsed * 1000:.0f} ms")
        if not started:
            return
        with report.step("2. two torch clients with different pinned-memory limits"):
            await clients_step(manager, gpu, python, prefix, root, report, simulate)
        with report.step("3a. SIGKILL the daemon under MpsSupervisor + AcceleratedCompute (in process)"):
            await supervisor_step(manager, gpu, root, report)
    finally:
        await manager.stop(gpu)  # quit, then signals; DEFAULT compute mode again
        say("in-process daemon stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the JSON summary to this file")
    parser.add_argument("--client-python", help="Python with torch (CUDA) for the clients; default: this "
                                                "one, else python3 on PATH")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (kept anyway on failure)")
    parser.add_argument("--simulate", action="store_true", help="self-test of the script without a GPU "
                                                                "(shoal-fake-mps-control): no MPS evidence")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    logging.getLogger().handlers[0].setFormatter(_Since())
    for noisy in ("httpx", "botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    report = Report("simulated (shoal-fake-mps-control; NOT a hardware check)" if args.simulate else "real GPU")
    host = report.summary["host"]
    say(f"shoal GPU check: {report.summary['mode']}")
    if args.simulate:
        from shoal.agent.mps.fake_control import binary_path

        binary, prefix = binary_path(), [binary_path(), "--client", "--"]  # fake clients of the fake daemon
        gpus = [Gpu(0, f"GPU-{uuid.uuid4()}", "NVIDIA H200 (simulated)", 143771)]
        found, _ = find_torch(args.client_python)
        python = found[0] if found else (args.client_python or sys.executable)
        host.update(mps_control=binary, client_python=python, torch=found[1] if found else None)
    else:
        missing, info = prerequisites(client_python=args.client_python)
        host.update(info)
        if missing:
            say("SKIPPED: " + "; ".join(missing))
            report.summary.update(ok=False, status="skipped", skipped=missing)
            _finish(report, args.json)
            return SKIPPED
        from shoal.agent.gpu.nvml import NvmlGpus

        backend = NvmlGpus()  # the agent's own discovery
        try:
            gpus = backend.devices()
        finally:
            backend.close()
        binary, prefix, python = info["mps_control"], [], info["client_python"]
    gpu = gpus[0]
    host["gpu"] = {"index": gpu.index, "uuid": gpu.uuid, "model": gpu.model, "memory_mib": gpu.memory_mib}
    mode_before = compute_mode(gpu.uuid) if not args.simulate else None
    host["compute_mode_before"] = mode_before
    say(f"GPU 0: {gpu.model} {gpu.uuid}, {gpu.memory_mib} MiB; MPS control: {binary}; clients: {python} "
        f"(torch {json.dumps(host.get('torch'))}); compute mode {mode_before}")

    others = _mps_processes()
    host["mps_processes_before"] = others
    if others:  # e.g. a system-wide daemon on /tmp/nvidia-mps: its server may hold the GPU
        say(f"note: MPS processes were already running before this check: {others}")

    # short, fixed root: the daemon's socket path (<root>/agent/mps/<uuid>/pipe/control) must stay
    # under the 108-byte limit of Unix socket paths, whatever TMPDIR is
    root = Path(tempfile.mkdtemp(prefix="shoal-gpu-", dir="/tmp"))
    say(f"work dir {root}")
    try:
        manager = MpsManager(root / "check", binary)
        asyncio.run(mps_steps(manager, gpu, python, prefix, root, report, args.simulate))
        with report.step("3b. SIGKILL the daemon under a real shoal agent + server (DescribeContainerInstances)"):
            agent_step(root, gpus, binary, report, args.simulate)
    finally:
        leftovers = sweep(root)
        if leftovers:
            say(f"killed leftover MPS processes {leftovers}")
        if mode_before is not None:
            after = compute_mode(gpu.uuid)
            if after != mode_before and not after.startswith("unknown"):
                error = set_compute_mode(gpu.uuid, mode_before)
                say(f"compute mode was {after}: set back to {mode_before}" + (f" failed: {error}" if error else ""))
                after = compute_mode(gpu.uuid)
            host["compute_mode_after"] = after
        report.summary.update(ok=report.ok, status="passed" if report.ok else "failed")
        if report.ok and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            report.summary["work_dir"] = str(root)
            say(f"kept {root} (MPS logs under */mps/*/log, agent and server logs at its top)")
        _finish(report, args.json)
    return 0 if report.ok else 1


def _finish(report: Report, path: Path | None) -> None:
    s = report.summary
    s["total_seconds"] = round(time.time() - T0, 2)
    passed = sum(c["result"] == "pass" for c in s["checks"])
    failed = [c["check"] for c in s["checks"] if c["result"] == "FAIL"]
    say(f"RESULT: {s['status'].upper()}: {passed} passed, {len(failed)} failed"
        + (f" ({'; '.join(failed)})" if failed else "") + f", {s['total_seconds']} s")
    text = json.dumps(s, indent=2, default=str)
    print("=== summary (JSON)\n" + text, flush=True)
    if path is not None:
        path.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
