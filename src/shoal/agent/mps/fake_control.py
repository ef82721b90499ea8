"""`shoal-fake-mps-control`: a stand-in for `nvidia-cuda-mps-control` on hosts without GPUs.

It speaks the same command protocol, so the agent runs one code path against both binaries.

Invocation (as the real binary):

    shoal-fake-mps-control -d     start the control daemon in the background; returns once it
                                  listens (exit 1, with the reason on stderr, if it cannot)
    shoal-fake-mps-control -f     the same, in the foreground
    shoal-fake-mps-control        front end: one command a line on stdin, replies on stdout,
                                  e.g. `echo get_server_list | shoal-fake-mps-control`. Exit 0
                                  when the daemon answered; 1 with "Cannot find MPS control
                                  daemon process" on stderr when nothing listens.
    shoal-fake-mps-control -v     version

The daemon uses `$CUDA_MPS_PIPE_DIRECTORY` (default /tmp/nvidia-mps) for its socket `control`
and its pid file `nvidia-cuda-mps-control.pid`, and `$CUDA_MPS_LOG_DIRECTORY` (default
/var/log/nvidia-mps) for `control.log` and `server.log`, in the real daemon's line format.
Its `CUDA_VISIBLE_DEVICES` names its devices (as in `get_device_client_list`).

Commands: get_server_list, get_server_status <pid> (ACTIVE | FAULT), start_server -uid <uid>,
shutdown_server <pid> [-f], get_client_list <pid>, get_device_client_list [<pid>] (a device
per line, its client pids indented below it), terminate_client <server pid> <client pid>
(prints 0), set/get_default_active_thread_percentage, set/get_active_thread_percentage <pid>,
set/get_default_device_pinned_mem_limit <dev> [<value>], set/get_device_pinned_mem_limit <pid>
<dev> [<value>], ps [-p <pid>], quit [-t <s>]. An unknown command prints an error on stdout
and the front end still exits 0, as the real one does.

Simulated CUDA programs (not in the real binary): `shoal-fake-mps-control --client -- CMD…`
connects to the daemon as an MPS client would at CUDA initialisation and then execs CMD, which
holds the connection for as long as it lives: it appears in get_client_list until it exits or
is terminated. The first client of a UID starts that UID's server (a real process); a client
of another UID waits while a server runs; while the server is in FAULT a new client fails
with CUDA_ERROR_MPS_SERVER_NOT_READY (exit 1). With no daemon, CMD runs without MPS, as a
CUDA program would.

Knobs, for tests and chaos (not in the real binary): a JSON object in
`<pipe dir>/shoal-fake-knobs.json`, which the daemon re-reads every 50 ms, so tests change it
while the daemon runs. Write it with `set_knobs()` or
`shoal-fake-mps-control --knob NAME=VALUE… | --clear-knobs` (VALUE is JSON, else a string):

    crash: N      exit(1) after answering N more commands; 0 or true: at once. The socket and
                  pid file stay behind, as after a real crash. One-shot: the daemon removes the
                  knob before it exits, so a restarted daemon is healthy.
    hang: true    accept connections and read commands, but never answer (until cleared; then
                  what was held back is answered).
    refuse: true  stop listening and remove the socket ("remove", the default), or "close":
                  keep the socket file but refuse connections. Cleared: listens again.
    fault: true   every server goes to FAULT, with the clients attached at that moment as the
                  affected ones; new clients are refused. A server reads FAULT while the knob
                  is set or any affected client is still attached (exit or terminate_client
                  releases it), then ACTIVE again, as a Volta+ server recovers.

hang, refuse and fault are levels: they outlast a restart of the daemon until cleared.

Simulated machines (not in the real binary): the daemon exits, as if its machine had vanished,
when its pipe dir is removed, when the path in `$SHOAL_FAKE_MPS_HOST_GONE` exists (the agent of a
simulated host passes its data dir's `terminated`, which the local provisioner writes when it
terminates the host), or after `$SHOAL_FAKE_MPS_IDLE_EXIT` seconds without a connection
(the agent probes every few seconds; an agent that is gone for good leaves no daemon behind).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from shoal.agent.mps.fake_daemon import KNOB_FILE, PID_FILE, SOCKET, VERSION, Daemon, connect, write_atomic

DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
NAME = "shoal-fake-mps-control"
USAGE = f"""usage: {NAME} [-d | -f | -v]
       {NAME} --client -- CMD [ARG…]
       {NAME} --knob NAME=VALUE [--knob …] | --clear-knobs
