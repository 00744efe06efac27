"""`kubectl drain` against the local control plane with three nodes, end to end: the real
kubectl cordons the node, evicts its pods (a Deployment's, and one a StreamingApp controls),
retries every 5 s while their PodDisruptionBudget forbids it, finishes once the budget is
relaxed, and the Deployment's pod comes back on another node."""

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devstack.apiserver.eviction import VIOLATION
from devstack.stack import LocalStack
from tests.devstack.apiserver.conftest import KUBECTL, Kubectl

JsonObject = dict[str, Any]
# Says so on SIGTERM and exits; `sleep` keeps it cheap.
TRAPPING = 'trap "echo SIGTERM; exit 0" TERM; while true; do sleep 0.2; done'


def deployment() -> JsonObject:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {"name": "main", "image": "busybox", "command": ["sh", "-c", TRAPPING]}
                    ],
                },
            },
        },
    }


STREAMING_APP = {
    "apiVersion": "smoothscale.io/v1alpha1",
    "kind": "StreamingApp",
    "metadata": {"name": "counts"},
    "spec": {
        "replicas": 1,
        "image": "smoothscale:dev",
        "pipeline": {"ref": "examples.pipelines.running_count:pipeline"},
        "kafka": {
            "bootstrapServers": "127.0.0.1:9092",
            "inputTopics": ["page-views"],
            "outputTopic": "page-view-counts",
            "stateStores": [{"name": "counts"}],
        },
    },
}


def instance_of(app: JsonObject, node: str) -> JsonObject:
    """A pod the StreamingApp controls (as the operator makes them), pinned to `node`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "counts-0",
            "labels": {"app": "counts"},
            "ownerReferences": [
                {
                    "apiVersion": "smoothscale.io/v1alpha1",
                    "kind": "StreamingApp",
                    "name": "counts",
                    "uid": app["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "main", "image": "smoothscale:dev", "command": ["sh", "-c", TRAPPING]}
            ],
        },
    }


def eventually(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return result


def ready_pods(kubectl: Kubectl, label: str) -> list[JsonObject]:
    pods: list[JsonObject] = kubectl.json("get", "pods", "-l", label)["items"]
    return [
        pod
        for pod in pods
        if "deletionTimestamp" not in pod["metadata"]
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
    ]


class Lines:
    """The lines a stream has written so far, read on a thread."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def join(self) -> None:
        self._thread.join(timeout=10)


def drain(kubectl: Kubectl, node: str) -> subprocess.Popen[str]:
    """`kubectl drain NODE` in the background."""
    return subprocess.Popen(
        [
            str(KUBECTL),
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "KUBECONFIG": str(kubectl.kubeconfig),
            "KUBECACHEDIR": str(kubectl.cache),
        },
    )


def test_kubectl_drain_waits_for_the_budget_then_evicts_and_the_pods_move_elsewhere(
    tmp_path: Path,
) -> None:
    with LocalStack(tmp_path / "stack", nodes=3, shutdown_grace_period=0) as stack:
        assert stack.info is not None
        info = stack.info
        kubectl = Kubectl(kubeconfig=info.kubeconfig, cache=tmp_path / "kube-cache")
        assert info.nodes == ("local", "local-2", "local-3")
        kubectl("apply", "-f", "-", stdin=json.dumps(deployment()))
        kubectl("apply", "-f", "-", stdin=json.dumps(STREAMING_APP))
        app = kubectl.json("get", "streamingapp", "counts")
        kubectl("apply", "-f", "-", stdin=json.dumps(instance_of(app, "local-2")))
        kubectl("create", "pdb", "web", "--selector=app=web", "--min-available=3")
        eventually(lambda: len(ready_pods(kubectl, "app=web")) == 3, "3 web pods ready")
        web = {pod["spec"]["nodeName"]: pod for pod in ready_pods(kubectl, "app=web")}
        eventually(lambda: ready_pods(kubectl, "app=counts"), "the app's instance ready")
        eventually(
            lambda: kubectl.json("get", "pdb", "web")["status"]["currentHealthy"] == 3,
            "the budget counted",
        )
        assert sorted(web) == ["local", "local-2", "local-3"]  # spread, fewest pods first
        evicted = web["local-2"]
        pod_name = evicted["metadata"]["name"]

        draining = drain(kubectl, "local-2")
        errors, output = Lines(draining.stderr), Lines(draining.stdout)
        retrying = (
            f'error when evicting pods/"{pod_name}" -n "default" (will retry after 5s): {VIOLATION}'
        )
        eventually(lambda: retrying in errors.lines, f"drain refused: {errors.text()}", 30)
        blocked = kubectl("get", "pdb", "web", "--no-headers").split()
        still_there = kubectl.json("get", "pod", pod_name)
        kubectl("patch", "pdb", "web", "--type=merge", "-p", '{"spec":{"minAvailable":2}}')
        assert draining.wait(timeout=90) == 0, errors.text()
        output.join()
        errors.join()

        assert output.lines[0] == "node/local-2 cordoned"
        assert f"evicting pod default/{pod_name}" in output.lines
        assert "evicting pod default/counts-0" in output.lines  # a StreamingApp's pod is managed
        assert "pod/counts-0 evicted" in output.lines
        assert f"pod/{pod_name} evicted" in output.lines
        assert output.lines[-1] == "node/local-2 drained"
        assert blocked[:4] == ["web", "3", "N/A", "0"]
        assert "deletionTimestamp" not in still_there["metadata"]
        assert "SIGTERM" in info.container_log(evicted, "main").read_text()
        assert kubectl("get", "pods", "--field-selector=spec.nodeName=local-2", "-o", "name") == ""
        assert kubectl("get", "node", "local-2", "--no-headers").split()[1] == (
            "Ready,SchedulingDisabled"
        )
        eventually(lambda: len(ready_pods(kubectl, "app=web")) == 3, "web back to 3")
        moved = sorted(pod["spec"]["nodeName"] for pod in ready_pods(kubectl, "app=web"))
        assert "local-2" not in moved
