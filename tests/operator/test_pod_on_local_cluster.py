"""An instance pod built for the example app runs its worker under the process kubelet."""

import socket
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from devstack.stack import StackInfo
from smoothscale.api.models import API_VERSION, PLURAL, StreamingApp
from smoothscale.kubeapi import KubeApi
from smoothscale.operator.pods import BASE_PORT, build_pod

REPOSITORY = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.cluster, pytest.mark.spark]


def ordinal_with_a_free_port() -> int:
    """An ordinal whose port (8080 + ordinal) nothing listens on, on this shared machine."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    assert port > BASE_PORT
    return port - BASE_PORT


def wait_for(condition: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        time.sleep(0.2)


def test_the_example_apps_pod_starts_its_worker_with_its_config(
    local_cluster: StackInfo,
) -> None:
    namespace = f"pods-{uuid.uuid4().hex[:6]}"
    example = yaml.safe_load((REPOSITORY / "examples" / "streamingapp.yaml").read_text())
    example["metadata"]["namespace"] = namespace
    example["spec"]["kafka"]["bootstrapServers"] = local_cluster.kafka_bootstrap
    # The pipeline's package (examples/) is importable from the checkout, as an image has it.
    example["spec"]["env"].append({"name": "PYTHONPATH", "value": str(REPOSITORY)})
    api = KubeApi.from_kubeconfig(local_cluster.kubeconfig)
    name = ""
    try:
        api.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
        created = api.request(
            "POST", f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}", body=example
        )
        app = StreamingApp.model_validate(created)
        ordinal = ordinal_with_a_free_port()
        pod = api.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            body=build_pod(app, ordinal, created["metadata"]["uid"]),
        )
        name = pod["metadata"]["name"]
        kubelet_dir = local_cluster.state_dir / "kubelet"
        log = kubelet_dir / f"{namespace}_{name}_{pod['metadata']['uid'][:8]}" / "worker.log"

        port = BASE_PORT + ordinal
        loaded = f"instance {name} of {namespace}.page-counts: metrics on port {port}"
        wait_for(
            "the worker to load its config",
            lambda: log.exists() and loaded in log.read_text(),
            timeout=60,
        )
        healthz = f"http://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(healthz, timeout=5) as answer:
            assert answer.status == 200
        # The state directory is relative: here, the container's own working directory.
        plan = log.parent / "worker" / "state" / "plan.json"
        wait_for("the worker to write its plan in its state directory", plan.exists, timeout=30)
    finally:
        if name:
            api.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 5},
            )
        api.close()
