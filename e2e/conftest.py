"""End-to-end fixtures: a Kubernetes cluster driven with the real kubectl and helm.

By default the scenarios run on the local control plane (`smoothscale dev up`: an in-memory
API server, its Deployment controller, a process kubelet and an embedded Kafka). To run them
against a real cluster (kind, k3d, a cloud), point SMOOTHSCALE_E2E_KUBECONFIG at its kubeconfig
and SMOOTHSCALE_E2E_KAFKA_BOOTSTRAP at a Kafka its pods reach (docs/install.md has the kind +
Kafka recipe): the scenarios then install the CRD and the chart there and work in namespaces of
their own, which they delete afterwards. A plain KUBECONFIG is deliberately not used, so a shell
pointed at a production cluster never runs them by accident.

What the operator's ServiceAccount did is read from the API server's audit log: the local one
always writes it; on a real cluster, SMOOTHSCALE_E2E_AUDIT_LOG names a copy of it (optional).
"""

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devstack.kafka.control import KafkaControl
from devstack.protocolworker import path_variable
from devstack.stack import LocalStack
from e2e.kube import Helm, Kubectl, kubectl_binary, tool_binary

REAL_CLUSTER_ENV = "SMOOTHSCALE_E2E_KUBECONFIG"
REAL_KAFKA_ENV = "SMOOTHSCALE_E2E_KAFKA_BOOTSTRAP"
REAL_AUDIT_LOG_ENV = "SMOOTHSCALE_E2E_AUDIT_LOG"
KAFKA_CLI_IMAGE = "apache/kafka:3.9.1"


@dataclass(frozen=True)
class Cluster:
    """Where the scenarios run, and what differs between the local stack and a real cluster."""

    kubectl: Kubectl
    helm: Helm
    kafka_bootstrap: str
    """The brokers, as the cluster's pods reach them."""
    audit_log: Path | None
    kafka_control: KafkaControl | None = None
    app_env: list[dict[str, Any]] = field(default_factory=list)
    """env of the StreamingApps: locally the pipelines' package is the checkout's examples/
    (the image has them under /app), and the pods run the protocol worker (the worker without
    a Spark driver: these tests are about the chart, its RBAC and the API, not the runtime)."""

    def create_topic(self, name: str, partitions: int) -> None:
        if self.kafka_control is not None:
            self.kafka_control.create_topic(name, partitions)
            return
        self.kubectl.ok(
            "run",
            f"topic-{uuid.uuid4().hex[:8]}",
            "--rm",
            "-i",
            "--restart=Never",
            f"--image={KAFKA_CLI_IMAGE}",
            "--command",
            "--",
            "/opt/kafka/bin/kafka-topics.sh",
            "--bootstrap-server",
            self.kafka_bootstrap,
            "--create",
            "--if-not-exists",
            "--topic",
            name,
            "--partitions",
            str(partitions),
            timeout=180,
        )


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The real cluster of $SMOOTHSCALE_E2E_KUBECONFIG, else a local one."""
    helm_home = tmp_path_factory.mktemp("helm")
    real = os.environ.get(REAL_CLUSTER_ENV)
    if real:
        bootstrap = os.environ.get(REAL_KAFKA_ENV)
        assert bootstrap, f"set {REAL_KAFKA_ENV} to the Kafka the cluster's pods reach"
        audit = os.environ.get(REAL_AUDIT_LOG_ENV)
        yield Cluster(
            Kubectl(kubectl_binary(), Path(real)),
            Helm(tool_binary("helm"), Path(real), helm_home),
            bootstrap,
            Path(audit) if audit else None,
        )
        return
    with LocalStack(tmp_path_factory.mktemp("e2e-cluster"), shutdown_grace_period=0) as stack:
        info = stack.info
        assert info is not None
        yield Cluster(
            Kubectl(kubectl_binary(), info.kubeconfig),
            Helm(tool_binary("helm"), info.kubeconfig, helm_home),
            info.kafka_bootstrap,
            info.audit_log,
            KafkaControl(info.kafka_control),
            [
                {"name": "PYTHONPATH", "value": str(Path(__file__).resolve().parent.parent)},
                path_variable(tmp_path_factory.mktemp("apps")),
            ],
        )


@pytest.fixture(scope="session")
def kubectl(cluster: Cluster) -> Kubectl:
    return cluster.kubectl


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl.ok("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")
