"""The optional "podman" runtime: a container's `image` is honoured by running it with Podman.

The shim (`shoal.agent.runtime.shim`) stays the owner of every container. Only its workload
changes: instead of the container's entryPoint + command, the shim runs `podman run` in the
foreground, wrapped in a small supervisor (this module run as a script, see "Stopping" below).
Logs, the exit code and the stop path therefore work as in the process runtime::

    argv = podman.run_argv(name=..., image=..., ..., stop_timeout=t, env_file=cdir / "podman.env")
    shims.launch(cdir, argv, podman.host_env(), None, podman.shim_stop_timeout(t))
    ...
    # after the shim has recorded the exit (always harmless; needed if the shim was SIGKILLed):
    podman.remove(name)

What `run_argv` puts on the command line, and why:

- `--rm --replace --name NAME`: the container is removed when it ends; a stale container of the
  same name (left by a crash) is replaced, so a relaunch never fails on the name. NAME is
  `container_name(name)`: valid for podman (see there).
- `--pull=never`: images must already be in local storage (`podman load`, `podman import`,
  `podman pull` by an operator); a task never waits on, or fails on, a registry.
- `--network=host`: the process runtime runs workloads on the host network, so the ports a task
  definition declares are host ports and placement's port accounting means the same for both
  runtimes. It also needs no netavark/CNI state, bridge or iptables rules.
- `--log-driver=passthrough` (podman >= 4; `none` before): the container's stdout and stderr are
  the very file descriptors podman run got from the shim (its stdout.log / stderr.log), so output
  is written straight to those files, kept separate, never copied through conmon, not stored a
  second time under /var/lib/containers, and goes on even if `podman run` itself dies.
- `--env-file FILE` when `env_file` is given (the file is written here, mode 0600): variable
  values (secrets included) stay off the command line, which every local user can read in
  /proc/PID/cmdline. Variables an env file cannot carry unchanged in every podman version (see
  `_env_file_ok`: line breaks, leading or trailing blanks, leading quotes, unusual names) still
  go as `--env K=V`. Without `env_file`, every variable goes as `--env K=V`.
  `--http-proxy=false`: the container gets exactly the given environment, not the host's proxy
  variables (podman's default copies them in).
- `--memory NNNm`, `--memory-reservation NNNm`, `--cpu-shares N` (ECS cpu units are cpu shares;
  the kernel's minimum is 2, so 0 and 1 become 2, as the ECS agent does), `--workdir`,
  `--entrypoint '["a", "b"]'` (JSON, so arguments with spaces survive; an empty or missing
  entry point keeps the image's), then the image and the command.
- `--stop-timeout T`: what `podman stop` uses if someone stops the container by hand.
- `--label io.shoal.managed=true`: lets an operator find the containers shoal started
  (`podman ps -a --filter label=io.shoal.managed=true`).
- GPUs (`gpu_env`, e.g. {"NVIDIA_VISIBLE_DEVICES": "GPU-uuid,...", ...}): the variables are added
  to the container's environment; where a CDI specification for `nvidia.com/gpu` exists (made by
  `nvidia-ctk cdi generate` into /etc/cdi or /var/run/cdi), each device in `gpu_devices` (CDI
  names: host indices such as "0", the default naming) or, without it, in NVIDIA_VISIBLE_DEVICES
  is also passed as `--device nvidia.com/gpu=ID`. Without CDI, the variables alone select GPUs
  only where the NVIDIA container toolkit's OCI hook is installed. (Not tested: the development
  machines have no GPU, and the toolkit is not packaged in Debian.)
- An MPS client (its environment has `CUDA_MPS_PIPE_DIRECTORY`): `--volume P:P` of that pipe dir,
  so the container reaches its GPU's control daemon, and `--ipc=host` for MPS's shared memory.
  (Not tested on a GPU either.)

Host adaptations, found on Debian 12 machines that run as root without CAP_SYS_RESOURCE and with a
hybrid cgroup v1/v2 layout (see docs in /work/shared/reference/python-stack.md §7.4):

- `--ulimit nofile=H:H --ulimit nproc=N:N` when this process lacks CAP_SYS_RESOURCE: podman's
  defaults (nofile 1048576, a large nproc) are above the hard limits there and the OCI runtime
  fails with "setrlimit ...: operation not permitted". H is our hard RLIMIT_NOFILE; N is our hard
  RLIMIT_NPROC, at most 32768, because podman lowers its own NPROC hard limit to 32768 at start
  and cannot raise it again.
- `--runtime runc` (a global flag) when the host uses cgroup v1 (legacy or hybrid layout) and
  runc is installed: crun refuses to run in hybrid mode when the v2 hierarchy has any controller
  ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"). On a pure v2 host
  podman's default runtime is kept.

Stopping. Two facts rule out signalling `podman run` directly: a SIGKILL to `podman run` does
not reach the container (conmon keeps it running), and a SIGTERM that reaches `podman run` before
its signal proxy is set up (which can be after the container has started and printed) makes it
exit at once and leave the container behind (seen here in about 1 stop in 5 that came right after
the container's first output). So the supervisor runs `podman run --sig-proxy=false` in a process
group of its own, where the shim's signals cannot reach it, and on the shim's SIGTERM it stops
the container itself, as docker and ECS do: the container's stop signal (SIGTERM unless the image
says otherwise) with `podman kill`, retried until the container runs, then SIGKILL after
`stop_timeout` seconds, retried each second until `podman run` returns. The exit code is the
container's (143 or 137 when the stop signal or the SIGKILL ended it). PID 1 of a container
ignores SIGTERM unless it handles it, so a bare `sleep 600` ends only by the SIGKILL.

The shim's own SIGKILL (at the stop timeout it was launched with) must come later: launch the
shim with `shim_stop_timeout(t)`, a few seconds more than the container's `t`
(`PodmanRuntime` does the reverse: see there). `podman run` gets SIGKILL when the supervisor
dies, and a supervisor that sees `podman run` end during a stop, or die by a signal,
force-removes what is left of the container. Only a SIGKILL to the supervisor itself can leave a
container running: call `remove(name)` once the shim is over.

The supervisor runs as `python -I .../podman.py supervise NAME STOP_TIMEOUT -- PODMAN_ARGV...`,
so it needs nothing but the standard library: this module must not import shoal at top level.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

MANAGED_LABEL = "io.shoal.managed=true"
# How much longer than the container's stop timeout the shim waits before its own SIGKILL.
SHIM_STOP_GRACE = 5.0
# podman lowers its own RLIMIT_NPROC hard limit to this at start (seen in /proc/PID/limits).
PODMAN_NPROC_CAP = 32768
_CAP_SYS_RESOURCE = 24
_NAME_OK = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_NAME_MAX = 128
# What podman itself needs from the environment, passed on from the agent's where set.
_HOST_ENV_KEYS = ("HOME", "TMPDIR", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "CONTAINERS_CONF",
                  "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "REGISTRIES_CONFIG_PATH")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INFO_TIMEOUT = 60.0


# --- host probing ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def podman_path() -> str | None:
    """The absolute path of the podman binary, or None if it is not on PATH."""
    return shutil.which("podman", path=os.environ.get("PATH") or _DEFAULT_PATH)


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether podman is installed and `podman info` works (checked once per process)."""
    exe = podman_path()
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, *global_flags(), "info", "--format",
                               "{{.Host.OCIRuntime.Name}}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=host_env(), timeout=_INFO_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.lru_cache(maxsize=None)
