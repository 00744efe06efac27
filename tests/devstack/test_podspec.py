"""Pod JSON -> processes, and container states -> pod status: the kubelet's pure parts."""

from datetime import UTC, datetime
from typing import Any

import pytest

from devstack.podspec import (
    NO_VALUE_SOURCES,
    PodConfigError,
    ValueSources,
    container_env,
    expand,
    pod_ip,
    process_spec,
    termination_grace_seconds,
)
from devstack.podstatus import container_status, pod_phase, pod_status
from devstack.probes import ExecAction, HttpGetAction
from devstack.processes import (
    ContainerPhase,
    ContainerSnapshot,
    RestartPolicy,
    Termination,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def pod(container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "app-1", "namespace": "prod", "uid": "0123456789abcdef"},
        "spec": {"nodeName": "local", "containers": [{"name": "main", **container}], **spec},
    }


def test_variables_expand_like_kubernetes() -> None:
    env = {"POD": "app-1"}
    assert expand("--id=$(POD)", env) == "--id=app-1"
    assert expand("$(UNDEFINED) stays", env) == "$(UNDEFINED) stays"
    assert expand("$$(POD) is escaped", env) == "$(POD) is escaped"


def test_env_values_see_only_the_variables_before_them() -> None:
    env = container_env(
        pod({}),
        {
            "name": "main",
            "env": [
                {"name": "LATER", "value": "$(FIRST)-$(SECOND)"},
                {"name": "FIRST", "value": "1"},
                {"name": "SECOND", "value": "$(FIRST)+1"},
            ],
        },
        "local",
        NO_VALUE_SOURCES,
    )
    assert env == {"LATER": "$(FIRST)-$(SECOND)", "FIRST": "1", "SECOND": "1+1"}


def test_command_and_args_expand_from_the_env() -> None:
    spec = process_spec(
        pod(
            {
                "command": ["smoothscale", "worker"],
                "args": ["--instance", "$(POD_NAME)"],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
            },
            restartPolicy="OnFailure",
            terminationGracePeriodSeconds=7,
        ),
        "local",
        base_env={"PATH": "/bin"},
    )
    container = spec.containers[0]
    assert container.argv == ("smoothscale", "worker", "--instance", "app-1")
    assert container.env["POD_NAME"] == "app-1"
    assert spec.restart_policy is RestartPolicy.ON_FAILURE
    assert spec.termination_grace_seconds == 7
    assert spec.key == "prod_app-1_01234567"


def test_secret_values_come_from_the_lookup_and_missing_ones_hold_the_pod() -> None:
    sources = ValueSources(
        config_map=lambda namespace, name, key: None,
        secret=lambda namespace, name, key: (
            "s3cret" if (namespace, name) == ("prod", "kafka") else None
        ),
    )
    reference = {"secretKeyRef": {"name": "kafka", "key": "password"}}
    container = {"name": "main", "env": [{"name": "PASSWORD", "valueFrom": reference}]}
    assert container_env(pod({}), container, "local", sources) == {"PASSWORD": "s3cret"}

    missing = {"configMapKeyRef": {"name": "absent", "key": "k"}}
    with pytest.raises(PodConfigError, match="ConfigMap prod/absent"):
        container_env(
            pod({}),
            {"name": "main", "env": [{"name": "X", "valueFrom": missing}]},
            "local",
            sources,
        )
    optional = {"configMapKeyRef": {"name": "absent", "key": "k", "optional": True}}
    assert (
        container_env(
            pod({}),
            {"name": "main", "env": [{"name": "X", "valueFrom": optional}]},
            "local",
            sources,
        )
        == {}
    )


