"""`kubectl logs` on the local stack: the API server serves pods/log from the kubelet's log
files, with the real kubectl's flags (-f, --previous, -c, --tail, deployment/NAME)."""

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from devstack.apiserver import LocalApiServer, write_kubeconfig
from devstack.controllers import ControllerManager
from devstack.kubelet import Kubelet, KubeletConfig
from devstack.processes import Backoff
from smoothscale.kubeapi import KubeApi
from tests.devstack.apiserver.conftest import Kubectl

JsonObject = dict[str, Any]


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[Kubectl]:
    """The real kubectl against an API server, a kubelet and the controllers, all sharing the
    kubelet's root as `smoothscale dev up` does."""
    root = tmp_path / "kubelet"
    with LocalApiServer(kubelet_root=root) as server:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, server.url)
        api = KubeApi.from_kubeconfig(kubeconfig)
        config = KubeletConfig(
            root=root,
            backoff=Backoff(initial_seconds=0.1, cap_seconds=0.5),
            resync_seconds=0.3,
            watch_timeout_seconds=5,
            shutdown_grace_seconds=1,
        )
        kubelet = Kubelet(api, config)
        controllers = ControllerManager(api, resync_seconds=0.5)
        kubelet.start()
        controllers.start()
        try:
            yield Kubectl(kubeconfig=kubeconfig, cache=tmp_path / "kube-cache")
        finally:
            controllers.stop()
            kubelet.stop()
            api.close()


def pod(name: str, containers: dict[str, str], restart: str = "Always") -> str:
    """A pod whose containers (name: Python code) run this Python."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "restartPolicy": restart,
                "containers": [
                    {"name": c, "image": "local", "command": [sys.executable, "-u", "-c", code]}
                    for c, code in containers.items()
                ],
            },
        }
    )


def wait_for(kubectl: Kubectl, name: str, done: Any, what: str) -> JsonObject:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found: JsonObject = kubectl.json("get", "pod", name)
        if done(found):
            return found
        time.sleep(0.2)
    raise AssertionError(f"pod {name}: not {what} within 30 s")


def restarts(found: JsonObject) -> int:
    return sum(s.get("restartCount", 0) for s in found["status"].get("containerStatuses") or [])


def test_logs_show_the_current_run_and_previous_the_one_before(kubectl: Kubectl) -> None:
    # Each run prints its number (counted in a file of its working directory) and exits
    # after the second, so the kubelet restarts it once.
    code = (
        "import pathlib, sys, time\n"
        "runs = pathlib.Path('runs'); n = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "runs.write_text(str(n))\n"
        "print(f'run {n} line 1'); print(f'run {n} line 2')\n"
        "sys.exit(1) if n == 1 else time.sleep(60)\n"
    )
    kubectl("apply", "-f", "-", stdin=pod("twice", {"main": code}))
    wait_for(kubectl, "twice", lambda p: restarts(p) >= 1, "restarted")
    deadline = time.monotonic() + 30
    while "run 2 line 2" not in kubectl("logs", "twice") and time.monotonic() < deadline:
        time.sleep(0.2)

    assert kubectl("logs", "twice") == "run 2 line 1\nrun 2 line 2\n"
    assert kubectl("logs", "twice", "--previous") == "run 1 line 1\nrun 1 line 2\n"
    assert kubectl("logs", "twice", "--tail=1") == "run 2 line 2\n"
    assert kubectl("logs", "twice", "--limit-bytes=5") == "run 2"


def test_logs_follow_until_the_container_ends(kubectl: Kubectl) -> None:
    code = "import time\nfor i in range(5):\n    print(f'tick {i}'); time.sleep(0.3)\n"
    kubectl("apply", "-f", "-", stdin=pod("ticker", {"main": code}, restart="Never"))
    wait_for(kubectl, "ticker", lambda p: p["status"].get("phase") != "Pending", "started")

    followed = kubectl("logs", "-f", "ticker", timeout=30)

    assert followed == "".join(f"tick {i}\n" for i in range(5))


def test_a_pod_of_several_containers_needs_one_named(kubectl: Kubectl) -> None:
    containers = {
        "left": "import time\nprint('from the left')\ntime.sleep(60)\n",
        "right": "import time\nprint('from the right')\ntime.sleep(60)\n",
    }
    kubectl("apply", "-f", "-", stdin=pod("pair", containers))
    wait_for(kubectl, "pair", lambda p: p["status"].get("phase") == "Running", "running")
    deadline = time.monotonic() + 30
    while "right" not in kubectl.run("logs", "pair", "-c", "right").stdout:
        assert time.monotonic() < deadline, "no log from the right container"
        time.sleep(0.2)

    # kubectl picks the first container itself; the API asks for one.
    server = kubectl("config", "view", "-o", "jsonpath={.clusters[0].cluster.server}")
    refused = requests.get(f"{server}/api/v1/namespaces/default/pods/pair/log", timeout=10)
    assert refused.status_code == 400
    assert refused.json()["message"] == (
        "a container name must be specified for pod pair, choose one of: [left right]"
    )
    assert kubectl("logs", "pair", "-c", "left") == "from the left\n"
    unknown = kubectl.run("logs", "pair", "-c", "middle")
    assert "container middle is not valid for pod pair" in unknown.stderr
    previous = kubectl.run("logs", "pair", "-c", "left", "--previous")
    assert 'previous terminated container "left" in pod "pair" not found' in previous.stderr


def test_logs_of_a_deployment_read_one_of_its_pods(kubectl: Kubectl) -> None:
    template = json.loads(
        pod("ignored", {"main": "import time\nprint('served')\ntime.sleep(60)\n"})
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]},
        },
    }
    kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
    deadline = time.monotonic() + 30
    while True:
        answer = kubectl.run("logs", "deployment/web")
        if answer.returncode == 0 and answer.stdout == "served\n":
            break
        assert time.monotonic() < deadline, f"kubectl logs deployment/web: {answer.stderr}"
        time.sleep(0.3)
