"""Provisioners with real processes: the command provisioner runs small operator scripts, and the
local provisioner starts a stand-in for `shoal agent` (a script that records how it was started,
then sleeps) next to real shims running real workloads."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shoal.agent.runtime.shims import attach, launch
from shoal.providers import (
    CommandProvisioner, Host, LaunchRequest, LocalProvisioner, ProvisionerError, from_settings,
)
from shoal.providers.base import HOST_ID
from tests.support import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the provisioners read /proc")

TOKEN = "join-secret-123"
ENV = {"PATH": os.environ.get("PATH", os.defpath)}


def request(count: int = 1) -> LaunchRequest:
    return LaunchRequest(instance_type="p6-b200.48xlarge", count=count, cluster="gpu",
                         capacity_provider="cp-b200", server_url="http://127.0.0.1:9", join_token=TOKEN)




def gone(pid: int) -> bool:
    """No live process has this pid (a zombie counts as gone: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


# --- local provisioner ---------------------------------------------------------------------

STAND_IN_AGENT = """
    import json, os, signal, sys, time
    data_dir = sys.argv[sys.argv.index("--data-dir") + 1]
    if "--ignore-sigterm" in os.environ.get("STAND_IN_MODE", ""):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record = {"argv": sys.argv[1:], "token": os.environ.get("SHOAL_JOIN_TOKEN"), "pid": os.getpid()}
    with open(os.path.join(data_dir, "stand-in.json.tmp"), "w") as f:
        json.dump(record, f)
    os.rename(os.path.join(data_dir, "stand-in.json.tmp"), os.path.join(data_dir, "stand-in.json"))
    print("stand-in agent up", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def root(tmp_path):
    """The provisioner root; every host left in it is terminated afterwards, workloads included."""
    root = tmp_path / "hosts"
    yield root
    cleaner = LocalProvisioner(root, stop_timeout=0)
    for hdir in root.iterdir() if root.is_dir() else ():
        cleaner.terminate(hdir.name)


@pytest.fixture
def local(tmp_path, root):
    return LocalProvisioner(root, agent_command=script(tmp_path, "agent.py", STAND_IN_AGENT))


def started(root: Path, host: Host) -> dict:
    path = root / host.host_id / "stand-in.json"
    wait_for(path.exists, message=f"the stand-in agent of {host.host_id} to start")
    return json.loads(path.read_text())


def test_launch_starts_one_agent_per_host_with_its_own_data_dir_and_the_token_in_env(local, root):
    hosts = local.launch(request(count=2))

    assert [h.state for h in hosts] == ["running", "running"]
    assert len({h.host_id for h in hosts}) == 2
    for host in hosts:
        assert HOST_ID.fullmatch(host.host_id)
        hdir = root / host.host_id
        seen = started(root, host)
        argv = seen["argv"]
        assert argv[argv.index("--host-id") + 1] == host.host_id
        assert argv[argv.index("--data-dir") + 1] == str(hdir)
        assert argv[argv.index("--cluster") + 1] == "gpu"
        assert argv[argv.index("--capacity-provider") + 1] == "cp-b200"
        assert argv[argv.index("--instance-type") + 1] == "p6-b200.48xlarge"
        assert argv[argv.index("--server") + 1] == "http://127.0.0.1:9"
        assert argv[-1] == "--simulate"
        assert seen["token"] == TOKEN
        assert not any(TOKEN in arg for arg in argv)
        assert TOKEN not in Path(f"/proc/{seen['pid']}/cmdline").read_text()
        assert int((hdir / "agent.pid").read_text()) == seen["pid"]
        record = json.loads((hdir / "host.json").read_text())
        assert record["hostId"] == host.host_id and record["capacityProvider"] == "cp-b200"
        wait_for(lambda: "stand-in agent up" in (hdir / "agent.log").read_text(), message="agent.log")
    assert sorted(local.list(), key=lambda h: h.host_id) == sorted(hosts, key=lambda h: h.host_id)


def test_terminate_kills_the_agent_and_every_workload_it_ran(local, root):
    host, = local.launch(request())
    agent_pid = started(root, host)["pid"]
    tasks = root / host.host_id / "tasks"
    shims = [launch(tasks / "task-1" / "app", ["sleep", "600"], env=ENV, cwd=None, stop_timeout=1),
             launch(tasks / "task-2" / "nested" / "sidecar", ["sleep", "600"], env=ENV, cwd=None, stop_timeout=1)]
    workloads = [s.pid() for s in shims]
    assert all(s.workload_alive() for s in shims)

    local.terminate(host.host_id)

    assert gone(agent_pid)
    for shim in shims:
        handle = attach(shim.dir)
        wait_for(lambda: not handle.alive() and not handle.workload_alive(), message="the workload to die")
        assert handle.exit_status() is None  # the machine vanished: nothing recorded a stop
    assert all(wait_for(lambda pid=pid: gone(pid)) for pid in workloads)
    assert local.list() == []
    assert (root / host.host_id / "terminated").exists()
    assert (root / host.host_id / "agent.log").exists()  # logs stay readable
    local.terminate(host.host_id)  # idempotent
    local.terminate("i-0123456789abcdef0")  # unknown: a no-op
    local.terminate("../../etc")  # not a host id at all: a no-op


def test_an_agent_that_ignores_sigterm_is_killed(tmp_path, root, monkeypatch):
    monkeypatch.setenv("STAND_IN_MODE", "--ignore-sigterm")
    local = LocalProvisioner(root, agent_command=script(tmp_path, "agent.py", STAND_IN_AGENT), stop_timeout=0.3)
    host, = local.launch(request())
    pid = started(root, host)["pid"]

    local.terminate(host.host_id)

    assert wait_for(lambda: gone(pid), message="the stubborn agent to die")
    assert local.list() == []


def test_a_new_provisioner_on_the_same_root_finds_the_hosts_and_sees_a_killed_agent_as_stopped(
        tmp_path, local, root):
    first, second = local.launch(request(count=2))
    after_restart = LocalProvisioner(root, agent_command=script(tmp_path, "agent.py", STAND_IN_AGENT))
    assert {h.host_id: h.state for h in after_restart.list()} == {first.host_id: "running",
                                                                   second.host_id: "running"}

    os.kill(started(root, first)["pid"], signal.SIGKILL)
    wait_for(lambda: {h.host_id: h.state for h in after_restart.list()}
             == {first.host_id: "stopped", second.host_id: "running"}, message="the killed host to be stopped")

    after_restart.terminate(second.host_id)
    assert [(h.host_id, h.state) for h in after_restart.list()] == [(first.host_id, "stopped")]


def test_a_pid_reused_by_another_process_is_not_the_agent(local, root):
    host, = local.launch(request())
    agent_pid = started(root, host)["pid"]
    (root / host.host_id / "agent.pid").write_text(str(os.getpid()))  # alive, but not the agent
    try:
        assert local.list() == [Host(host.host_id, "p6-b200.48xlarge", "stopped")]
        local.terminate(host.host_id)  # must not signal this test process
        assert local.list() == []
    finally:
        os.kill(agent_pid, signal.SIGKILL)  # the provisioner rightly lost track of it


def test_an_agent_command_that_cannot_start_fails_the_launch_and_leaves_no_host(tmp_path, root):
    local = LocalProvisioner(root, agent_command=[str(tmp_path / "no-such-agent")])
    with pytest.raises(ProvisionerError, match="no-such-agent"):
        local.launch(request(count=2))
    assert local.list() == []


# --- command provisioner -------------------------------------------------------------------

LAUNCH = """
    import json, pathlib, sys
    payload = json.load(sys.stdin)
    pathlib.Path(sys.argv[1]).write_text(json.dumps({"stdin": payload, "argv": sys.argv[1:]}))
    count = payload["count"] - int(sys.argv[2])
    hosts = [{"hostId": f"i-{n:017x}", "instanceType": payload["instanceType"]} for n in range(1, count + 1)]
    print(json.dumps({"hosts": hosts}))
"""

TERMINATE = """
    import json, sys
    with open(sys.argv[1], "a") as f:
        f.write(json.load(sys.stdin)["hostId"] + "\\n")
"""


@pytest.fixture
def commands(tmp_path):
    """Launch and terminate scripts; launch reports `short` fewer hosts than asked (argv[2])."""
    def make(short: int = 0) -> CommandProvisioner:
        return CommandProvisioner(launch=[*script(tmp_path, "launch.py", LAUNCH), str(tmp_path / "launched.json"),
                                          str(short)],
                                  terminate=[*script(tmp_path, "terminate.py", TERMINATE),
                                             str(tmp_path / "terminated.txt")],
                                  timeout=10)
    return make


def test_command_launch_passes_the_request_on_stdin_and_reads_the_hosts(commands, tmp_path):
    prov = commands()
    hosts = prov.launch(request(count=2))

    assert hosts == [Host("i-00000000000000001", "p6-b200.48xlarge", "running"),
                     Host("i-00000000000000002", "p6-b200.48xlarge", "running")]
    seen = json.loads((tmp_path / "launched.json").read_text())
    assert seen["stdin"] == {"instanceType": "p6-b200.48xlarge", "count": 2, "cluster": "gpu",
                             "capacityProvider": "cp-b200", "serverUrl": "http://127.0.0.1:9", "joinToken": TOKEN}
    assert TOKEN not in " ".join(seen["argv"])

    # Without a list command, list() is what this object launched and has not terminated.
    prov.terminate("i-00000000000000001")
    assert (tmp_path / "terminated.txt").read_text() == "i-00000000000000001\n"
    assert prov.list() == [Host("i-00000000000000002", "p6-b200.48xlarge", "running")]


def test_command_launch_with_the_wrong_count_fails_and_terminates_what_it_reported(commands, tmp_path):
    with pytest.raises(ProvisionerError, match="reported 1 hosts, not the 2 asked for"):
        commands(short=1).launch(request(count=2))
    assert (tmp_path / "terminated.txt").read_text() == "i-00000000000000001\n"


def test_command_list_reads_the_list_command(tmp_path):
    lister = script(tmp_path, "list.py", """
        import json
        print(json.dumps({"hosts": [{"hostId": "i-00000000000000001", "instanceType": "p5en.48xlarge",
                                     "state": "running"},
                                    {"hostId": "i-00000000000000002", "instanceType": "p5en.48xlarge",
                                     "state": "stopped"}]}))
    """)
    prov = CommandProvisioner(launch=["false"], terminate=["false"], list_=lister)
    assert prov.list() == [Host("i-00000000000000001", "p5en.48xlarge", "running"),
                           Host("i-00000000000000002", "p5en.48xlarge", "stopped")]


@pytest.mark.parametrize("body, message", [
    ("print('this is not json')", "output is not JSON"),
    ("print('[]')", "not a JSON object"),
    ("print('{\"machines\": []}')", "without a \"hosts\" list"),
    ("print('{\"hosts\": [{\"hostId\": \"i-1\"}]}')", "without a string 'instanceType'"),
])
def test_command_output_of_the_wrong_shape_is_an_error(tmp_path, body, message):
    prov = CommandProvisioner(launch=script(tmp_path, "launch.py", body), terminate=["true"])
    with pytest.raises(ProvisionerError, match=message) as err:
        prov.launch(request())
    assert "launch.py" in str(err.value)


def test_command_that_fails_is_an_error_with_its_exit_code_and_stderr_tail(tmp_path):
    failing = script(tmp_path, "terminate.py", """
        import sys
        sys.stderr.write("x" * 5000 + "quota exceeded in rack 7")
        sys.exit(3)
    """)
    prov = CommandProvisioner(launch=["true"], terminate=failing)
    with pytest.raises(ProvisionerError) as err:
        prov.terminate("i-00000000000000001")
    message = str(err.value)
    assert "terminate.py" in message and "exited with 3" in message
    assert message.endswith("quota exceeded in rack 7")
    assert 2000 <= message.count("x") + len("quota exceeded in rack 7") <= 2100


def test_command_that_hangs_is_killed_with_everything_it_started(tmp_path):
    hanging = script(tmp_path, "launch.py", f"""
        import subprocess, sys
        child = subprocess.Popen(["sleep", "600"])
        open({str(tmp_path / "child.pid")!r}, "w").write(str(child.pid))
        sys.stderr.write("waiting for the cloud\\n")
        sys.stderr.flush()
        child.wait()
    """)
    prov = CommandProvisioner(launch=hanging, terminate=["true"], timeout=0.5)
    began = time.monotonic()
    with pytest.raises(ProvisionerError, match=r"timed out after 0.5s.*waiting for the cloud"):
        prov.launch(request())
    assert time.monotonic() - began < 5
    child = int((tmp_path / "child.pid").read_text())
    wait_for(lambda: gone(child), message="the command's child to be killed")


def test_command_that_cannot_be_run_is_an_error(tmp_path):
    prov = CommandProvisioner(launch=[str(tmp_path / "missing")], terminate=["true"])
    with pytest.raises(ProvisionerError, match="could not be started"):
        prov.launch(request())


# --- from_settings -------------------------------------------------------------------------

def test_from_settings_chooses_the_provisioner(tmp_path):
    assert isinstance(from_settings("local", tmp_path), LocalProvisioner)
    prov = from_settings("command", tmp_path, launch="/opt/cloud/launch --region 'us east'",
                         terminate=["/opt/cloud/terminate"])
    assert isinstance(prov, CommandProvisioner)
    assert prov.launch_command == ["/opt/cloud/launch", "--region", "us east"]
    assert prov.list_command is None


def test_from_settings_names_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="'ec2'"):
        from_settings("ec2", tmp_path)
    with pytest.raises(ValueError, match="launch and a terminate"):
        from_settings("command", tmp_path)
    with pytest.raises(ValueError, match="needs a terminate command"):
        from_settings("command", tmp_path, launch=["x"])
