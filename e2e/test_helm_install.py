"""The operator as users install it: `helm install charts/smoothscale` with the real helm, in the
namespaced and the cluster-wide mode, then a StreamingApp applied and scaled with the real
kubectl. The operator runs exactly as the chart installs it, with its ServiceAccount's token,
so the chart's RBAC is put to the test: every request it makes must be allowed, and every rule
the chart grants must be used by some request (least privilege, measured from the audit log).
"""

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devstack.apiserver.auth import Attributes, read_audit_log, rule_allows
from devstack.stack import free_ports
from e2e.conftest import Cluster
from e2e.kube import CHART, Kubectl

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

PIPELINE = "examples.pipelines.running_count:pipeline"
KOPF_PEERING: dict[str, Any] = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering"}
TASKS = 2


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    """Where the operator runs."""
    apps_namespace: str
    cluster_wide: bool
    peering: bool

    @property
    def service_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


@pytest.fixture(params=["namespaced", "cluster-wide", "namespaced-peering"])
def release(request: pytest.FixtureRequest, cluster: Cluster, namespace: str) -> Iterator[Release]:
    """The chart installed with the real helm, its operator Deployment rolled out."""
    cluster_wide = request.param == "cluster-wide"
    peering = request.param.endswith("peering")
    release = Release(
        f"smoothscale-{uuid.uuid4().hex[:6]}", f"{namespace}-op", namespace, cluster_wide, peering
    )
    # The process kubelet runs every pod on this machine's network: the operator's ports and its
    # instances' must be free here (and below the ephemeral range, which clients take from).
    healthz = free_ports(span=34)
    metrics, instances = healthz + 1, healthz + 2
    if peering:  # the peering object is the user's to create (docs/install.md)
        cluster.kubectl.ok(
            "apply",
            "-f",
            "-",
            stdin=json.dumps(
                KOPF_PEERING | {"metadata": {"name": "default", "namespace": namespace}}
            ),
        )
    scope = (
        ["--set", "watch.allNamespaces=true"]
        if cluster_wide
        else ["--set", f"watch.namespaces={{{namespace}}}"]
    )
    cluster.helm.ok(
        "install",
        release.name,
        str(CHART),
        "--namespace",
        release.namespace,
        "--create-namespace",
        *scope,
        "--set",
        f"ports.healthz={healthz}",
        "--set",
        f"ports.metrics={metrics}",
        "--set",
        f"instancePort={instances}",
        "--set",
        f"peering.enabled={str(peering).lower()}",
        # The secured app may send its credentials to this Kafka, which speaks no TLS here.
        "--set",
        f"kafka.allowedBootstrapServers={{{cluster.kafka_bootstrap}}}",
        "--set",
        "kafka.allowSaslPlaintext=true",
        "--wait",
        "--timeout",
        "180s",
    )
    try:
        cluster.kubectl.ok(
            "rollout",
            "status",
            f"deployment/{release.name}",
            "-n",
            release.namespace,
            "--timeout",
            "180s",
            timeout=200,
        )
        yield release
    finally:
        cluster.kubectl.run("delete", "streamingapps", "--all", "-n", namespace, timeout=120)
        cluster.helm.ok("uninstall", release.name, "--namespace", release.namespace)
        cluster.kubectl.run("delete", "namespace", release.namespace, "--wait=false")


def streaming_app(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "smoothscale.io/v1alpha1",
        "kind": "StreamingApp",
        "metadata": {"name": "counts", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "image": "ghcr.io/smoothscale/smoothscale:0.1.0",
            "env": cluster.app_env,
            "pipeline": {"ref": PIPELINE, "triggerInterval": "1s"},
            "kafka": {
                "bootstrapServers": cluster.kafka_bootstrap,
                "inputTopics": [f"{namespace}-clicks"],
                "outputTopic": f"{namespace}-counts",
                "stateStores": [{"name": "counts"}],
            },
            "scaling": {"lagPollInterval": "1s", "probingInterval": "10s", "drainTimeout": "2m"},
        },
    }


def settled(kubectl: Kubectl, namespace: str, replicas: int) -> bool:
    status = kubectl.json("get", "streamingapp", "counts", "-n", namespace).get("status") or {}
    conditions = {c["type"]: c.get("status") for c in status.get("conditions") or []}
    return (
        status.get("phase") == "Running"
        and conditions.get("Progressing") == "False"
        and status.get("replicas") == replicas
        and status.get("readyReplicas") == replicas
        and status.get("activeReplicas") == replicas
    )


