"""The process kubelet on a cluster of several nodes: it leaves scheduling to the scheduler
when told to, and an evicted pod ends as a gracefully deleted one does (SIGTERM at once, SIGKILL
at the end of the eviction's grace period, the pod gone once its process has exited), keeping
the DisruptionTarget condition the eviction gave it."""

import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devstack.kubelet import Kubelet, KubeletConfig
from devstack.podspec import pod_key
from devstack.podstatus import pod_status
from smoothscale.kubeapi import KubeApi
from tests.devstack.test_kubelet import read

JsonObject = dict[str, Any]
PODS = "/api/v1/namespaces/default/pods"


def start_kubelet(api: KubeApi, root: Path, *, bind: bool) -> Kubelet:
    config = KubeletConfig(
        node_name="n1",
        root=root,
        resync_seconds=0.3,
        watch_timeout_seconds=5,
        shutdown_grace_seconds=1,
        bind_unscheduled=bind,
    )
    kubelet = Kubelet(api, config)
    kubelet.start()
    return kubelet


@pytest.fixture
def api(kube_api: KubeApi) -> KubeApi:
    return kube_api


@pytest.fixture
def kubelet(api: KubeApi, tmp_path: Path) -> Iterator[Kubelet]:
    running = start_kubelet(api, tmp_path / "kubelet", bind=True)
    yield running
    running.stop()


def eventually(check: Callable[[], Any], timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


def create(api: KubeApi, name: str, code: str, grace: int = 30) -> None:
    manifest = {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "main", "image": "ignored", "command": [sys.executable, "-c", code]}
            ],
            "terminationGracePeriodSeconds": grace,
        },
    }
    api.request("POST", PODS, body=manifest)


def test_a_kubelet_that_leaves_scheduling_to_a_scheduler_binds_no_pod(
    api: KubeApi, tmp_path: Path
) -> None:
    kubelet = start_kubelet(api, tmp_path / "kubelet", bind=False)
    try:
        create(api, "p", "import time; time.sleep(60)")
        time.sleep(1.5)  # several resyncs
        unbound = read(api, "p")
        api.request("POST", f"{PODS}/p/binding", body={"target": {"kind": "Node", "name": "n1"}})
        running = eventually(
            lambda: ((read(api, "p") or {}).get("status") or {}).get("phase") == "Running"
        )
    finally:
        kubelet.stop()

    assert unbound is not None
    assert not unbound["spec"].get("nodeName")
    assert running  # once the scheduler binds it, its node's kubelet runs it


def test_an_evicted_pod_gets_sigterm_then_sigkill_and_goes_once_its_process_exited(
    api: KubeApi, kubelet: Kubelet, tmp_path: Path
) -> None:
    ignoring = tmp_path / "ignoring"
    code = (
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('SIGTERM', flush=True))\n"
        f"pathlib.Path({str(ignoring)!r}).write_text('')\n"
        "time.sleep(60)\n"
    )
    create(api, "p", code, grace=30)
    eventually(ignoring.exists)
    log = kubelet.runner.log_path(pod_key(read(api, "p") or {}), "main")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "p"},
        "deleteOptions": {"gracePeriodSeconds": 2},
    }

    started = time.monotonic()
    api.request("POST", f"{PODS}/p/eviction", body=eviction)
    eventually(lambda: "SIGTERM" in log.read_text(), timeout=1.5)  # at once
    terminating = read(api, "p")
    eventually(lambda: read(api, "p") is None)
    took = time.monotonic() - started

    assert terminating is not None
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 2
    assert 2 <= took < 7  # the grace period of the eviction, then SIGKILL: not 30 s
    assert kubelet.runner.keys() == []


def test_the_kubelet_keeps_the_conditions_others_gave_the_pod() -> None:
    disrupted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
    }
    now = datetime(2026, 1, 1, tzinfo=UTC)
    pod = {"metadata": {"name": "p"}, "spec": {}, "status": {"conditions": [disrupted]}}

    status = pod_status(pod, [], "Running", start_time=now, now=now)

    assert [c["type"] for c in status["conditions"]] == [
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
        "DisruptionTarget",
    ]
    assert status["conditions"][-1] == disrupted
