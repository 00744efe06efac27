"""The process kubelet against the local API server: pods in, processes and pod status out."""

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from devstack.apiserver import LocalApiServer, faults, write_kubeconfig
from devstack.kubelet import Kubelet, KubeletConfig
from devstack.processes import Backoff
from smoothscale.kubeapi import KubeApi, KubeApiError

JsonObject = dict[str, Any]
NAMESPACE = "default"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    with LocalApiServer() as server:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, server.url)
        api = KubeApi.from_kubeconfig(kubeconfig)
        yield api
        api.close()


@pytest.fixture
def kubelet(api: KubeApi, tmp_path: Path) -> Iterator[Kubelet]:
    config = KubeletConfig(
        root=tmp_path / "kubelet",
        backoff=Backoff(initial_seconds=0.1, cap_seconds=0.5),
        resync_seconds=0.3,
        watch_timeout_seconds=5,
        shutdown_grace_seconds=1,
    )
    running = Kubelet(api, config)
    running.start()
    yield running
    running.stop()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def pod_manifest(
    command: list[str],
    *,
    restart_policy: str = "Always",
    grace: int = 5,
    env: list[JsonObject] | None = None,
    readiness: JsonObject | None = None,
    ports: list[JsonObject] | None = None,
    labels: dict[str, str] | None = None,
) -> JsonObject:
    container: JsonObject = {"name": "main", "image": "ignored:latest", "command": command}
    if env:
        container["env"] = env
    if readiness:
        container["readinessProbe"] = readiness
    if ports:
        container["ports"] = ports
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"app-{uuid.uuid4().hex[:6]}", "labels": labels or {}},
        "spec": {
            "containers": [container],
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": grace,
        },
    }


def create(api: KubeApi, manifest: JsonObject) -> JsonObject:
    return api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=manifest)


def read(api: KubeApi, name: str) -> JsonObject | None:
    try:
        return api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    except KubeApiError as error:
        if error.status == 404:
            return None
        raise


def wait_for(
    api: KubeApi, name: str, condition: Callable[[JsonObject | None], bool], timeout: float = 15
) -> JsonObject | None:
    deadline = time.monotonic() + timeout
    while True:
        pod = read(api, name)
        if condition(pod):
            return pod
        assert time.monotonic() < deadline, f"pod {name} never got there; last seen: {pod}"
        time.sleep(0.05)


