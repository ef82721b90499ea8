"""The control daemon of `shoal-fake-mps-control`: its state, its command set and its log lines.

One process, one selector loop (50 ms tick). It listens on `<pipe dir>/control`, writes
`<pipe dir>/nvidia-cuda-mps-control.pid` and `<log dir>/control.log` / `server.log` in the
format of the real daemon (`[YYYY-MM-DD HH:MM:SS.mmm Control <pid>] message`).

Servers are real processes: a forked child per UID, which exits when the daemon goes away
(it blocks reading a pipe whose only writer is the daemon). Clients are real processes too: a
program run under `shoal-fake-mps-control --client -- CMD…` keeps a connection to the daemon
for as long as it lives, and the daemon learns its pid and uid from SO_PEERCRED, as the real
one checks a client's credentials. The wire between the fake's front end and its daemon is the
fake's own (a first line `UI` or `CLIENT`, then one command a line, one JSON reply a line);
what a user sees on stdin/stdout is the real protocol.

Knobs live in `<pipe dir>/shoal-fake-knobs.json` and are re-read on every tick (see
`shoal.agent.mps.fake_control` for their meaning).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import struct
import time
from dataclasses import dataclass, field

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"
KNOB_FILE = "shoal-fake-knobs.json"
TICK = 0.05
VERSION = "13000"
_MEM_VALUE = re.compile(r"^\d+(\.\d+)?[KMGT]B?$", re.IGNORECASE)


def unix_address(path: str) -> tuple[str, int | None]:
    """The address to bind or connect for socket `path`, and an fd to close afterwards. A path
    too long for sun_path (108 bytes) is reached through /proc/self/fd/<dir fd>/<name>."""
    if len(os.fsencode(path)) < 100:
        return path, None
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def connect(pipe_dir: str) -> socket.socket:
    address, fd = unix_address(os.path.join(pipe_dir, SOCKET))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)
    return sock


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _stamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def _set_process_name(name: bytes) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except Exception:  # only cosmetic (ps, /proc/<pid>/comm)
        pass


@dataclass
class Server:
    pid: int
    uid: int
    wfd: int  # the daemon's end of the pipe that keeps the server alive
    thread_pct: float
    mem_limits: dict[str, str]
    clients: set[int] = field(default_factory=set)
    fault_clients: set[int] = field(default_factory=set)
    shutting_down: bool = False


@dataclass
class Conn:
    sock: socket.socket
    kind: str | None = None  # "UI" or "CLIENT" once the first line is in
    buf: bytes = b""
    queued: list[str] = field(default_factory=list)  # lines held back while hung
    pid: int = 0
    uid: int = 0
    pending: bool = False  # a client waiting for another UID's server to go
    terminated: bool = False


class Daemon:
    def __init__(self, pipe_dir: str, log_dir: str):
        self.pipe_dir, self.log_dir = pipe_dir, log_dir
        self.socket_path = os.path.join(pipe_dir, SOCKET)
        self.pid_path = os.path.join(pipe_dir, PID_FILE)
        self.knob_path = os.path.join(pipe_dir, KNOB_FILE)
        devices = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        self.devices = devices or ["0"]
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.conns: dict[int, Conn] = {}
        self.servers: dict[int, Server] = {}
        self.client_conns: dict[int, Conn] = {}  # client pid → its connection
        self.default_pct = 100.0
        self.default_mem: dict[str, str] = {}
        self.knobs: dict = {}
        self.knob_key: tuple | None = None
        self.commands_since_crash_knob = 0
        self.stop_requested = False
        self.pid = os.getpid()
        # Simulated hosts only (see fake_control): the machine is gone once this path exists;
        # with no front-end connection for this many seconds, nobody looks after this daemon.
        self.gone_if = os.environ.get("SHOAL_FAKE_MPS_HOST_GONE") or None
        try:
            self.idle_exit = float(os.environ.get("SHOAL_FAKE_MPS_IDLE_EXIT") or 0) or None
        except ValueError:
            self.idle_exit = None
        self.last_ui = time.monotonic()
        self._control_log = open(os.path.join(log_dir, "control.log"), "a", buffering=1)
        self._server_log = open(os.path.join(log_dir, "server.log"), "a", buffering=1)

    # --- logs ---------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        self._control_log.write(f"[{_stamp()} Control {self.pid}] {message}\n")

    def server_log(self, pid: int, message: str) -> None:
        self._server_log.write(f"[{_stamp()} Server {pid}] {message}\n")

    # --- life cycle ---------------------------------------------------------------------------
    def setup(self) -> None:
        self._open_listener()
        write_atomic(self.pid_path, f"{self.pid}\n")
        self.log(f"Starting control daemon using socket {self.socket_path}")
        self.log(f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}")
        self.log(f"CUDA MPS Control binary version: {VERSION}")
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)

    def _on_sigterm(self, *_):
        self.stop_requested = True

    def run(self) -> None:
        while not self.stop_requested:
            if self._gone():
                break
            self._check_knobs()
            for key, _ in self.sel.select(TICK):
                if key.data is None:
                    self._accept()
                elif key.fileobj.fileno() in self.conns:
                    self._read(key.data)
                if self.stop_requested:
                    break
            self._reap()
        self._shutdown()

    def _gone(self) -> bool:
        """The simulated machine is gone: its pipe dir was removed, its host marks itself gone,
        or nobody has connected for `idle_exit` seconds (unless it refuses connections on purpose).
        The daemon exits cleanly."""
        why = None
        if not os.path.isdir(self.pipe_dir):
            why = "pipe directory removed"
        elif self.gone_if and os.path.exists(self.gone_if):
            why = f"{self.gone_if} exists: the simulated host is gone"
        elif self.idle_exit and not self.knobs.get("refuse") and time.monotonic() - self.last_ui > self.idle_exit:
            why = f"no front-end connection for {self.idle_exit:g} s"
        if why:
            self.log(f"[shoal fake] exiting: {why}")
        return why is not None

    def _open_listener(self) -> None:
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        address, fd = unix_address(self.socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(address)
        finally:
            if fd is not None:
                os.close(fd)
        listener.listen(64)
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, None)
        self.listener = listener

    def _close_listener(self, remove: bool) -> None:
        if self.listener is None:
            return
        self.sel.unregister(self.listener)
        self.listener.close()
        self.listener = None
        if remove:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass

    def _shutdown(self) -> None:
        self.log("Shutting down")
        for server in list(self.servers.values()):
            _kill(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        while self.servers and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.01)
        for server in list(self.servers.values()):
            _kill(server.pid, signal.SIGKILL)
            try:
                os.waitpid(server.pid, 0)
            except ChildProcessError:
                pass
        for conn in list(self.conns.values()):
            conn.sock.close()
        self._close_listener(remove=True)
        try:
            with open(self.pid_path) as f:
                ours = f.read().strip() == str(self.pid)
            if ours:
                os.unlink(self.pid_path)
        except OSError:
            pass
        self.log("Exit")

    def _crash(self) -> None:
        """The crash knob: die at once, leaving the socket and pid file behind as a real crash
        would. The knob is consumed first, so a restarted daemon comes up healthy."""
        knobs = dict(self.knobs)
        knobs.pop("crash", None)
        write_atomic(self.knob_path, json.dumps(knobs))
        self.log("[shoal fake] crash knob: exiting now")
        os._exit(1)

    # --- knobs --------------------------------------------------------------------------------
    def _check_knobs(self) -> None:
        try:
            st = os.stat(self.knob_path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            key = None
        if key == self.knob_key:
            return
        knobs: dict = {}
        if key is not None:
            try:
                with open(self.knob_path) as f:
                    knobs = json.load(f)
            except (OSError, ValueError):
                return  # half-written by hand: read it at the next tick
            if not isinstance(knobs, dict):
                knobs = {}
        self.knob_key = key
        old, self.knobs = self.knobs, knobs
        if knobs.get("crash") != old.get("crash"):
            self.commands_since_crash_knob = 0
        if _crash_after(knobs) == 0:
            self._crash()
        if knobs.get("fault") and not old.get("fault"):
            self._enter_fault()
        if knobs.get("refuse") and self.listener is not None:
            self._close_listener(remove=knobs["refuse"] != "close")
            self.log("[shoal fake] refuse knob: not accepting connections")
        elif not knobs.get("refuse") and self.listener is None:
            self._open_listener()
        if old.get("hang") and not knobs.get("hang"):
            for conn in list(self.conns.values()):
                lines, conn.queued = conn.queued, []
                for line in lines:
                    self._line(conn, line)

    def _enter_fault(self) -> None:
        for server in self.servers.values():
            server.fault_clients = set(server.clients)
            self.server_log(server.pid, "Volta MPS: Server is handling a fatal GPU error.")
            self.server_log(server.pid, "The following devices")
            for device in self.devices:
                self.server_log(server.pid, device)
            self.server_log(server.pid, "The following clients have a sticky error set:")
            for pid in sorted(server.clients):
                self.server_log(server.pid, str(pid))

    def status(self, server: Server) -> str:
        if self.knobs.get("fault") or server.fault_clients & server.clients:
            return "FAULT"
        return "ACTIVE"

    # --- connections --------------------------------------------------------------------------
    def _accept(self) -> None:
        while self.listener is not None:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self.last_ui = time.monotonic()  # hung or not, someone uses this daemon
            conn = Conn(sock)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self.log("Accepting connection...")

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.buf += data
        while b"\n" in conn.buf and conn.sock.fileno() in self.conns:
            raw, conn.buf = conn.buf.split(b"\n", 1)
            line = raw.decode(errors="replace").strip()
            if self.knobs.get("hang"):
                conn.queued.append(line)  # accepted, read, never answered
            else:
                self._line(conn, line)

    def _close(self, conn: Conn) -> None:
        self.conns.pop(conn.sock.fileno(), None)
        self.sel.unregister(conn.sock)
        conn.sock.close()
        if conn.kind == "UI":
            self.log("UI closed")
        elif conn.kind == "CLIENT" and self.client_conns.get(conn.pid) is conn:
            del self.client_conns[conn.pid]
            for server in self.servers.values():
                if conn.pid in server.clients:
                    server.clients.discard(conn.pid)
                    self.server_log(server.pid, f"Client {conn.pid} disconnected")
                    if server.shutting_down and not server.clients:
                        _kill(server.pid, signal.SIGTERM)

    def _send(self, conn: Conn, reply: dict) -> None:
        try:
            conn.sock.setblocking(True)
            conn.sock.sendall(json.dumps(reply).encode() + b"\n")
            conn.sock.setblocking(False)
        except OSError:
            pass

    def _line(self, conn: Conn, line: str) -> None:
        if conn.sock.fileno() not in self.conns:
            return
        if conn.kind is None:
            conn.kind = "CLIENT" if line == "CLIENT" else "UI"
            if conn.kind == "UI":
                self.log("NEW UI")
            else:
                self._client_hello(conn)
            return
        if conn.kind != "UI" or not line:
            return
        self.log(f"Cmd:{line}")
        out = self.command(line)
        self._send(conn, {"out": out})
        self.commands_since_crash_knob += 1
        after = _crash_after(self.knobs)
        if after is not None and self.commands_since_crash_knob >= after:
            self._crash()

    def _client_hello(self, conn: Conn) -> None:
        creds = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        conn.pid, conn.uid, _ = struct.unpack("3i", creds)
        self._admit(conn)

    def _admit(self, conn: Conn) -> None:
        server = next((s for s in self.servers.values() if s.uid == conn.uid), None)
        note = "Server already exists"
        if server is None:
            if self.servers:  # only one UID's server at a time: wait for the other to go
                conn.pending = True
                self.log(f"NEW CLIENT {conn.pid} from user {conn.uid}: Server is not ready, push client to pending list")
                return
            server, note = self._spawn_server(conn.uid), "Server is not ready, starting a new one"
        conn.pending = False
        if self.status(server) == "FAULT" or server.shutting_down:
            self.log(f"NEW CLIENT {conn.pid} from user {conn.uid}: Server {server.pid} is not ready (FAULT)")
            self._send(conn, {"ok": False, "error": "CUDA_ERROR_MPS_SERVER_NOT_READY"})
            self._close(conn)
            return
        self.log(f"NEW CLIENT {conn.pid} from user {conn.uid}: {note}")
        server.clients.add(conn.pid)
        self.client_conns[conn.pid] = conn
        self.server_log(server.pid, f"New client {conn.pid} connected")
        self._send(conn, {"ok": True, "server": server.pid})

    # --- servers ------------------------------------------------------------------------------
    def _spawn_server(self, uid: int) -> Server:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the server: lives until the daemon is gone or it is signalled
            try:
                signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # a clean shutdown: status 0
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.closerange(3, r)
                os.closerange(r + 1, 1 << 16)
                _set_process_name(b"mps-server-fake")
                while os.read(r, 1):
                    pass
            finally:
                os._exit(0)
        os.close(r)
        self.log(f"Starting new server {pid} for user {uid}")
        server = Server(pid, uid, w, self.default_pct, dict(self.default_mem))
        self.servers[pid] = server
        self.log(f"NEW SERVER {pid}: Ready")
        self.server_log(pid, "Startup")
        self.server_log(pid, f"Connecting to control daemon on socket: {self.socket_path}")
        if self.knobs.get("fault"):
            self._enter_fault()
        return server

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            server = self.servers.pop(pid, None)
            if server is None:
                continue
            os.close(server.wfd)
            code = os.waitstatus_to_exitcode(status)
            self.log(f"Server {pid} exited with status {code if code >= 0 else 1}")
            for client in server.clients:
                self.client_conns.pop(client, None)
            for conn in list(self.conns.values()):
                if conn.pending and not self.stop_requested:
                    self._admit(conn)

    def _server(self, text: str) -> Server | None:
        return self.servers.get(int(text)) if text.isdigit() else None

    # --- commands -----------------------------------------------------------------------------
    def command(self, line: str) -> str:
        name, *args = line.split()
        handler = getattr(self, f"cmd_{name}", None)
        if handler is None:
            return f"Unrecognized command: {name}"
        try:
            return handler(*args)
        except TypeError:
            return f"Invalid arguments for command {name}"

    def cmd_get_server_list(self) -> str:
        return "\n".join(str(pid) for pid in sorted(self.servers))

    def cmd_get_server_status(self, pid: str) -> str:
        server = self._server(pid)
        return self.status(server) if server else f"Server {pid} not found"

    def cmd_start_server(self, flag: str, uid: str) -> str:
        if flag != "-uid" or not uid.isdigit():
            return "Usage: start_server -uid <user id>"
        if any(s.uid == int(uid) for s in self.servers.values()):
            return ""
        if self.servers:
            return f"An MPS server for another user is running; user {uid} must wait"
        self._spawn_server(int(uid))
        return ""

    def cmd_shutdown_server(self, pid: str, force: str = "") -> str:
        server = self._server(pid)
        if server is None:
            return f"Server {pid} not found"
        server.shutting_down = True
        if force == "-f" or not server.clients:
            _kill(server.pid, signal.SIGTERM)
        return ""

    def cmd_get_client_list(self, pid: str) -> str:
        server = self._server(pid)
        if server is None:
            return f"Server {pid} not found"
        return "\n".join(str(c) for c in sorted(server.clients))

    def cmd_get_device_client_list(self, pid: str | None = None) -> str:
        servers = list(self.servers.values()) if pid is None else [self._server(pid)]
        if None in servers:
            return f"Server {pid} not found"
        clients = sorted(c for s in servers for c in s.clients)
        return "\n".join(f"{device}" + "".join(f"\n    {c}" for c in clients) for device in self.devices)

    def cmd_terminate_client(self, server_pid: str, client_pid: str) -> str:
        server = self._server(server_pid)
        if server is None:
            return f"Server {server_pid} not found"
        if not client_pid.isdigit() or int(client_pid) not in server.clients:
            return f"Client {client_pid} not found on server {server_pid}"
        pid = int(client_pid)
        server.clients.discard(pid)
        conn = self.client_conns.pop(pid, None)
        if conn is not None:
            conn.terminated = True
        self.server_log(server.pid, f"Client {pid} terminated (sticky error CUDA_ERROR_MPS_CLIENT_TERMINATED)")
        return "0"

    def cmd_set_default_active_thread_percentage(self, pct: str) -> str:
        value = _percentage(pct)
        if value is None:
            return f"Invalid percentage: {pct}"
        self.default_pct = value
        return f"{value:.1f}"

    def cmd_get_default_active_thread_percentage(self) -> str:
        return f"{self.default_pct:.1f}"

    def cmd_set_active_thread_percentage(self, pid: str, pct: str) -> str:
        server, value = self._server(pid), _percentage(pct)
        if server is None or value is None:
            return f"Server {pid} not found" if server is None else f"Invalid percentage: {pct}"
        server.thread_pct = value
        return f"{value:.1f}"

    def cmd_get_active_thread_percentage(self, pid: str) -> str:
        server = self._server(pid)
        return f"{server.thread_pct:.1f}" if server else f"Server {pid} not found"

    def cmd_set_default_device_pinned_mem_limit(self, device: str, value: str) -> str:
        if not _MEM_VALUE.match(value):
            return f"Invalid memory limit: {value}"
        self.default_mem[device] = value.upper()
        return ""

    def cmd_get_default_device_pinned_mem_limit(self, device: str) -> str:
        return self.default_mem.get(device, "0")

    def cmd_set_device_pinned_mem_limit(self, pid: str, device: str, value: str) -> str:
        server = self._server(pid)
        if server is None:
            return f"Server {pid} not found"
        if not _MEM_VALUE.match(value):
            return f"Invalid memory limit: {value}"
        server.mem_limits[device] = value.upper()
        return ""

    def cmd_get_device_pinned_mem_limit(self, pid: str, device: str) -> str:
        server = self._server(pid)
        return server.mem_limits.get(device, "0") if server else f"Server {pid} not found"

    def cmd_ps(self, *args: str) -> str:
        rows = ["PID ID SERVER DEVICE NAMESPACE COMMAND"]
        n = 0
        for server in sorted(self.servers.values(), key=lambda s: s.pid):
            for pid, server_col in [(server.pid, "-")] + [(c, str(server.pid)) for c in sorted(server.clients)]:
                n += 1
                if args[:1] == ("-p",) and args[1:2] != (str(pid),):
                    continue
                rows.append(f"{pid} {n} {server_col} {self.devices[0][:12]} {_namespace(pid)} {_comm(pid)}")
        return "\n".join(rows)

    def cmd_quit(self, *args: str) -> str:
        self.stop_requested = True
        return ""


def _crash_after(knobs: dict) -> int | None:
    crash = knobs.get("crash")
    if crash is None or crash is False:
        return None
    if crash is True:
        return 0
    try:
        return max(0, int(crash))
    except (TypeError, ValueError):
        return 0


def _percentage(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value <= 100 else None


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        return "-"


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "-"
