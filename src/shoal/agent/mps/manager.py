"""The agent's MPS manager: one MPS control daemon per GPU, started, probed, watched and
restarted through the control binary (`nvidia-cuda-mps-control` on PATH by default; simulated
hosts pass the path of `shoal-fake-mps-control`). The same code drives both.

Layout, per GPU: `<data dir>/mps/<gpu uuid>/pipe` (CUDA_MPS_PIPE_DIRECTORY: the `control`
socket and `nvidia-cuda-mps-control.pid`) and `<data dir>/mps/<gpu uuid>/log`
(CUDA_MPS_LOG_DIRECTORY). The daemon runs with CUDA_VISIBLE_DEVICES=<gpu uuid>, so its clients
see that GPU as device 0.

Daemons outlive the agent: they are started with `-d` (they daemonize, in a session of their
own) and found again through the pid file of their pipe dir. A pid counts as ours only if the
process is alive (not a zombie) and its environment names our pipe dir, so a recycled pid is
never adopted or signalled.

Every control interaction runs the binary's front end as a subprocess under a hard timeout
(the legacy interface has none of its own). A daemon's exit is seen at once through a pidfd
on the event loop, not at the next probe.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import shutil
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from shoal.agent.gpu.base import Gpu
from shoal.agent.mps.compute_mode import ComputeMode, default_compute_mode

log = logging.getLogger(__name__)

REAL_BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"
NOT_RESPONDING = "MPS control daemon is not responding"
OK, IMPAIRED = "OK", "IMPAIRED"
PROBE_COMMAND = "get_default_active_thread_percentage"


class MpsError(RuntimeError):
    """The control daemon could not be started, or did not answer a command."""


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    error: str | None = None
    elapsed: float = 0.0


@dataclass(frozen=True)
class ServerState:
    """MPS servers of one GPU's daemon: pid → INITIALIZING | ACTIVE | FAULT."""

    servers: dict[int, str]

    @property
    def faulted(self) -> list[int]:
        return sorted(pid for pid, status in self.servers.items() if status == "FAULT")

    @property
    def fault(self) -> bool:
        return bool(self.faulted)

    @property
    def status(self) -> str:
        """FAULT if any server is, else INITIALIZING if any is, else ACTIVE; NONE without servers
        (normal: servers start with their first client)."""
        for status in ("FAULT", "INITIALIZING"):
            if status in self.servers.values():
                return status
        return "ACTIVE" if self.servers else "NONE"


@dataclass(frozen=True)
class DaemonInfo:
    gpu_uuid: str
    pid: int
    pipe_dir: Path
    log_dir: Path
    adopted: bool  # found running (started by an earlier agent), not started now


class _Daemon:
    """A running control daemon, and a future that resolves when its process exits."""

    def __init__(self, info: DaemonInfo):
        self.info = info
        self.pid = info.pid
        self.stopping = False  # stopped on purpose: its exit is no crash
        self.loop = asyncio.get_running_loop()
        self.exited: asyncio.Future = self.loop.create_future()
        self._pidfd: int | None = None
        self._poller: asyncio.Task | None = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
            self.loop.add_reader(self._pidfd, self._on_exit)
        except ProcessLookupError:
            self.exited.set_result(None)
        except (AttributeError, OSError):  # no pidfd (old kernel): look every 100 ms
            self._pidfd = None
            self._poller = self.loop.create_task(self._poll())

    def _on_exit(self) -> None:
        self._close_pidfd()
        if not self.exited.done():
            self.exited.set_result(None)

    async def _poll(self) -> None:
        while _alive(self.pid):
            await asyncio.sleep(0.1)
        if not self.exited.done():
            self.exited.set_result(None)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    @property
    def crashed(self) -> bool:
        return self.exited.done() and not self.exited.cancelled() and not self.stopping

    def detach(self) -> None:
        self._close_pidfd()
        if self._poller is not None:
            self._poller.cancel()
        if not self.exited.done():
            self.exited.cancel()


OnChange = Callable[[str, "str | None"], Any]


