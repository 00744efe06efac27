"""The Deployment and ReplicaSet controllers: a Deployment's pods come from its template
through a ReplicaSet, are replaced when it changes (Recreate: old ones gone first;
RollingUpdate: within maxSurge and maxUnavailable), and its status is what `kubectl rollout
status` reads. Pods are made ready by hand here, as the
kubelet would once their probes pass."""

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.apiserver import LocalApiServer, write_kubeconfig
from devstack.controllers import TEMPLATE_HASH_LABEL, ControllerManager
from smoothscale.kubeapi import MERGE_PATCH, KubeApi
from tests.devstack.apiserver.conftest import Kubectl

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    with LocalApiServer() as server:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, server.url)
        client = KubeApi.from_kubeconfig(kubeconfig)
        manager = ControllerManager(client, resync_seconds=0.5)
        manager.start()
        yield client
        manager.stop()
        client.close()


@pytest.fixture
def kubectl(api: KubeApi, tmp_path: Path) -> Kubectl:
    return Kubectl(kubeconfig=tmp_path / "kubeconfig", cache=tmp_path / "kube-cache")


def deployment(replicas: int, strategy: dict[str, Any], greeting: str = "hello") -> str:
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "replicas": replicas,
                "strategy": strategy,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "web:1",
                                "command": ["sleep", "60"],
                                "env": [{"name": "GREETING", "value": greeting}],
                            }
                        ]
                    },
                },
            },
        }
    )


def pods(api: KubeApi) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.request("GET", PODS)["items"]
    return [pod for pod in items if "deletionTimestamp" not in pod["metadata"]]


def hashes(api: KubeApi) -> list[str]:
    return sorted(pod["metadata"]["labels"][TEMPLATE_HASH_LABEL] for pod in pods(api))


def make_ready(api: KubeApi) -> None:
    for pod in pods(api):
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        api.request(
            "PATCH",
            f"{PODS}/{pod['metadata']['name']}/status",
            body={"status": status},
            content_type=MERGE_PATCH,
        )


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def deployment_status(api: KubeApi) -> dict[str, Any]:
    status: dict[str, Any] = api.request(
        "GET", "/apis/apps/v1/namespaces/default/deployments/web"
    ).get("status", {})
    return status


def test_a_deployment_runs_its_pods_and_rolls_out_once_they_are_ready(
    api: KubeApi, kubectl: Kubectl
) -> None:
    kubectl("apply", "-f", "-", stdin=deployment(2, {"type": "RollingUpdate"}))
    wait_until(lambda: len(pods(api)) == 2, "two pods")

    [replica_set] = api.request("GET", "/apis/apps/v1/namespaces/default/replicasets")["items"]
    assert replica_set["metadata"]["ownerReferences"][0]["name"] == "web"
    owners = {pod["metadata"]["ownerReferences"][0]["name"] for pod in pods(api)}
    assert owners == {replica_set["metadata"]["name"]}
    assert kubectl.run("rollout", "status", "deployment/web", "--timeout", "1s").returncode != 0

    make_ready(api)
    rolled = kubectl("rollout", "status", "deployment/web", "--timeout", "20s")

    assert 'deployment "web" successfully rolled out' in rolled
    status = deployment_status(api)
    assert (status["replicas"], status["readyReplicas"], status["availableReplicas"]) == (2, 2, 2)
    conditions = {c["type"]: c["reason"] for c in status["conditions"]}
    assert conditions == {
        "Available": "MinimumReplicasAvailable",
        "Progressing": "NewReplicaSetAvailable",
    }
    assert kubectl("get", "deployment", "web", "--no-headers").split()[1:4] == ["2/2", "2", "2"]
    wait_until(
        lambda: kubectl("get", "replicasets", "--no-headers").split()[1:4] == ["2", "2", "2"],
        "the ReplicaSet's status counts its ready pods",
    )


def test_recreate_replaces_the_pods_only_once_the_old_ones_are_gone(
    api: KubeApi, kubectl: Kubectl
) -> None:
    kubectl("apply", "-f", "-", stdin=deployment(1, {"type": "Recreate"}))
    wait_until(lambda: len(pods(api)) == 1, "one pod")
    make_ready(api)
    [old_hash] = hashes(api)

    seen: list[list[str]] = []
    kubectl("apply", "-f", "-", stdin=deployment(1, {"type": "Recreate"}, greeting="bonjour"))

    def replaced() -> bool:
        seen.append(hashes(api))
        return len(seen[-1]) == 1 and seen[-1][0] != old_hash

    wait_until(replaced, "the pod replaced")
    assert all(len(set(observed)) <= 1 for observed in seen), seen
    assert deployment_status(api)["observedGeneration"] == 2
    replica_sets = api.request("GET", "/apis/apps/v1/namespaces/default/replicasets")["items"]
    revisions = {
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]: rs["spec"]["replicas"]
        for rs in replica_sets
    }
    assert revisions == {"1": 0, "2": 1}


def test_a_rolling_update_surges_and_keeps_the_ready_pods_until_the_new_ones_are_ready(
    api: KubeApi, kubectl: Kubectl
) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    kubectl("apply", "-f", "-", stdin=deployment(2, strategy))
    wait_until(lambda: len(pods(api)) == 2, "two pods")
    make_ready(api)
    [old_hash, _] = hashes(api)

    kubectl("apply", "-f", "-", stdin=deployment(2, strategy, greeting="bonjour"))
    wait_until(lambda: len(pods(api)) == 3, "one surge pod")
    time.sleep(1)  # several passes of the controller: nothing old goes while nothing new is ready

    assert hashes(api).count(old_hash) == 2
    for _ in range(2):
        make_ready(api)
        time.sleep(0.5)
    make_ready(api)
    wait_until(lambda: old_hash not in hashes(api) and len(pods(api)) == 2, "all pods replaced")
    make_ready(api)
    rolled = kubectl("rollout", "status", "deployment/web", "--timeout", "20s")
    assert "successfully rolled out" in rolled
