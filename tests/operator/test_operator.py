"""`smoothscale operator` against the local control plane: topics, pods, status and Events.

The operator runs as a process, as the chart runs it; StreamingApps are applied with the real
kubectl. These scenarios stop before Spark matters (the scaling itself, with real worker
pods, is the demo's test: tests/devstack/demo/test_demo.py).
"""

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from e2e.kube import Kubectl, kubectl_binary

from devstack.stack import StackInfo
from smoothscale.kafka import names

T = TypeVar("T")
pytestmark = pytest.mark.cluster


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.3)


@pytest.fixture
def namespace(local_cluster: StackInfo) -> Iterator[str]:
    name = f"op-{uuid.uuid4().hex[:8]}"
    kubectl = Kubectl(kubectl_binary(), local_cluster.kubeconfig)
    kubectl.ok("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")


@pytest.fixture
def operator(local_cluster: StackInfo, namespace: str, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "operator.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "smoothscale.cli",
                "operator",
                "--namespace",
                namespace,
                "--standalone",
                "--metrics-port",
                "0",
            ],
            env={**os.environ, "KUBECONFIG": str(local_cluster.kubeconfig)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield log
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "Traceback" not in text, text


def app_manifest(namespace: str, name: str, bootstrap: str, **spec: Any) -> str:
    app = {
        "apiVersion": "smoothscale.io/v1alpha1",
        "kind": "StreamingApp",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "image": "ghcr.io/smoothscale/smoothscale:0.1.0",
            "pipeline": {"ref": "examples.pipelines.running_count:pipeline"},
            "kafka": {
                "bootstrapServers": bootstrap,
                "inputTopics": [f"{name}-in"],
                "outputTopic": f"{name}-out",
                "stateStores": [{"name": "counts"}],
            },
            "scaling": {"lagPollInterval": "500ms", "probingInterval": "2s"},
            **spec,
        },
    }
    return yaml.safe_dump(app)


def input_and_output(local_cluster: StackInfo, name: str) -> AdminClient:
    """Create the app's input and output topics (2 partitions each); an admin client."""
    admin = AdminClient({"bootstrap.servers": local_cluster.kafka_bootstrap})
    for topic in (f"{name}-in", f"{name}-out"):
        admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    return admin


def status_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    app = kubectl.json("get", "-n", namespace, "streamingapp", name)
    status: dict[str, Any] = app.get("status") or {}
    return status


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c["type"] == type_), {}
    )
    return found


def events(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json("get", "-n", namespace, "events")["items"]
    return items


def test_a_missing_input_topic_is_degraded_with_an_event_and_no_pod_until_it_exists(
    local_cluster: StackInfo, namespace: str, operator: Path
) -> None:
    kubectl = Kubectl(kubectl_binary(), local_cluster.kubeconfig)
    name = "clicks"
    bootstrap = local_cluster.kafka_bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(f"{name}-out", 3)])[f"{name}-out"].result(30)
    kubectl.ok("apply", "-f", "-", stdin=app_manifest(namespace, name, bootstrap))

    degraded = eventually(
        lambda: (
            (c := condition(status_of(kubectl, namespace, name), "Degraded"))
            and c.get("status") == "True"
            and c
        ),
        "the Degraded condition",
    )
    assert degraded["reason"] == "InputTopicMissing", degraded
    assert f"{name}-in" in degraded["message"], degraded
    warnings = [e for e in events(kubectl, namespace) if e.get("type") == "Warning"]
    assert any(f"{name}-in" in e.get("message", "") for e in warnings), warnings
    assert kubectl.json("get", "-n", namespace, "pods")["items"] == [], "no pod churn"

    admin.create_topics([NewTopic(f"{name}-in", 3)])[f"{name}-in"].result(30)
    pods = eventually(
        lambda: kubectl.json("get", "-n", namespace, "pods")["items"], "the instance pod"
    )
    assert [p["metadata"]["name"] for p in pods] == [f"{name}-0"]
    status = eventually(
        lambda: (s := status_of(kubectl, namespace, name)).get("tasksTotal") == 3 and s,
        "the status with the task count",
    )
    assert status["selector"], "the scale subresource needs a selector"
    app_id = names.default_application_id(namespace, name)
    topics = admin.list_topics(timeout=10).topics
    changelog = names.changelog_topic(app_id, "counts")
    assert len(topics[changelog].partitions) == 3
    assert len(topics[names.assignments_topic(app_id)].partitions) == 1
    assert names.dead_letter_topic(app_id) in topics
    created = {e.get("reason") for e in events(kubectl, namespace)}
    assert {"TopicCreated", "PodCreated"} <= created, created