class MpsManager:
    def __init__(self, data_dir: Path | str, binary: str | os.PathLike | None = None,
                 compute_mode: ComputeMode | None = None, *, start_timeout: float = 10.0,
                 command_timeout: float = 5.0, daemon_env: dict[str, str] | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.root = self.data_dir / "mps"
        self.binary = str(binary) if binary else REAL_BINARY
        self.daemon_env = dict(daemon_env or {})  # added to the daemons' environment only
        self.start_timeout = start_timeout
        self.command_timeout = command_timeout
        self._compute_mode = compute_mode
        self._resolved: str | None = None
        self._daemons: dict[str, _Daemon] = {}
        self._gpus: dict[str, Gpu] = {}
        self._swaps: dict[str, asyncio.Event] = {}
        self._watchers: dict[str, set[asyncio.Task]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._restarting: set[str] = set()

    # --- paths and environments ---------------------------------------------------------------
    def pipe_dir(self, gpu: Gpu) -> Path:
        return self.root / gpu.uuid / "pipe"

    def log_dir(self, gpu: Gpu) -> Path:
        return self.root / gpu.uuid / "log"

    @property
    def compute_mode(self) -> ComputeMode:
        if self._compute_mode is None:
            self._compute_mode = default_compute_mode(self.binary)
        return self._compute_mode

    def _binary(self) -> str:
        if self._resolved is None:
            found = shutil.which(self.binary)
            if found is None:
                raise MpsError(f"MPS control binary {self.binary!r} not found"
                               + ("" if os.sep in self.binary else " on PATH"))
            self._resolved = found
        return self._resolved

    def _env(self, gpu: Gpu, daemon: bool = False) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir(gpu))
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir(gpu))
        if daemon:
            env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
            env.update(self.daemon_env)
        return env

    def client_env(self, gpu: Gpu, memory_mib: int, max_compute_percent: int | None = None) -> dict[str, str]:
        """What an MPS task's containers get. Device index 0: under a per-GPU daemon started with
        CUDA_VISIBLE_DEVICES=<uuid>, the client sees its GPU as device 0."""
        if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or memory_mib < 1:
            raise ValueError(f"nvidiaMps.memory must be a whole number of MiB, at least 1, got {memory_mib!r}")
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu)),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory_mib}M",
        }
        if max_compute_percent is not None:
            if isinstance(max_compute_percent, bool) or not isinstance(max_compute_percent, int) \
                    or not 1 <= max_compute_percent <= 100:
                raise ValueError(f"nvidiaMps.maxComputePercent must be a whole number from 1 to 100, "
                                 f"got {max_compute_percent!r}")
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max_compute_percent)
        return env

    # --- daemons ------------------------------------------------------------------------------
    def _lock(self, uuid: str) -> asyncio.Lock:
        return self._locks.setdefault(uuid, asyncio.Lock())

    def _swap(self, uuid: str) -> asyncio.Event:
        return self._swaps.setdefault(uuid, asyncio.Event())

    def pid(self, gpu: Gpu) -> int | None:
        d = self._daemons.get(gpu.uuid)
        return d.pid if d is not None and not d.exited.done() else None

    def crashed(self, gpu: Gpu) -> bool:
        """The daemon this manager watches for `gpu` has exited, and not because it was stopped."""
        d = self._daemons.get(gpu.uuid)
        return d is not None and d.crashed

    def restarting(self, gpu: Gpu) -> bool:
        return gpu.uuid in self._restarting

    def _install(self, gpu: Gpu, pid: int, adopted: bool) -> DaemonInfo:
        info = DaemonInfo(gpu.uuid, pid, self.pipe_dir(gpu), self.log_dir(gpu), adopted)
        old = self._daemons.get(gpu.uuid)
        if old is not None:
            old.detach()
        self._daemons[gpu.uuid] = _Daemon(info)
        self._gpus[gpu.uuid] = gpu
        self._swap(gpu.uuid).set()  # wake watchers: a new daemon to watch
        self._swaps[gpu.uuid] = asyncio.Event()
        return info

    def _running_pid(self, gpu: Gpu) -> int | None:
        """The pid in the pipe dir's pid file, if that process is alive and is this GPU's daemon."""
        pid = _read_pid(self.pipe_dir(gpu) / PID_FILE)
        if pid is not None and _alive(pid) and _owned(pid, self.pipe_dir(gpu), self.log_dir(gpu), self.binary):
            return pid
        return None

    async def start(self, gpu: Gpu) -> DaemonInfo:
        """Start this GPU's control daemon, or adopt the one already running there."""
        async with self._lock(gpu.uuid):
            d = self._daemons.get(gpu.uuid)
            if d is not None and not d.exited.done():
                return d.info
            pipe, logs = self.pipe_dir(gpu), self.log_dir(gpu)
            if len(os.fsencode(pipe / SOCKET)) > 107 and Path(self.binary).name == REAL_BINARY:
                log.warning("MPS: socket path %s is longer than a Unix socket path may be; "
                            "use a shorter agent data dir", pipe / SOCKET)
            pipe.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
            await self._apply_compute_mode(gpu)
            pid = self._running_pid(gpu)
            if pid is not None:
                log.info("MPS: adopted control daemon %d for %s", pid, gpu.uuid)
                return self._install(gpu, pid, adopted=True)
            _remove_stale(pipe)
            pid = await self._spawn(gpu)
            log.info("MPS: started control daemon %d for %s", pid, gpu.uuid)
            return self._install(gpu, pid, adopted=False)

    async def _apply_compute_mode(self, gpu: Gpu) -> None:
        reason = await asyncio.to_thread(self.compute_mode.set_exclusive, gpu)
        if reason:
            log.warning("MPS: %s stays in its compute mode: %s", gpu.uuid, reason)

    async def _spawn(self, gpu: Gpu) -> int:
        pipe = self.pipe_dir(gpu)
        out_path = self.log_dir(gpu) / "shoal-start.out"  # the -d front end's own output
        with open(out_path, "ab") as out:
            start = out.tell()
            try:
                proc = await asyncio.create_subprocess_exec(
                    self._binary(), "-d", env=self._env(gpu, daemon=True), stdin=asyncio.subprocess.DEVNULL,
                    stdout=out, stderr=out, start_new_session=True, cwd="/")
            except OSError as e:
                raise MpsError(f"cannot run {self.binary}: {e}") from e
        try:
            rc = await asyncio.wait_for(proc.wait(), self.start_timeout)
        except asyncio.TimeoutError:
            _signal(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise MpsError(f"{self.binary} -d did not return within {self.start_timeout:g} s") from None
        if rc != 0:
            with open(out_path, "rb") as f:
                f.seek(start)
                detail = f.read().decode(errors="replace").strip()[-500:]
            raise MpsError(f"{self.binary} -d exited with status {rc}: {detail or 'no output'}")
        deadline = time.monotonic() + self.start_timeout
        while True:  # the real -d may return before the daemon has written its pid and socket
            pid = self._running_pid(gpu)
            if pid is not None and _is_socket(pipe / SOCKET):
                return pid
            if time.monotonic() > deadline:
                raise MpsError(f"MPS control daemon for {gpu.uuid} did not come up within "
                               f"{self.start_timeout:g} s (no live pid in {pipe / PID_FILE} or no socket)")
            await asyncio.sleep(0.01)

    async def restart(self, gpu: Gpu) -> DaemonInfo:
        """Stop this GPU's daemon (quit, then signals), clear its stale files, start a new one.
        Its clients have lost their server: the caller fails or retries their tasks."""
        self._restarting.add(gpu.uuid)
        try:
            async with self._lock(gpu.uuid):
                await self._stop_daemon(gpu, restore=False)
            return await self.start(gpu)
        finally:
            self._restarting.discard(gpu.uuid)

    async def stop(self, gpu: Gpu) -> None:
        """Stop this GPU's daemon and its watchers, and restore the DEFAULT compute mode."""
        for task in self._watchers.pop(gpu.uuid, set()):
            task.cancel()
        async with self._lock(gpu.uuid):
            await self._stop_daemon(gpu, restore=True)

    async def stop_all(self) -> None:
        """Stop every daemon this manager started or adopted (not for an agent restart: the
        daemons are meant to outlive the agent; see close())."""
        await asyncio.gather(*(self.stop(gpu) for gpu in list(self._gpus.values())))

    def close(self) -> None:
        """Let go of the daemons without stopping them: cancel watchers, close pidfds."""
        for tasks in self._watchers.values():
            for task in tasks:
                task.cancel()
        self._watchers.clear()
        for d in self._daemons.values():
            d.detach()
        self._daemons.clear()

    async def _stop_daemon(self, gpu: Gpu, restore: bool) -> None:
        pipe = self.pipe_dir(gpu)
        d = self._daemons.get(gpu.uuid)
        if d is not None:
            d.stopping = True
        pid = d.pid if d is not None and not d.exited.done() else self._running_pid(gpu)
        if pid is not None and _alive(pid):
            servers: list[int] = []
            quit_sent = False
            try:  # a daemon that cannot list its servers will not quit either: signal it
                servers = _pids(await self.command(gpu, "get_server_list", timeout=1.0))
                await self.command(gpu, "quit", timeout=2.0)
                quit_sent = True
            except MpsError:
                pass
            if not (quit_sent and await _wait_gone(pid, 3.0)):
                for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
                    if _owned(pid, pipe, self.log_dir(gpu), self.binary):
                        _signal(pid, sig)
                    if await _wait_gone(pid, wait):
                        break
            for server in servers:  # only processes that still carry this GPU's pipe dir
                if not await _wait_gone(server, 0.5) and _owned(server, pipe, self.log_dir(gpu), None):
                    _signal(server, signal.SIGKILL)
        if d is not None:
            d.detach()
            self._daemons.pop(gpu.uuid, None)
        _remove_stale(pipe)
        if restore:
            reason = await asyncio.to_thread(self.compute_mode.restore, gpu)
            if reason:
                log.warning("MPS: %s", reason)

    # --- control commands ---------------------------------------------------------------------
    async def _run(self, gpu: Gpu, text: str, timeout: float) -> tuple[int, str, str]:
        """Run the front end with `text` on stdin; asyncio.TimeoutError after `timeout` s (the
        front end is killed)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self._binary(), env=self._env(gpu), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise MpsError(f"cannot run {self.binary}: {e}") from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(text.encode()), timeout)
        except asyncio.TimeoutError:
            _signal(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def command(self, gpu: Gpu, line: str, timeout: float | None = None) -> str:
        """One control command; its reply (stdout). MpsError if the daemon cannot be reached or
        does not answer in time. A rejected command is not an error here: the real front end
        prints the rejection on stdout and exits 0, so callers check the reply."""
        timeout = self.command_timeout if timeout is None else timeout
        try:
            rc, out, err = await self._run(gpu, line + "\n", timeout)
        except asyncio.TimeoutError:
            raise MpsError(f"{NOT_RESPONDING}: no answer to '{line}' within {timeout:g} s") from None
        if rc != 0:
            raise MpsError(f"{NOT_RESPONDING}: {Path(self.binary).name} exited with status {rc}: "
                           f"{(err or out).strip()[:300]}")
        return out

    async def probe(self, gpu: Gpu, timeout: float = 3.0) -> ProbeResult:
        """One health probe: the daemon process is alive and answers a control round trip
        (get_default_active_thread_percentage → a number) within `timeout` s."""
        started = time.monotonic()

        def failed(error: str) -> ProbeResult:
            return ProbeResult(False, error, time.monotonic() - started)

        d = self._daemons.get(gpu.uuid)
        if d is not None and d.crashed:
            pid = self._running_pid(gpu)  # restarted by someone else? then watch that one
            if pid is None or pid == d.pid:
                return failed(f"MPS control daemon process {d.pid} exited")
            log.info("MPS: control daemon %d for %s replaced %d", pid, gpu.uuid, d.pid)
            self._install(gpu, pid, adopted=True)
        try:
            rc, out, err = await self._run(gpu, PROBE_COMMAND + "\n", timeout)
        except asyncio.TimeoutError:
            return failed(f"no answer to {PROBE_COMMAND} within {timeout:.2g} s")
        except MpsError as e:
            return failed(str(e))
        if rc != 0:
            return failed(f"{Path(self.binary).name} exited with status {rc}: {(err or out).strip()[:300]}")
        reply = out.strip().splitlines()
        try:
            float(reply[0])
        except (IndexError, ValueError):
            return failed(f"unexpected reply to {PROBE_COMMAND}: {out.strip()[:200]!r}")
        return ProbeResult(True, None, time.monotonic() - started)

    async def gate(self, gpu: Gpu, attempts: int = 3, within: float = 10.0, timeout: float = 3.0,
                   backoff: float = 1.0) -> ProbeResult:
        """The per-task gate: up to `attempts` probes (each under `timeout`), backing off
        `backoff` s ×2 with 20 % jitter, all within `within` s. On failure the error reads
        'MPS control daemon is not responding: <last probe error> (…)'."""
        started = time.monotonic()
        result = ProbeResult(False, "not probed")
        tries = 0
        delay = backoff
        while tries < attempts:
            remaining = within - (time.monotonic() - started)
            if remaining <= 0.05:
                break
            tries += 1
            result = await self.probe(gpu, min(timeout, remaining))
            if result.ok:
                return ProbeResult(True, None, time.monotonic() - started)
            pause = delay * random.uniform(0.8, 1.2)
            delay *= 2
            if tries < attempts and within - (time.monotonic() - started) > pause + 0.05:
                await asyncio.sleep(pause)
        elapsed = time.monotonic() - started
        return ProbeResult(False, f"{NOT_RESPONDING}: {result.error} "
                                  f"({tries} attempt{'s' if tries != 1 else ''} in {elapsed:.1f} s)", elapsed)

    async def server_state(self, gpu: Gpu, timeout: float | None = None) -> ServerState:
        servers: dict[int, str] = {}
        for pid in _pids(await self.command(gpu, "get_server_list", timeout)):
            words = (await self.command(gpu, f"get_server_status {pid}", timeout)).split()
            status = words[0].upper() if len(words) == 1 else None
            if status is not None:  # anything longer is "not found": it has just exited
                servers[pid] = status
        return ServerState(servers)

    async def clients(self, gpu: Gpu, timeout: float | None = None) -> dict[int, list[int]]:
        """Server pid → the pids of its clients."""
        return {server: _pids(await self.command(gpu, f"get_client_list {server}", timeout))
                for server in _pids(await self.command(gpu, "get_server_list", timeout))}

    async def terminate_client(self, gpu: Gpu, client_pid: int) -> bool:
        """Evict one client through the control interface, leaving its neighbours alone. False if
        no server of this GPU has that client. The client gets a sticky error at its next CUDA
        call; the caller kills the process after that."""
        for server, clients in (await self.clients(gpu)).items():
            if client_pid in clients:
                reply = (await self.command(gpu, f"terminate_client {server} {client_pid}")).strip()
                if reply not in ("", "0"):
                    raise MpsError(f"terminate_client {server} {client_pid}: {reply}")
                return True
        return False

    async def terminate_clients(self, gpu: Gpu, which, timeout: float | None = None) -> list[int]:
        """Evict the clients of this GPU's servers that `which` names (a collection of pids, or a
        predicate on a pid), from one listing; the pids evicted. Neighbours are left alone.
        MpsError if the daemon does not answer."""
        wanted = which if callable(which) else set(which).__contains__
        done = []
        for server, clients in (await self.clients(gpu, timeout)).items():
            for pid in clients:
                if wanted(pid):
                    reply = (await self.command(gpu, f"terminate_client {server} {pid}", timeout)).strip()
                    if reply in ("", "0"):
                        done.append(pid)
                    else:
                        log.warning("MPS: terminate_client %d %d on %s: %s", server, pid, gpu.uuid, reply)
        return done

    # --- continuous watch ---------------------------------------------------------------------
    def watch(self, gpu: Gpu, interval: float, on_change: OnChange, *, failures: int = 3,
              timeout: float = 3.0) -> asyncio.Task:
        """Start a probe every `interval` s (start to start, so a hung daemon is IMPAIRED within
        `failures` intervals plus one `timeout`); call `on_change("IMPAIRED", probe error)` after `failures`
        consecutive failures and `on_change("OK", None)` after one success. A daemon exit is
        reported at once ("MPS control daemon process <pid> exited"). The status starts OK and
        only changes are reported; `on_change` may be a coroutine function. Cancel the task
        (or stop()/close() the manager) to stop watching."""
        task = asyncio.get_running_loop().create_task(
            self._watch(gpu, interval, on_change, failures, timeout), name=f"mps-watch-{gpu.uuid}")
        tasks = self._watchers.setdefault(gpu.uuid, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def _watch(self, gpu: Gpu, interval: float, on_change: OnChange, failures: int,
                     timeout: float) -> None:
        status, fails = OK, 0
        reported_exit: _Daemon | None = None
        probe_now = False

        async def report(new: str, reason: str | None) -> None:
            nonlocal status
            if new == status:
                return
            status = new
            try:
                result = on_change(new, reason)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("MPS: watch callback failed for %s", gpu.uuid)

        next_at = time.monotonic() + interval  # probes start every `interval` s, however long one takes
        while True:
            d = self._daemons.get(gpu.uuid)
            if not probe_now:
                waiters = [asyncio.ensure_future(asyncio.sleep(max(0.0, next_at - time.monotonic()))),
                           asyncio.ensure_future(self._swap(gpu.uuid).wait())]
                # an exit not yet reported; never one on purpose (stopping), which would spin
                watch_exit = d is not None and d is not reported_exit and not d.exited.cancelled() \
                    and not (d.exited.done() and d.stopping)
                try:
                    done, _ = await asyncio.wait(waiters + ([d.exited] if watch_exit else []),
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
                if waiters[1] in done:
                    probe_now = True  # a new daemon: look at it now
                    continue
                if watch_exit and d.exited.done():
                    if d.crashed:
                        reported_exit = d
                        fails = max(fails, failures)
                        await report(IMPAIRED, f"MPS control daemon process {d.pid} exited")
                    continue
            probe_now = False
            next_at = time.monotonic() + interval
            if gpu.uuid in self._restarting:
                continue  # the restart's new daemon wakes this loop through the swap event
            result = await self.probe(gpu, timeout)
            if result.ok:
                fails = 0
                await report(OK, None)
            else:
                fails += 1
                if fails >= failures:
                    await report(IMPAIRED, result.error)


# --- processes -----------------------------------------------------------------------------------
def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Running, and not a zombie (a daemon that died under an init that does not reap)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def _owned(pid: int, pipe_dir: Path, log_dir: Path, binary: str | None) -> bool:
    """Is `pid` this GPU's control daemon or one of its servers? Their environment carries both
    the pipe dir and the log dir (clients get the pipe dir only, so a task is never taken for
    one). Without the right to read it, the process name has to do."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except PermissionError:
        if binary is None:
            return False
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return False
        return comm == Path(binary).name[:15]
    except OSError:
        return False
    return f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() in env \
        and f"CUDA_MPS_LOG_DIRECTORY={log_dir}".encode() in env


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


async def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _remove_stale(pipe_dir: Path) -> None:
    """The socket and pid file of a daemon that is gone (no live daemon may own them)."""
    for name in (SOCKET, PID_FILE):
        try:
            (pipe_dir / name).unlink()
        except FileNotFoundError:
            pass


def _pids(text: str) -> list[int]:
    return [int(line) for line in (line.strip() for line in text.splitlines()) if line.isdigit()]
