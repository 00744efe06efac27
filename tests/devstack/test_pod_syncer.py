"""PodSyncer against API servers that behave unlike the local one (no binding subresource,
pods removed at once)."""

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.kubelet import PodSyncer
from devstack.processes import ProcessRunner
from smoothscale.kubeapi import KubeApi, KubeApiError


class RecordingApi(KubeApi):
    """Answers every request with {} and records it; `refuse` maps (method, path suffix) to an
    HTTP status to fail with."""

    def __init__(self, refuse: dict[tuple[str, str], int] | None = None) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self._refuse = refuse or {}

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Any = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        self.requests.append((method, path, body))
        for (refused_method, suffix), status in self._refuse.items():
            if method == refused_method and path.endswith(suffix):
                raise KubeApiError(status, "refused")
        return {}


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ProcessRunner]:
    process_runner = ProcessRunner(tmp_path / "kubelet")
    yield process_runner
    process_runner.stop_all(max_grace_seconds=1)


def pod(command: list[str], node: str | None = "local", grace: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "command": command}],
        "terminationGracePeriodSeconds": grace,
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "p", "namespace": "default", "uid": "uid-1"}, "spec": spec}


def test_without_a_binding_subresource_the_pod_is_bound_by_patching_its_node(
    runner: ProcessRunner,
) -> None:
    api = RecordingApi(refuse={("POST", "/binding"): 404})
    syncer = PodSyncer(api, runner)
    syncer.on_pod(pod(["true"], node=None))
    assert [(m, p) for m, p, _ in api.requests] == [
        ("POST", "/api/v1/namespaces/default/pods/p/binding"),
        ("PATCH", "/api/v1/namespaces/default/pods/p"),
    ]
    assert api.requests[1][2] == {"spec": {"nodeName": "local"}}


def test_a_pod_removed_at_once_still_gets_sigterm_and_its_grace_period(
    runner: ProcessRunner, tmp_path: Path
) -> None:
    marker = tmp_path / "terminated"
    code = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('bye'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    api = RecordingApi()
    syncer = PodSyncer(api, runner)
    running = pod([sys.executable, "-c", code], grace=10)
    syncer.on_pod(running)
    log = runner.log_path("default_p_uid-1", "main")
    deadline = time.monotonic() + 10
    while not (log.exists() and "up" in log.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.02)

    syncer.on_pod_gone(running)  # stops synchronously without a background stopper
    assert marker.read_text() == "bye"
    assert runner.keys() == []
    # Removed by the server: nothing left for the kubelet to delete.
    assert not any(method == "DELETE" for method, _, _ in api.requests)


def test_a_graceful_delete_is_finished_with_grace_zero_and_the_uid(runner: ProcessRunner) -> None:
    api = RecordingApi()
    syncer = PodSyncer(api, runner)
    running = pod([sys.executable, "-c", "import time; time.sleep(60)"])
    syncer.on_pod(running)
    deleting = {
        **running,
        "metadata": {**running["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"},
    }
    syncer.on_pod(deleting)
    deletes = [body for method, _, body in api.requests if method == "DELETE"]
    assert deletes == [
        {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": "uid-1"},
        }
    ]
    assert runner.keys() == []
