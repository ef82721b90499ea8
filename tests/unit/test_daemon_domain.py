"""The pure rules of managed daemons: defaults that UpdateDaemon never carries over, the deployment
configuration, the rollout arithmetic, the deployment state machine the reconciler drives, and
daemon task definitions."""

from __future__ import annotations

import re

import pytest

from shoal.domain import daemons
from shoal.domain.errors import InvalidParameter

AGENT = {"name": "agent", "image": "busybox", "memory": 64}


def test_settings_take_their_defaults_whatever_came_before():
    assert daemons.settings({}) == {"propagateTags": "NONE", "enableECSManagedTags": False,
                                    "enableExecuteCommand": False, "critical": True}
    given = {"propagateTags": "DAEMON", "enableECSManagedTags": True, "enableExecuteCommand": True, "critical": False}
    assert daemons.settings(given) == given


def test_deployment_configuration_defaults_and_bounds():
    assert daemons.deployment_configuration(None) == {
        "drainPercent": 25.0, "alarms": {"alarmNames": [], "enable": False}, "bakeTimeInMinutes": 0}
    assert daemons.deployment_configuration({"drainPercent": 0, "bakeTimeInMinutes": 1440})["drainPercent"] == 0.0
    alarms = daemons.deployment_configuration({"alarms": {"alarmNames": ["a", "b"], "enable": True}})["alarms"]
    assert alarms == {"alarmNames": ["a", "b"], "enable": True}
    for given, field in (({"drainPercent": 100.5}, "drainPercent"), ({"drainPercent": True}, "drainPercent"),
                         ({"bakeTimeInMinutes": -1}, "bakeTimeInMinutes"),
                         ({"bakeTimeInMinutes": 1441}, "bakeTimeInMinutes"),
                         ({"alarms": {"enable": True}}, "alarms.alarmNames"),
                         ({"alarms": {"alarmNames": ["a", "a"]}}, "alarms.alarmNames"),
                         ({"alarms": {"alarmNames": [""]}}, "alarms.alarmNames[0]")):
        with pytest.raises(InvalidParameter, match=re.escape(f"'deploymentConfiguration.{field}'")):
            daemons.deployment_configuration(given)


@pytest.mark.parametrize("percent,hosts,batch", [(25, 8, 2), (25, 3, 1), (50, 3, 2), (0, 5, 1), (100, 5, 5),
                                                 (30, 10, 3), (25, 0, 0), (0.5, 1000, 5)])
def test_a_batch_is_drain_percent_of_the_hosts_rounded_up_and_at_least_one(percent, hosts, batch):
    assert daemons.batch_size(percent, hosts) == batch


def test_breaker_threshold_is_half_the_hosts_between_3_and_200():
    assert [daemons.breaker_threshold(n) for n in (0, 1, 6, 7, 10, 1000)] == [3, 3, 3, 4, 5, 200]


def test_client_token_and_name():
    daemons.check_client_token("a" * 36)
    daemons.check_client_token(None)
    for bad in ("a" * 37, "with space", "é"):
        with pytest.raises(InvalidParameter, match="'clientToken'"):
            daemons.check_client_token(bad)
    assert daemons.check_name("d" * 248) == "d" * 248
    with pytest.raises(InvalidParameter, match="'daemonName'"):
        daemons.check_name("d" * 249)
    assert daemons.group("logs") == "daemon:logs"


def _deployment(**extra) -> dict:
    config = daemons.deployment_configuration({"alarms": {"alarmNames": ["a"], "enable": True}})
    target = daemons.revision_detail("rev-2", [{"arn": "cp", "runningInstanceCount": 1,
                                                "withoutDaemonInstanceCount": 2, "drainingInstanceCount": 3}])
    return {**daemons.deployment_doc(arn="dep", cluster_arn="c", target=target, sources=[], config=config, hosts=8,
                                     now=10.0), **extra}


def test_a_new_deployment_is_pending_and_watches_its_breaker_and_alarms():
    doc = _deployment()
    assert doc["status"] == "PENDING" and doc["createdAt"] == 10.0 and "startedAt" not in doc
    assert doc["circuitBreaker"] == {"failureCount": 0, "status": "MONITORING", "threshold": 4}
    assert doc["alarms"] == {"status": "MONITORING", "alarmNames": ["a"], "triggeredAlarmNames": []}
    assert doc["targetDaemonRevision"]["totalDrainingInstanceCount"] == 3
    removal = daemons.deployment_doc(arn="dep", cluster_arn="c", target=None, sources=[{"arn": "rev-1"}],
                                     config=daemons.deployment_configuration(None), hosts=0, now=1.0)
    assert "targetDaemonRevision" not in removal and removal["alarms"]["status"] == "DISABLED"