"""


def binary_path() -> str:
    """Where the fake is installed: on PATH, or next to this Python (a virtual environment)."""
    return shutil.which(NAME) or str(Path(sys.executable).parent / NAME)


def read_knobs(pipe_dir: str | os.PathLike) -> dict:
    try:
        return json.loads((Path(pipe_dir) / KNOB_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def set_knobs(pipe_dir: str | os.PathLike, clear: bool = False, **knobs) -> dict:
    """Update the knobs of the daemon of `pipe_dir` (a value of None removes that knob; `clear`
    starts from none). Written atomically; the daemon acts on it within 50 ms."""
    current = {} if clear else read_knobs(pipe_dir)
    for name, value in knobs.items():
        if value is None:
            current.pop(name, None)
        else:
            current[name] = value
    Path(pipe_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(str(Path(pipe_dir) / KNOB_FILE), json.dumps(current))
    return current


def _readline(sock) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _front_end(pipe_dir: str) -> int:
    try:
        sock = connect(pipe_dir)
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with sock:
        sock.sendall(b"UI\n")
        for line in sys.stdin:
            command = line.strip()
            if not command:
                continue
            sock.sendall(command.encode() + b"\n")
            reply = _readline(sock)
            if not reply:
                if command.split()[0] == "quit":
                    return 0
                print("Connection to MPS control daemon lost", file=sys.stderr)
                return 1
            out = json.loads(reply)["out"]
            if out:
                sys.stdout.write(out + "\n")
                sys.stdout.flush()
    return 0


def _client(pipe_dir: str, argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.stderr.write(USAGE)
        return 2
    try:
        sock = connect(pipe_dir)
    except OSError:
        print(f"{NAME}: no MPS control daemon in {pipe_dir}; running without MPS", file=sys.stderr)
        os.execvp(argv[0], argv)
    sock.sendall(b"CLIENT\n")
    reply = _readline(sock)
    answer = json.loads(reply) if reply else {"ok": False, "error": "CUDA_ERROR_MPS_CONNECTION_FAILED"}
    if not answer["ok"]:
        print(f"CUDA error: {answer['error']}", file=sys.stderr)
        return 1
    os.set_inheritable(sock.fileno(), True)  # the program holds the connection until it exits
    os.environ["SHOAL_FAKE_MPS_SERVER_PID"] = str(answer["server"])
    os.execvp(argv[0], argv)
    return 127  # not reached


def _already_running(pipe_dir: str) -> int | None:
    try:
        pid = int(Path(pipe_dir, PID_FILE).read_text().split()[0])
        os.kill(pid, 0)
        connect(pipe_dir).close()
        return pid
    except (OSError, ValueError, IndexError):
        return None


def _daemon(pipe_dir: str, log_dir: str, foreground: bool) -> int:
    for d in (pipe_dir, log_dir):
        os.makedirs(d, exist_ok=True)
    running = _already_running(pipe_dir)
    if running is not None:
        print(f"An instance of this daemon is already running (pid {running}) with "
              f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}", file=sys.stderr)
        return 1
    ready_w = None
    if not foreground:
        ready_r, ready_w = os.pipe()
        child = os.fork()
        if child > 0:  # the caller: wait until the daemon listens, or says why it cannot
            os.close(ready_w)
            message = b""
            while chunk := os.read(ready_r, 4096):
                message += chunk
            os.waitpid(child, 0)
            if message == b"ok":
                return 0
            sys.stderr.write(message.decode(errors="replace") or "control daemon failed to start\n")
            return 1
        os.close(ready_r)
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    try:
        daemon = Daemon(pipe_dir, log_dir)
        daemon.setup()
    except Exception as e:  # noqa: BLE001 - reported to the caller, whatever it is
        if ready_w is not None:
            os.write(ready_w, f"control daemon failed to start: {e}\n".encode())
            os._exit(1)
        raise
    if ready_w is not None:
        os.write(ready_w, b"ok")
        os.close(ready_w)
    daemon.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR
    log_dir = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR
    if not args:
        return _front_end(pipe_dir)
    if args[0] in ("-d", "-f"):
        return _daemon(pipe_dir, log_dir, foreground=args[0] == "-f")
    if args[0] == "-v":
        print(f"{NAME} (fake nvidia-cuda-mps-control, protocol v2), version {VERSION}")
        return 0
    if args[0] == "--client":
        return _client(pipe_dir, args[1:])
    if args[0] in ("--knob", "--clear-knobs"):
        knobs, clear, rest = {}, False, list(args)
        while rest:
            flag = rest.pop(0)
            if flag == "--clear-knobs":
                clear = True
            elif flag == "--knob" and rest and "=" in rest[0]:
                name, _, value = rest.pop(0).partition("=")
                try:
                    knobs[name] = json.loads(value)
                except ValueError:
                    knobs[name] = value
            else:
                sys.stderr.write(USAGE)
                return 2
        print(json.dumps(set_knobs(pipe_dir, clear=clear, **knobs)))
        return 0
    sys.stderr.write(USAGE)
    return 2


__all__ = ["DEFAULT_LOG_DIR", "DEFAULT_PIPE_DIR", "KNOB_FILE", "PID_FILE", "SOCKET", "binary_path", "main",
           "read_knobs", "set_knobs"]

if __name__ == "__main__":
    sys.exit(main())
