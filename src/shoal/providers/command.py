"""Hosts from anywhere, through executables the operator supplies (a cloud CLI wrapper, a call
to a bare-metal inventory, ...). Each call runs one command, writes one JSON object to its
stdin and, where it answers, reads one JSON object from its stdout:

    launch     in  {"instanceType", "count", "cluster", "capacityProvider", "serverUrl", "joinToken"}
               out {"hosts": [{"hostId", "instanceType"}, ...]}             exactly `count` of them
    terminate  in  {"hostId"}                                               exit 0 is success
    list       out {"hosts": [{"hostId", "instanceType", "state"}, ...]}    state: running | stopped

The join token travels on stdin, never on the command line. The launch command must start an
agent on each host with that server URL and token, reporting the host id as its instance id.
The terminate command should treat an unknown host id as already gone (terminate is idempotent).

Without a list command, list() answers from memory: the hosts this object launched and has not
terminated, all "running". That memory does not survive a restart of the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

from shoal.providers.base import Host, LaunchRequest, ProvisionerError

STDERR_TAIL = 2000
KILL_GRACE = 5.0  # seconds to collect stderr once a timed-out command is killed
STATES = ("running", "stopped")


class CommandProvisioner:
    name = "command"

    def __init__(self, launch: list[str], terminate: list[str], list_: list[str] | None = None,
                 timeout: float = 120):
        self.launch_command = list(launch)
        self.terminate_command = list(terminate)
        self.list_command = list(list_) if list_ else None
        self.timeout = timeout
        self._launched: dict[str, Host] = {}  # for list() without a list command
        self._lock = threading.Lock()

    def launch(self, request: LaunchRequest) -> list[Host]:
        """Run the launch command. If it reports the wrong number of hosts, the ones it did report
        are terminated again before ProvisionerError is raised: a launch is all or nothing."""
        if request.count < 1:
            raise ValueError(f"count must be at least 1, not {request.count}")
        payload = {"instanceType": request.instance_type, "count": request.count, "cluster": request.cluster,
                   "capacityProvider": request.capacity_provider, "serverUrl": request.server_url,
                   "joinToken": request.join_token}
        answer = self._run(self.launch_command, payload)
        hosts = [Host(entry["hostId"], entry["instanceType"], "running")
                 for entry in _hosts(answer, self.launch_command, ("hostId", "instanceType"))]
        if len(hosts) != request.count:
            undone = self._undo(hosts)
            raise ProvisionerError(f"launch command {self.launch_command!r} reported {len(hosts)} hosts, "
                                   f"not the {request.count} asked for; {undone}")
        with self._lock:
            self._launched.update((host.host_id, host) for host in hosts)
        return hosts

    def terminate(self, host_id: str) -> None:
        self._run(self.terminate_command, {"hostId": host_id}, expect_output=False)
        with self._lock:
            self._launched.pop(host_id, None)

    def list(self) -> list[Host]:
        if self.list_command is None:
            with self._lock:
                return list(self._launched.values())
        answer = self._run(self.list_command, None)
        hosts = _hosts(answer, self.list_command, ("hostId", "instanceType", "state"))
        for entry in hosts:
            if entry["state"] not in STATES:
                raise ProvisionerError(f"list command {self.list_command!r} reported host "
                                       f"{entry['hostId']!r} in state {entry['state']!r}, "
                                       f"not one of {', '.join(STATES)}")
        return [Host(entry["hostId"], entry["instanceType"], entry["state"]) for entry in hosts]

    def _undo(self, hosts: list[Host]) -> str:
        """Terminate hosts of a failed launch; say what became of them, for the error message."""
        if not hosts:
            return "none were launched"
        failed = []
        for host in hosts:
            try:
                self.terminate(host.host_id)
            except ProvisionerError as exc:
                failed.append(f"{host.host_id} ({exc})")
        if failed:
            return "could not terminate the reported hosts: " + "; ".join(failed)
        return "the reported hosts were terminated"

    def _run(self, argv: list[str], payload: dict | None, expect_output: bool = True) -> dict | None:
        """Run `argv` with `payload` as JSON on stdin and return its stdout parsed as a JSON object.

        The command runs in a session of its own, so that a timeout kills everything it started."""
        stdin = json.dumps(payload).encode() if payload is not None else b""
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise ProvisionerError(f"command {argv!r} could not be started: {exc}") from exc
        try:
            out, err = proc.communicate(stdin, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            try:
                _, err = proc.communicate(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired as exc:  # something left the session and holds the pipe
                err = exc.stderr or b""
                proc.wait()
            raise ProvisionerError(f"command {argv!r} timed out after {self.timeout:g}s and was killed"
                                   f"{_tail(err)}") from None
        if proc.returncode != 0:
            raise ProvisionerError(f"command {argv!r} exited with {proc.returncode}{_tail(err)}")
        if not expect_output:
            return None
        try:
            answer = json.loads(out)
        except ValueError as exc:
            raise ProvisionerError(f"command {argv!r} exited with 0 but its output is not JSON ({exc}): "
                                   f"{out[:200]!r}{_tail(err)}") from None
        if not isinstance(answer, dict):
            raise ProvisionerError(f"command {argv!r} printed {type(answer).__name__}, not a JSON object"
                                   f"{_tail(err)}")
        return answer


def _hosts(answer: dict, argv: list[str], fields: tuple[str, ...]) -> list[dict]:
    """The "hosts" list of a command's answer, each entry checked for the string fields it needs."""
    hosts = answer.get("hosts")
    if not isinstance(hosts, list):
        raise ProvisionerError(f"command {argv!r} answered without a \"hosts\" list: "
                               f"{json.dumps(answer)[:200]}")
    for i, entry in enumerate(hosts):
        for name in fields:
            if not isinstance(entry, dict) or not isinstance(entry.get(name), str) or not entry[name]:
                raise ProvisionerError(f"command {argv!r} answered hosts[{i}] without a string {name!r}: "
                                       f"{json.dumps(entry)[:200]}")
    return hosts


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(stderr: bytes) -> str:
    text = stderr.decode(errors="replace").strip()[-STDERR_TAIL:]
    return f"; stderr: {text}" if text else "; stderr was empty"