def wait_until_exists(path: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def phase(pod: JsonObject | None) -> str | None:
    return None if pod is None else (pod.get("status") or {}).get("phase")


def condition(pod: JsonObject | None, kind: str) -> str | None:
    for entry in ((pod or {}).get("status") or {}).get("conditions") or []:
        if entry["type"] == kind:
            return str(entry["status"])
    return None


def container_status(pod: JsonObject | None) -> JsonObject:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    status: JsonObject = statuses[0]
    return status


def delete(api: KubeApi, name: str, grace: int | None = None) -> None:
    options: JsonObject = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if grace is not None:
        options["gracePeriodSeconds"] = grace
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", body=options)


def test_the_kubelet_registers_its_node_ready(api: KubeApi, kubelet: Kubelet) -> None:
    node = api.request("GET", "/api/v1/nodes/local")
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"


def test_an_unscheduled_pod_is_bound_and_runs_with_downward_api_env(
    api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    out = tmp_path / "env.txt"
    names = ["POD_NAME", "POD_NAMESPACE", "POD_IP", "NODE_NAME", "POD_UID", "APP", "GREETING"]
    code = (
        "import os, pathlib; "
        f"pathlib.Path({str(out)!r}).write_text('\\n'.join(os.environ[n] for n in {names!r}))"
    )

    def field(path: str) -> JsonObject:
        return {"fieldRef": {"fieldPath": path}}

    manifest = pod_manifest(
        python(code),
        restart_policy="Never",
        labels={"app": "counts"},
        env=[
            {"name": "POD_NAME", "valueFrom": field("metadata.name")},
            {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
            {"name": "POD_IP", "valueFrom": field("status.podIP")},
            {"name": "NODE_NAME", "valueFrom": field("spec.nodeName")},
            {"name": "POD_UID", "valueFrom": field("metadata.uid")},
            {"name": "APP", "valueFrom": field("metadata.labels['app']")},
            {"name": "GREETING", "value": "hello $(POD_NAME)"},
        ],
    )
    created = create(api, manifest)
    name = created["metadata"]["name"]

    pod = wait_for(api, name, lambda p: phase(p) == "Succeeded")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "local"
    ip = pod["status"]["podIP"]
    assert ip.startswith("127."), "on the machine's loopback"
    assert ip != "127.0.0.1", "an address of its own"
    assert pod["status"]["hostIP"] == "127.0.0.1"
    assert container_status(pod)["state"]["terminated"]["exitCode"] == 0
    assert out.read_text().split("\n") == [
        name,
        NAMESPACE,
        ip,
        "local",
        created["metadata"]["uid"],
        "counts",
        f"hello {name}",
    ]


def test_exec_readiness_probe_drives_the_ready_condition(
    api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    flag = tmp_path / "ready"
    readiness = {"exec": {"command": ["test", "-f", str(flag)]}, "periodSeconds": 1}
    name = create(api, pod_manifest(python("import time; time.sleep(60)"), readiness=readiness))[
        "metadata"
    ]["name"]

    pod = wait_for(api, name, lambda p: phase(p) == "Running")
    assert condition(pod, "Ready") == "False"
    flag.write_text("")
    pod = wait_for(api, name, lambda p: condition(p, "Ready") == "True")
    assert container_status(pod)["ready"] is True
    flag.unlink()
    wait_for(api, name, lambda p: condition(p, "Ready") == "False", timeout=10)


def test_a_status_write_the_api_server_refused_is_written_again(tmp_path: Path) -> None:
    """The pod turns Ready while the API server refuses the kubelet's status writes (overloaded:
    503s): the kubelet writes the status again at its next resync, as a kubelet's status
    manager does, so the pod does not stay not Ready in the API for good."""
    with LocalApiServer() as server:
        write_kubeconfig(tmp_path / "kubeconfig", server.url)
        api = KubeApi.from_kubeconfig(tmp_path / "kubeconfig")
        config = KubeletConfig(root=tmp_path / "kubelet", resync_seconds=0.3)
        running = Kubelet(api, config)
        running.start()
        try:
            flag = tmp_path / "ready"
            readiness = {"exec": {"command": ["test", "-f", str(flag)]}, "periodSeconds": 1}
            manifest = pod_manifest(python("import time; time.sleep(60)"), readiness=readiness)
            name = create(api, manifest)["metadata"]["name"]
            wait_for(api, name, lambda p: phase(p) == "Running")
            refuse = {"code": 503, "count": 3, "method": "PATCH", "path": "/status"}
            assert requests.post(f"{server.url}{faults.PATH}", json=[refuse], timeout=10).ok
            flag.write_text("")
            wait_for(api, name, lambda p: condition(p, "Ready") == "True")
            report = requests.get(f"{server.url}{faults.PATH}", timeout=10).json()
            assert report == {"injected": {"503": 3}, "pending": 0}
        finally:
            running.stop()
            api.close()


def test_http_readiness_probe_on_a_named_port(api: KubeApi, kubelet: Kubelet) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = (
        "import http.server\n"
        f"http.server.HTTPServer(('', {port}), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )  # every address: the probe goes to the pod's IP, as on a cluster
    manifest = pod_manifest(
        python(server),
        ports=[{"name": "http", "containerPort": port}],
        readiness={"httpGet": {"port": "http", "path": "/"}, "periodSeconds": 1},
    )
    name = create(api, manifest)["metadata"]["name"]
    wait_for(api, name, lambda p: condition(p, "Ready") == "True")


def test_restart_policy_always_restarts_and_counts_in_the_status(
    api: KubeApi, kubelet: Kubelet
) -> None:
    name = create(api, pod_manifest(python("raise SystemExit(4)")))["metadata"]["name"]
    pod = wait_for(api, name, lambda p: container_status(p).get("restartCount", 0) >= 2)
    assert phase(pod) == "Running"
    assert container_status(pod)["lastState"]["terminated"]["exitCode"] == 4


def test_restart_policy_never_leaves_a_failed_pod(api: KubeApi, kubelet: Kubelet) -> None:
    manifest = pod_manifest(python("raise SystemExit(4)"), restart_policy="Never")
    name = create(api, manifest)["metadata"]["name"]
    pod = wait_for(api, name, lambda p: phase(p) == "Failed")
    assert container_status(pod)["state"]["terminated"]["exitCode"] == 4
    assert container_status(pod)["restartCount"] == 0


def test_delete_sends_sigterm_and_removes_the_pod_once_the_process_exits(
    api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    marker = tmp_path / "terminated"
    trapping = tmp_path / "trapping"
    code = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('bye'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"pathlib.Path({str(trapping)!r}).write_text('')\n"
        "time.sleep(60)\n"
    )
    name = create(api, pod_manifest(python(code), grace=20))["metadata"]["name"]
    wait_until_exists(trapping)

    started = time.monotonic()
    delete(api, name)
    wait_for(api, name, lambda p: p is None)
    assert time.monotonic() - started < 5  # far less than the 20 s grace period
    assert marker.read_text() == "bye"


def test_a_process_ignoring_sigterm_is_killed_after_the_delete_grace_period(
    api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    ignoring = tmp_path / "ignoring"
    code = (
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ignoring)!r}).write_text('')\n"
        "time.sleep(60)\n"
    )
    name = create(api, pod_manifest(python(code), grace=30))["metadata"]["name"]
    pod = wait_for(api, name, lambda p: container_status(p).get("started") is True)
    pid = int(container_status(pod)["containerID"].removeprefix("process://"))
    wait_until_exists(ignoring)

    started = time.monotonic()
    delete(api, name, grace=1)
    wait_for(api, name, lambda p: p is None)
    took = time.monotonic() - started
    assert 1 <= took < 6
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_missing_config_map_holds_the_pod_until_it_exists(
    api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    out = tmp_path / "bootstrap"
    code = f"import os, pathlib; pathlib.Path({str(out)!r}).write_text(os.environ['BOOTSTRAP'])"
    config_name = f"kafka-{uuid.uuid4().hex[:6]}"
    env = [
        {
            "name": "BOOTSTRAP",
            "valueFrom": {"configMapKeyRef": {"name": config_name, "key": "bootstrap"}},
        }
    ]
    manifest = pod_manifest(python(code), restart_policy="Never", env=env)
    name = create(api, manifest)["metadata"]["name"]
    pod = wait_for(api, name, lambda p: bool(container_status(p).get("state")))
    assert container_status(pod)["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    assert phase(pod) == "Pending"

    api.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/configmaps",
        body={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": config_name},
            "data": {"bootstrap": "127.0.0.1:9092"},
        },
    )
    wait_for(api, name, lambda p: phase(p) == "Succeeded")
    assert out.read_text() == "127.0.0.1:9092"


def test_a_pod_without_command_says_the_kubelet_runs_no_images(
    api: KubeApi, kubelet: Kubelet
) -> None:
    manifest = pod_manifest(["unused"])
    del manifest["spec"]["containers"][0]["command"]
    name = create(api, manifest)["metadata"]["name"]
    pod = wait_for(api, name, lambda p: bool(container_status(p).get("state")))
    assert "runs no images" in container_status(pod)["state"]["waiting"]["message"]


def test_pods_of_other_nodes_are_left_alone(api: KubeApi, kubelet: Kubelet) -> None:
    manifest = pod_manifest(python("import time; time.sleep(60)"))
    manifest["spec"]["nodeName"] = "elsewhere"
    name = create(api, manifest)["metadata"]["name"]
    time.sleep(1)
    pod = read(api, name)
    assert pod is not None
    assert not container_status(pod)
    assert kubelet.runner.keys() == []


def test_a_pod_reaches_the_api_as_its_service_account_and_only_with_its_token(
    api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    """The mounted token is the pod's in-cluster config: a ServiceAccount without roles is
    refused; a pod that mounts no token has no KUBECONFIG at all (not the kubelet's)."""
    out = tmp_path / "answers.txt"
    code = (
        "import os, pathlib\n"
        "from smoothscale.kubeapi import KubeApi, KubeApiError\n"
        "answer = 'no-kubeconfig'\n"
        "if 'KUBECONFIG' in os.environ:\n"
        "    try:\n"
        "        KubeApi.from_kubeconfig().request('GET', '/api/v1/namespaces/default/pods')\n"
        "        answer = 'allowed'\n"
        "    except KubeApiError as error:\n"
        "        answer = error.message\n"
        f"with open({str(out)!r}, 'a') as f: f.write(os.environ['POD'] + ' ' + answer + '\\n')\n"
    )
    for name, automount in (("mounted", True), ("unmounted", False)):
        manifest = pod_manifest(
            python(code),
            restart_policy="Never",
            env=[{"name": "POD", "value": name}],
        )
        manifest["spec"]["automountServiceAccountToken"] = automount
        create(api, manifest)
    deadline = time.monotonic() + 30
    while len(out.read_text().splitlines() if out.exists() else []) < 2:
        assert time.monotonic() < deadline, "the pods never answered"
        time.sleep(0.1)

    answers = dict(line.split(" ", 1) for line in out.read_text().splitlines())
    assert answers == {
        "mounted": 'pods is forbidden: User "system:serviceaccount:default:default" cannot list '
        'resource "pods" in API group "" in the namespace "default"',
        "unmounted": "no-kubeconfig",
    }