def version() -> tuple[int, ...] | None:
    """podman's version as a tuple of ints, e.g. (4, 3, 1); None if it cannot be told."""
    exe = podman_path()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, env=host_env(), timeout=_INFO_TIMEOUT).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def _cgroup2_only() -> bool:
    """Whether /sys/fs/cgroup is a pure cgroup v2 mount (no v1 hierarchies in use)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                fields = pre.split()
                if len(fields) > 4 and fields[4] == "/sys/fs/cgroup":
                    return post.split()[0] == "cgroup2"
    except OSError:
        pass
    return False


@functools.lru_cache(maxsize=None)
def global_flags() -> tuple[str, ...]:
    """podman's global flags on this host: `--runtime runc` on cgroup v1/hybrid hosts with runc."""
    if sys.platform.startswith("linux") and not _cgroup2_only():
        runc = shutil.which("runc", path=os.environ.get("PATH") or _DEFAULT_PATH)
        if runc:
            return ("--runtime", runc)
    return ()


def _has_cap(bit: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return True  # cannot tell: keep podman's defaults


@functools.lru_cache(maxsize=None)
def ulimit_flags() -> tuple[str, ...]:
    """Explicit `--ulimit` flags where podman's defaults would exceed what may be set here."""
    if _has_cap(_CAP_SYS_RESOURCE):
        return ()
    flags: list[str] = []
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    if nofile != resource.RLIM_INFINITY:
        flags += ["--ulimit", f"nofile={nofile}:{nofile}"]
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = PODMAN_NPROC_CAP if nproc == resource.RLIM_INFINITY else min(nproc, PODMAN_NPROC_CAP)
    flags += ["--ulimit", f"nproc={nproc}:{nproc}"]
    return tuple(flags)


@functools.lru_cache(maxsize=None)
def _log_driver() -> str:
    v = version()
    return "passthrough" if v is not None and v >= (4,) else "none"


def _cdi_has_nvidia_gpu() -> bool:
    for d in ("/etc/cdi", "/var/run/cdi"):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if not n.endswith((".json", ".yaml", ".yml")):
                continue
            try:
                if "nvidia.com/gpu" in Path(d, n).read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def host_env() -> dict[str, str]:
    """The environment for podman itself (the shim's workload env): PATH and podman's settings.

    The container's own environment travels separately, in run_argv's --env / --env-file."""
    env = {"PATH": os.environ.get("PATH") or _DEFAULT_PATH}
    for key in _HOST_ENV_KEYS:
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def shim_stop_timeout(stop_timeout: float) -> float:
    """The stop timeout to launch the shim with: the container's plus SHIM_STOP_GRACE, so the
    supervisor's `podman kill` comes first and the shim's SIGKILL is only a backstop."""
    return float(stop_timeout) + SHIM_STOP_GRACE


# --- names and the command line -------------------------------------------------------------------

def container_name(name: str) -> str:
    """A valid podman container name ([a-z0-9][a-z0-9_.-]*) for `name`.

    A name that is already valid (lowercase) is kept. Any other is lowercased, has invalid
    characters replaced by '-', and gets '-' plus 10 hex digits of the original name's SHA-256,
    so names that differ only in case or in invalid characters still get different names."""
    if _NAME_OK.fullmatch(name) and len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    base = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).lstrip("_.-")
    base = base[:_NAME_MAX - 11].rstrip("_.-") or "shoal"
    return f"{base}-{digest}"