@pytest.mark.parametrize(
    ("container", "complaint"),
    [
        ({"image": "app:1"}, "runs no images"),
        ({"command": ["x"], "envFrom": [{"configMapRef": {"name": "c"}}]}, "envFrom"),
        (
            {"command": ["x"], "env": [{"name": "C", "valueFrom": {"resourceFieldRef": {}}}]},
            "resourceFieldRef",
        ),
        (
            {
                "command": ["x"],
                "env": [{"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}],
            },
            "status.phase",
        ),
        ({"command": ["x"], "readinessProbe": {"tcpSocket": {"port": 80}}}, "tcpSocket"),
        ({"command": ["x"], "readinessProbe": {"httpGet": {"port": "web"}}}, "port 'web'"),
    ],
)
def test_what_the_kubelet_cannot_run_is_named(container: dict[str, Any], complaint: str) -> None:
    with pytest.raises(PodConfigError, match=complaint):
        process_spec(pod(container), "local")


def test_probes_keep_kubernetes_defaults_and_resolve_named_ports() -> None:
    probed = pod(
        {
            "command": ["x"],
            "ports": [{"name": "metrics", "containerPort": 9100}],
            "readinessProbe": {"httpGet": {"port": "metrics", "path": "/ready"}},
            "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 3},
        }
    )
    spec = process_spec(probed, "local")
    readiness = spec.containers[0].readiness_probe
    liveness = spec.containers[0].liveness_probe
    assert readiness is not None
    assert liveness is not None
    assert readiness.action == HttpGetAction(port=9100, path="/ready", host=pod_ip(probed))
    assert (readiness.period_seconds, readiness.failure_threshold, readiness.timeout_seconds) == (
        10,
        3,
        1,
    )
    assert liveness.action == ExecAction(("true",))
    assert liveness.period_seconds == 3


def test_the_grace_period_of_a_delete_wins_over_the_pods() -> None:
    deleted = pod({"command": ["x"]}, terminationGracePeriodSeconds=60)
    assert termination_grace_seconds(deleted) == 60
    deleted["metadata"]["deletionGracePeriodSeconds"] = 2
    assert termination_grace_seconds(deleted) == 2
    assert termination_grace_seconds(pod({"command": ["x"]})) == 30


def snapshot(
    phase: ContainerPhase, *, final: bool = False, exit_code: int = 0
) -> ContainerSnapshot:
    termination = Termination(exit_code, "Completed" if exit_code == 0 else "Error", T0, T0)
    return ContainerSnapshot(
        "main",
        phase,
        started_at=T0 if phase is ContainerPhase.RUNNING else None,
        termination=termination if phase is ContainerPhase.TERMINATED else None,
        final=final,
    )


def test_pod_phase_follows_its_containers() -> None:
    waiting, running = snapshot(ContainerPhase.WAITING), snapshot(ContainerPhase.RUNNING)
    restarting = snapshot(ContainerPhase.TERMINATED, exit_code=1)
    done = snapshot(ContainerPhase.TERMINATED, final=True)
    failed = snapshot(ContainerPhase.TERMINATED, final=True, exit_code=1)
    assert pod_phase([waiting, running]) == "Pending"
    assert pod_phase([running, restarting]) == "Running"
    assert pod_phase([done, running]) == "Running"
    assert pod_phase([done, done]) == "Succeeded"
    assert pod_phase([done, failed]) == "Failed"


def test_a_container_waiting_to_restart_shows_crash_loop_back_off() -> None:
    status = container_status(
        {"name": "main", "image": "app:1"}, snapshot(ContainerPhase.TERMINATED, exit_code=2)
    )
    assert status["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert status["lastState"]["terminated"]["exitCode"] == 2
    assert status["ready"] is False


def test_ready_condition_keeps_its_transition_time_until_it_flips() -> None:
    ready = container_status(
        {"name": "main"},
        ContainerSnapshot("main", ContainerPhase.RUNNING, started_at=T0, ready=True),
    )
    first = pod_status(pod({}), [ready], "Running", start_time=T0, now=T0)
    later = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    same = pod_status({**pod({}), "status": first}, [ready], "Running", start_time=T0, now=later)
    assert same["conditions"] == first["conditions"]
    not_ready = {**ready, "ready": False}
    flipped = pod_status(
        {**pod({}), "status": first}, [not_ready], "Running", start_time=T0, now=later
    )
    ready_condition = next(c for c in flipped["conditions"] if c["type"] == "Ready")
    assert ready_condition["status"] == "False"
    assert ready_condition["lastTransitionTime"] == "2026-01-01T00:05:00Z"