def test_a_pipeline_that_cannot_be_imported_is_degraded_with_the_reason_not_a_silent_crash_loop(
    local_cluster: StackInfo, namespace: str, operator: Path
) -> None:
    kubectl = Kubectl(kubectl_binary(), local_cluster.kubeconfig)
    name = "typo"
    bootstrap = local_cluster.kafka_bootstrap
    input_and_output(local_cluster, name)
    manifest = app_manifest(
        namespace, name, bootstrap, pipeline={"ref": "examples.pipelines.runing_count:pipeline"}
    )
    kubectl.ok("apply", "-f", "-", stdin=manifest)

    degraded = eventually(
        lambda: (
            (c := condition(status_of(kubectl, namespace, name), "Degraded"))
            and c.get("reason") == "InstanceCrashing"
            and c
        ),
        "the Degraded condition naming the crash",
        timeout=120,
    )
    assert f"pod {name}-0 keeps failing" in degraded["message"], degraded
    assert "runing_count" in degraded["message"], "the reason, from the end of the pod's log"
    warnings = [e for e in events(kubectl, namespace) if e.get("reason") == "InstanceCrashing"]
    assert warnings, "a Warning Event"
    assert warnings[0]["type"] == "Warning", warnings


def test_deletion_policy_delete_deletes_the_apps_state_topics_and_never_its_data(
    local_cluster: StackInfo, namespace: str, operator: Path
) -> None:
    kubectl = Kubectl(kubectl_binary(), local_cluster.kubeconfig)
    name = "scratch"
    bootstrap = local_cluster.kafka_bootstrap
    admin = input_and_output(local_cluster, name)
    kubectl.ok(
        "apply", "-f", "-", stdin=app_manifest(namespace, name, bootstrap, deletionPolicy="Delete")
    )
    app_id = names.default_application_id(namespace, name)
    state = {names.changelog_topic(app_id, "counts"), names.assignments_topic(app_id)}
    eventually(lambda: state <= set(admin.list_topics(timeout=10).topics), "the state topics", 60)

    kubectl.ok("delete", "-n", namespace, "streamingapp", name, "--wait=false")
    eventually(
        lambda: not kubectl.json("get", "-n", namespace, "streamingapps")["items"],
        "the app gone (its finalizer released every task and deleted the pods)",
        180,
    )

    topics = set(admin.list_topics(timeout=10).topics)
    assert not state & topics, "the state topics are gone"
    kept = {f"{name}-in", f"{name}-out", names.dead_letter_topic(app_id)}
    assert kept <= topics, "input, output and dead letters are the user's data"
    reasons = {e.get("reason") for e in events(kubectl, namespace)}
    assert {"Released", "StateDeleted"} <= reasons, reasons


def test_replicas_above_the_task_count_are_capped_and_the_status_says_so(
    local_cluster: StackInfo, namespace: str, operator: Path
) -> None:
    kubectl = Kubectl(kubectl_binary(), local_cluster.kubeconfig)
    name = "capped"
    bootstrap = local_cluster.kafka_bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic, partitions in ((f"{name}-in", 2), (f"{name}-out", 2)):
        admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)
    kubectl.ok("apply", "-f", "-", stdin=app_manifest(namespace, name, bootstrap, replicas=5))

    status = eventually(
        lambda: (s := status_of(kubectl, namespace, name)).get("desiredReplicas") == 2 and s,
        "the capped replica count",
    )
    degraded = condition(status, "Degraded")
    assert degraded.get("reason") == "ReplicasAboveTasks", status
    pods = eventually(
        lambda: len(items := kubectl.json("get", "-n", namespace, "pods")["items"]) == 2 and items,
        "two pods",
    )
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{name}-0", f"{name}-1"]
    listing = json.loads(
        kubectl.ok("get", "-n", namespace, "pods", "-l", status["selector"], "-o", "json")
    )
    assert len(listing["items"]) == 2, "status.selector selects the app's pods"