def instance_pods(kubectl: Kubectl, namespace: str) -> list[str]:
    listing = kubectl.json("get", "pods", "-n", namespace, "-l", "smoothscale.io/app=counts")
    return sorted(
        pod["metadata"]["name"]
        for pod in listing["items"]
        if "deletionTimestamp" not in pod["metadata"]
    )


def granted_rules(kubectl: Kubectl, release: Release) -> list[dict[str, Any]]:
    """The rules the chart bound to the operator, read back from the cluster."""
    if release.cluster_wide:
        role = kubectl.json("get", "clusterrole", release.name)
    else:
        role = kubectl.json("get", "role", release.name, "-n", release.apps_namespace)
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def unused_permissions(
    rules: list[dict[str, Any]], used: list[Attributes]
) -> list[tuple[str, str, str]]:
    """(API group, resource, verb) granted by some rule and asked for by no request."""
    unused = []
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    single = {
                        **rule,
                        "apiGroups": [group],
                        "resources": [resource],
                        "verbs": [verb],
                    }
                    if not any(rule_allows(single, request) for request in used):
                        unused.append((group, resource, verb))
    return unused


def secured_app(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """An app whose Kafka wants SASL credentials from a Secret labelled for StreamingApps (the
    brokers here do not speak SASL: the operator reads the Secret, then reports the app
    Degraded)."""
    app = streaming_app(cluster, namespace)
    app["metadata"]["name"] = "secured"
    app["spec"]["kafka"]["security"] = {
        "securityProtocol": "SASL_PLAINTEXT",
        "saslMechanism": "PLAIN",
        "credentials": {"secretRef": {"name": "kafka-credentials"}},
    }
    return app


def degraded(kubectl: Kubectl, namespace: str, name: str) -> bool:
    status = kubectl.json("get", "streamingapp", name, "-n", namespace).get("status") or {}
    return any(
        c["type"] == "Degraded" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def test_the_chart_runs_the_operator_which_scales_an_app_with_exactly_its_rbac(
    cluster: Cluster, release: Release
) -> None:
    kubectl, namespace = cluster.kubectl, release.apps_namespace
    for topic in (f"{namespace}-clicks", f"{namespace}-counts"):
        cluster.create_topic(topic, TASKS)

    kubectl.ok("apply", "-f", "-", stdin=json.dumps(streaming_app(cluster, namespace)))
    kubectl.wait_for(lambda: settled(kubectl, namespace, 1), "the app runs one instance")
    kubectl.ok("scale", "streamingapp", "counts", "-n", namespace, "--replicas", "2")
    kubectl.wait_for(lambda: settled(kubectl, namespace, 2), "the app scaled out to 2")
    kubectl.ok("scale", "streamingapp", "counts", "-n", namespace, "--replicas", "1")
    kubectl.wait_for(lambda: settled(kubectl, namespace, 1), "the app scaled in to 1")
    kubectl.wait_for(
        lambda: instance_pods(kubectl, namespace) == ["counts-0"], "the drained pod is deleted"
    )
    kubectl.ok(
        "create",
        "secret",
        "generic",
        "kafka-credentials",
        "-n",
        namespace,
        "--from-literal=username=app",
        "--from-literal=password=secret",
    )
    kubectl.ok(
        "label",
        "secret",
        "kafka-credentials",
        "-n",
        namespace,
        "smoothscale.io/streamingapps=allowed",
    )
    kubectl.ok("apply", "-f", "-", stdin=json.dumps(secured_app(cluster, namespace)))
    kubectl.wait_for(lambda: degraded(kubectl, namespace, "secured"), "the secured app's status")

    if cluster.audit_log is None:
        return  # a real cluster without a copy of its audit log: RBAC was enough, unmeasured
    requests = [r for r in read_audit_log(cluster.audit_log) if r.user == release.service_account]
    denied = [r.attributes for r in requests if not r.allowed]
    assert denied == [], "the chart's RBAC refused the operator"
    allowed = [r.attributes for r in requests]
    assert unused_permissions(granted_rules(kubectl, release), allowed) == []