def _env_file_ok(key: str, value: str) -> bool:
    """Whether K=V reads back unchanged from an env file in every podman version.

    podman 4 reads one K=V per line, skips '#' lines and trims the key; podman 5 also trims
    blanks around the value and unquotes values in quotes (which may then span lines). So a
    value with a line break, leading or trailing whitespace, or a leading quote goes on the
    command line instead, as does any key that is not a plain name."""
    return (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", key) is not None
            and "\n" not in value and "\r" not in value and value == value.strip()
            and not value.startswith(("'", '"', "`")))


def _write_env_file(path: Path, env: dict[str, str]) -> None:
    data = "".join(f"{k}={v}\n" for k, v in env.items()).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _gpu_flags(gpu_env: dict[str, str], devices: list[str] | None) -> list[str]:
    if devices is None:
        visible = (gpu_env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
        devices = [] if visible in ("", "void", "none") else [d.strip() for d in visible.split(",")]
    devices = [d for d in devices if d]
    if not devices or not _cdi_has_nvidia_gpu():
        return []
    return [f"--device=nvidia.com/gpu={d}" for d in devices]


def podman_run_argv(*, name: str, image: str, entry_point: list[str] | None,
                    command: list[str] | None, env: dict[str, str], workdir: str | None,
                    memory_mib: int | None, memory_reservation_mib: int | None,
                    cpu_units: int | None, stop_timeout: float,
                    gpu_env: dict[str, str] | None = None,
                    env_file: Path | str | None = None,
                    gpu_devices: list[str] | None = None) -> list[str]:
    """The bare `podman run ...` command line (no supervisor); see the module docstring.

    With `env_file`, the container's environment is written there (mode 0600) first."""
    if not image:
        raise ValueError("image is required")
    exe = podman_path() or "podman"
    cname = container_name(name)
    timeout = max(0, int(-(-float(stop_timeout) // 1)))  # whole seconds, rounded up
    argv = [exe, *global_flags(), "run", "--rm", "--replace", "--name", cname,
            "--pull=never", "--network=host", f"--log-driver={_log_driver()}",
            "--http-proxy=false", "--sig-proxy=false", f"--stop-timeout={timeout}",
            "--label", MANAGED_LABEL, *ulimit_flags()]

    full_env = {**env, **(gpu_env or {})}
    for k in full_env:
        if not k or "=" in k or "\0" in k:
            raise ValueError(f"invalid environment variable name: {k!r}")
    if env_file is not None:
        in_file = {k: v for k, v in full_env.items() if _env_file_ok(k, v)}
        _write_env_file(Path(env_file), in_file)
        argv += ["--env-file", str(env_file)]
        argv += [f"--env={k}={v}" for k, v in full_env.items() if k not in in_file]
    else:
        argv += [f"--env={k}={v}" for k, v in full_env.items()]

    if memory_mib is not None:
        argv.append(f"--memory={int(memory_mib)}m")
    if memory_reservation_mib is not None:
        argv.append(f"--memory-reservation={int(memory_reservation_mib)}m")
    if cpu_units is not None:
        argv.append(f"--cpu-shares={max(2, int(cpu_units))}")
    if workdir:
        argv.append(f"--workdir={workdir}")
    pipe = full_env.get("CUDA_MPS_PIPE_DIRECTORY")
    if pipe:  # an MPS client: its GPU's control pipe dir, and the host's IPC for MPS shared memory
        argv += [f"--volume={pipe}:{pipe}", "--ipc=host"]
    if gpu_env or gpu_devices:
        argv += _gpu_flags(gpu_env or {}, gpu_devices)
    if entry_point:
        argv.append("--entrypoint=" + json.dumps(list(entry_point)))
    argv.append(image)
    argv += list(command or [])
    return argv


def run_argv(*, name: str, image: str, entry_point: list[str] | None, command: list[str] | None,
             env: dict[str, str], workdir: str | None, memory_mib: int | None,
             memory_reservation_mib: int | None, cpu_units: int | None, stop_timeout: float,
             gpu_env: dict[str, str] | None = None, env_file: Path | str | None = None,
             gpu_devices: list[str] | None = None) -> list[str]:
    """The shim workload's argv for one container: the supervisor around `podman run ...`.

    Pass it to `shims.launch` with `host_env()` as env and `shim_stop_timeout(stop_timeout)`."""
    inner = podman_run_argv(name=name, image=image, entry_point=entry_point, command=command,
                            env=env, workdir=workdir, memory_mib=memory_mib,
                            memory_reservation_mib=memory_reservation_mib, cpu_units=cpu_units,
                            stop_timeout=stop_timeout, gpu_env=gpu_env, env_file=env_file,
                            gpu_devices=gpu_devices)
    return [sys.executable, "-I", str(Path(__file__).resolve()), "supervise", container_name(name),
            repr(float(stop_timeout)), "--", *inner]


def remove(name: str) -> None:
    """Force-remove the container (SIGKILL if it still runs), best effort; never raises.

    For after the shim is over: a no-op when `podman run --rm` already removed it."""
    exe = podman_path()
    if exe is None:
        return
    try:
        subprocess.run([exe, *global_flags(), "rm", "--force", "--ignore", "--time=0",
                        container_name(name)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=host_env(), timeout=_INFO_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        pass


# --- the agent's runtime -------------------------------------------------------------------------

class PodmanRuntime:
    """The agent's "podman" runtime (`shoal agent --runtime podman`): the counterpart of
    `shoal.agent.runtime.process.ProcessRuntime`, with the same methods.

    `prepare` returns the shim's (argv, env, cwd, cgroup): the supervised `podman run` argv, the
    environment podman itself needs, no cwd and no agent cgroup (podman enforces the limits in the
    container's own cgroup). The container's environment travels in `<container dir>/podman.env`.

    The task runner launches the shim with the task definition's stopTimeout T, so the supervisor
    sends its SIGKILL `KILL_MARGIN` seconds before T: it comes before the shim's own SIGKILL to
    `podman run`, which would leave the container running (see "Stopping" above). A runner that
    launches the shim with `shim_stop_timeout(T)` instead can set `kill_margin=0`."""

    name = "podman"
    KILL_MARGIN = 0.5
    DEFAULT_STOP_TIMEOUT = 30.0

    def __init__(self, *, gpu_index: dict[str, int], mps_env=None,
                 kill_margin: float = KILL_MARGIN):
        self.gpu_index, self.mps_env, self.kill_margin = gpu_index, mps_env, kill_margin

    def enforced(self) -> dict[str, bool]:
        """Which limits this host really enforces: podman sets memory and cpu in the container's
        cgroup wherever it runs containers at all."""
        ok = available()
        return {"memory": ok, "cpu": ok}

    @staticmethod
    def container_name(runner, c) -> str:
        return container_name(f"shoal-{runner.arn.rsplit('/', 1)[-1]}-{c.name}")

    def env(self, runner, c) -> dict[str, str]:
        """The container's environment. Unlike the process runtime, nothing of the agent's own
        environment (PATH, HOME, ...) is passed: the image brings its own."""
        env = {e["name"]: str(e.get("value", "")) for e in c.definition.get("environment", [])}
        env.update(ECS_CONTAINER_NAME=c.name, SHOAL_TASK_ARN=runner.arn, SHOAL_CONTAINER_ARN=c.arn)
        env.update(self.gpu_env(c))
        return env

    def gpu_env(self, c) -> dict[str, str]:
        """The container's GPUs by UUID (NVIDIA_VISIBLE_DEVICES, read by the NVIDIA hook), or for
        an MPS share the MPS client environment (shoal.agent.runtime.gpus). No
        CUDA_VISIBLE_DEVICES: the container sees only its own GPUs, numbered from 0, so the host's
        indices would be wrong there. (Imported here: this module also runs as a bare script, the
        supervisor, which must not need the package.)"""
        from shoal.agent.runtime import gpus

        return gpus.gpu_env(c, None, self.mps_env)

    def gpu_devices(self, c) -> list[str] | None:
        """CDI device names (host indices) of the container's GPUs."""
        if not c.gpu_ids:
            return None
        return [str(self.gpu_index.get(u, u)) for u in c.gpu_ids]

    def argv(self, c) -> list[str]:
        """What the container runs inside the image (for messages; the image decides the rest)."""
        return [*(c.definition.get("entryPoint") or []), *(c.definition.get("command") or [])]

    def cgroup(self, runner, c):
        return None

    def exec_argv(self, runner, c, argv: list[str]) -> list[str]:
        """`argv` run inside the container (e.g. a health check probe)."""
        return [podman_path() or "podman", *global_flags(), "exec", self.container_name(runner, c),
                *argv]

    def health_probe(self, runner, c, spec):
        """(spec, env, cwd) of the container's health probes: run inside it with `podman exec`."""
        probe = dataclasses.replace(spec, command=["CMD", *self.exec_argv(runner, c, spec.argv())])
        return probe, host_env(), None

    def shim_stop_timeout(self, stop_timeout: float) -> float:
        return float(stop_timeout) + (SHIM_STOP_GRACE if self.kill_margin == 0 else 0.0)

    def prepare(self, runner, c):
        """(argv, env, cwd, cgroup) for the container's shim."""
        d = c.definition
        image = d.get("image")
        if not image:
            raise ValueError(f"container {c.name} has no image")
        cdir = Path(runner.dir) / c.name
        cdir.mkdir(parents=True, exist_ok=True)
        stop_timeout = float(d.get("stopTimeout") or self.DEFAULT_STOP_TIMEOUT)
        memory, reservation, cpu = d.get("memory"), d.get("memoryReservation"), d.get("cpu")
        argv = run_argv(
            name=self.container_name(runner, c), image=image, entry_point=d.get("entryPoint"),
            command=d.get("command"), env=self.env(runner, c), workdir=d.get("workingDirectory"),
            memory_mib=int(memory) if memory is not None else None,
            memory_reservation_mib=int(reservation) if reservation is not None else None,
            cpu_units=int(cpu) if cpu else None,
            stop_timeout=max(0.0, stop_timeout - self.kill_margin),
            env_file=cdir / "podman.env", gpu_devices=self.gpu_devices(c))
        return argv, host_env(), None, None

    def cleanup(self, runner, c) -> None:
        """After the container's shim is over: make sure no container is left (best effort)."""
        remove(self.container_name(runner, c))


# --- the supervisor -------------------------------------------------------------------------------

def _supervise(name: str, stop_timeout: float, argv: list[str]) -> int:
    """Run `podman run` (argv) and stop its container when SIGTERM or SIGINT arrives: the
    container's stop signal (`podman kill`, retried until the container runs), then SIGKILL after
    `stop_timeout` seconds (retried each second until `podman run` returns).

    `podman run` runs in a process group of its own, so the shim's signals to our group never
    reach it: a SIGTERM that reached it before its signal proxy was set up would make it exit at
    once and leave the container behind. It gets SIGKILL if the supervisor dies (PDEATHSIG).
    Returns podman run's exit code: the container's (128+N if podman run itself died by signal N,
    or what is said below if the container was left behind)."""
    stop_at: list[float] = []

    def on_stop(signum, frame):
        if not stop_at:
            stop_at.append(time.monotonic() + stop_timeout)

    # Handlers, not SIG_IGN: handled signals return to their defaults in podman on exec.
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, lambda s, f: None)
    prefix = argv[:argv.index("run")] if "run" in argv else argv[:1]
    try:
        proc = subprocess.Popen(argv, process_group=0, preexec_fn=_die_with_parent)
    except OSError as e:
        print(f"shoal podman supervisor: cannot run {argv[0]}: {e}", file=sys.stderr, flush=True)
        return 127 if isinstance(e, FileNotFoundError) else 126
    stop_signal: str | None = None
    term_sent = False
    next_try = 0.0
    while True:
        try:
            rc = proc.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if not stop_at or now < next_try:
            continue
        if now >= stop_at[0]:
            next_try = now + 1.0
            _quiet([*prefix, "kill", "--signal", "KILL", name])
        elif not term_sent:
            next_try = now + 0.1
            if stop_signal is None:
                stop_signal = _quiet([*prefix, "container", "inspect", "--format",
                                      "{{.Config.StopSignal}}", name]) or None
            # `podman kill` fails until the container runs: retried until it is delivered.
            sent = _quiet([*prefix, "kill", "--signal", stop_signal or "TERM", name])
            term_sent = sent is not None
    if rc < 0 or stop_at:
        # podman run died by a signal, or it returned during a stop (it may have been told to
        # stop before it started the container): whatever is left of the container goes now.
        state = _quiet([*prefix, "container", "inspect", "--format",
                        "{{.State.Status}} {{.State.ExitCode}}", name])
        if state is not None:
            _quiet([*prefix, "rm", "--force", "--ignore", "--time=0", name])
            status, _, code = state.partition(" ")
            if status in ("exited", "stopped") and code.lstrip("-").isdigit():
                rc = int(code)  # it ran and ended: its own exit code
            elif status in ("configured", "created", "initialized"):
                rc = 128 + signal.SIGTERM  # stopped before it ran: as a process SIGTERMed at once
            else:
                rc = 128 + signal.SIGKILL  # it ran on without podman run: just SIGKILLed by rm
    return 128 - rc if rc < 0 else rc


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the supervisor dies (Linux; best effort)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _quiet(argv: list[str]) -> str | None:
    """Run a podman command with a timeout; its stdout if it succeeded, else None."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if len(args) < 5 or args[0] != "supervise" or args[3] != "--":
        print("usage: podman.py supervise NAME STOP_TIMEOUT -- PODMAN_ARGV...", file=sys.stderr)
        return 2
    return _supervise(args[1], float(args[2]), args[4:])


if __name__ == "__main__":
    sys.exit(main())
