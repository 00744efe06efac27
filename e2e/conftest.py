"""End-to-end fixtures: a Kubernetes cluster driven with the real kubectl.

By default the scenarios run on the local control plane (`smoothscale dev up`: an in-memory
API server, a process kubelet and an embedded Kafka). To run them against a real cluster
(kind, k3d, a cloud), point SMOOTHSCALE_E2E_KUBECONFIG at its kubeconfig: the scenarios then
install the CRD there and work in namespaces of their own, which they delete afterwards. A
plain KUBECONFIG is deliberately not used, so a shell pointed at a production cluster never
runs them by accident.
"""

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kube import Kubectl, kubectl_binary
from smoothscale.devcluster.stack import LocalStack

REAL_CLUSTER_ENV = "SMOOTHSCALE_E2E_KUBECONFIG"


@pytest.fixture(scope="session")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """kubectl on the real cluster of $SMOOTHSCALE_E2E_KUBECONFIG, else on a local one."""
    real = os.environ.get(REAL_CLUSTER_ENV)
    if real:
        yield Kubectl(kubectl_binary(), Path(real))
        return
    with LocalStack(tmp_path_factory.mktemp("e2e-cluster")) as stack:
        assert stack.info is not None
        yield Kubectl(kubectl_binary(), stack.info.kubeconfig)


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl.ok("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")