def test_a_deployment_moves_through_its_states_with_their_timestamps():
    pending = _deployment()
    running = daemons.transition(pending, "IN_PROGRESS", 11.0)
    assert running["startedAt"] == 11.0 and pending["status"] == "PENDING", "the input is left alone"
    done = daemons.transition(running, "SUCCESSFUL", 12.0, "all hosts updated")
    assert (done["status"], done["statusReason"], done["finishedAt"]) == ("SUCCESSFUL", "all hosts updated", 12.0)
    assert "stoppedAt" not in done
    assert done["circuitBreaker"]["status"] == done["alarms"]["status"] == "MONITORING_COMPLETE"

    tripped = daemons.transition({**running, "alarms": {**running["alarms"], "status": "TRIGGERED"}},
                                 "STOP_REQUESTED", 13.0, "alarm a")
    rolling = daemons.transition(tripped, "ROLLBACK_IN_PROGRESS", 14.0)
    failed = daemons.transition(rolling, "ROLLBACK_FAILED", 15.0)
    assert failed["stoppedAt"] == 15.0 and failed["startedAt"] == 11.0
    assert failed["alarms"]["status"] == "TRIGGERED" and failed["circuitBreaker"]["status"] == "MONITORING_COMPLETE"
    assert daemons.transition(rolling, "ROLLBACK_SUCCESSFUL", 15.0)["finishedAt"] == 15.0
    # Any deployment that has not ended can be superseded.
    for doc in (pending, running, tripped, rolling):
        assert daemons.transition(doc, "STOPPED", 20.0)["stoppedAt"] == 20.0


@pytest.mark.parametrize("current,target", [("PENDING", "SUCCESSFUL"), ("PENDING", "PENDING"),
                                            ("IN_PROGRESS", "IN_PROGRESS"), ("IN_PROGRESS", "ROLLBACK_IN_PROGRESS"),
                                            ("SUCCESSFUL", "IN_PROGRESS"), ("STOPPED", "STOPPED"),
                                            ("ROLLBACK_FAILED", "ROLLBACK_SUCCESSFUL"), ("PENDING", "BOGUS")])
def test_moves_the_state_machine_does_not_have_are_refused(current, target):
    assert not daemons.can_transition(current, target)
    with pytest.raises(ValueError, match=f"{current} -> {target}"):
        daemons.transition(_deployment(status=current), target, 1.0)


def test_a_daemon_task_definition_follows_the_task_definition_rules_and_its_own():
    doc = daemons.validate_task_definition({
        "family": "logs", "cpu": "1 vCPU", "memory": "1 GB", "pidMode": "shared", "taskRoleArn": "role",
        "volumes": [{"name": "v", "host": {"sourcePath": "/var/log"}}],
        "containerDefinitions": [{**AGENT, "mountPoints": [{"sourceVolume": "v", "containerPath": "/logs"}]}]})
    assert (doc["cpu"], doc["memory"], doc["pidMode"], doc["taskRoleArn"], doc["status"]) == \
        ("1024", "1024", "shared", "role", "ACTIVE")
    assert doc["containerDefinitions"][0]["essential"] is True and "ipcMode" not in doc
    cases = [
        ({"containerDefinitions": [{**AGENT, "essential": False}]}, "at least one container must be essential"),
        ({"family": "bad family"}, "'family'"),
        ({"containerDefinitions": [{"name": "a", "image": "x"}]}, "memoryReservation"),
        ({"containerDefinitions": [{**AGENT, "dependsOn": [{"containerName": "x", "condition": "START"}]}]},
         r"containerDefinitions\[0\]\.dependsOn\[0\]\.containerName"),
        ({"containerDefinitions": [{**AGENT, "mountPoints": [{"sourceVolume": "w"}]}]},
         r"containerDefinitions\[0\]\.mountPoints\[0\]\.sourceVolume"),
        ({"volumes": [{"name": "v", "host": {"sourcePath": "var"}}]}, r"volumes\[0\]\.host\.sourcePath"),
        ({"volumes": [{"name": "v"}]}, r"volumes\[0\]\.host\.sourcePath"),
        ({"volumes": [{"host": {"sourcePath": "/a"}}]}, r"volumes\[0\]\.name"),
    ]
    for change, message in cases:
        with pytest.raises(InvalidParameter, match=message):
            daemons.validate_task_definition({"family": "logs", "containerDefinitions": [AGENT], **change})
    # A log driver's volume needs no host path.
    daemons.validate_task_definition({"family": "logs", "containerDefinitions": [AGENT], "volumes": [
        {"name": "v", "logDriverVolumeConfiguration": {"driver": "awslogs"}}]})


def test_a_revision_records_the_images_and_settings():
    td = {"daemonTaskDefinitionArn": "td:1", "containerDefinitions": [AGENT, {**AGENT, "name": "b", "image": "x"}]}
    doc = daemons.revision_doc(arn="rev", cluster_arn="c", daemon_arn="d", task_definition=td,
                               settings_=daemons.settings({"critical": False}), now=5.0)
    assert doc["containerImages"] == [{"containerName": "agent", "image": "busybox"},
                                      {"containerName": "b", "image": "x"}]
    assert (doc["daemonTaskDefinitionArn"], doc["critical"], doc["createdAt"]) == ("td:1", False, 5.0)
