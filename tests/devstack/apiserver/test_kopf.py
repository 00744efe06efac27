"""kopf, unmodified, runs an operator against the local API server (peering off and on)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tests.devstack.apiserver.conftest import Api

OPERATOR = Path(__file__).with_name("kopf_widget_operator.py")
WIDGETS = "/apis/example.smoothscale.io/v1/namespaces/default/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}
T = TypeVar("T")


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 20) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = probe()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def kopf_operator(kubeconfig: Path, *options: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "kopf", "run", "-A", *options, str(OPERATOR)],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            output, _ = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        assert "Traceback" not in output, output


def status(api: Api, name: str) -> dict[str, Any]:
    response = api.request("GET", f"{WIDGETS}/{name}")
    return response.json().get("status", {}) if response.status_code == 200 else {}


def test_kopf_handles_create_update_scale_and_delete_with_its_finalizer(
    api: Api, kubeconfig: Path
) -> None:
    with kopf_operator(kubeconfig, "--standalone"):
        widget = {
            "apiVersion": "example.smoothscale.io/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"color": "red", "replicas": 1},
        }
        assert api.request("POST", WIDGETS, json=widget).status_code == 201
        eventually(lambda: status(api, "w").get("phase") == "Created", "the create handler")
        finalizers = api.request("GET", f"{WIDGETS}/w").json()["metadata"]["finalizers"]
        assert finalizers == ["kopf.zalando.org/KopfFinalizerMarker"]

        api.request("PATCH", f"{WIDGETS}/w", headers=MERGE, json={"spec": {"color": "blue"}})
        eventually(lambda: status(api, "w").get("phase") == "Recolored blue", "the update handler")

        api.request("PATCH", f"{WIDGETS}/w/scale", headers=MERGE, json={"spec": {"replicas": 4}})
        eventually(lambda: status(api, "w").get("replicas") == 4, "the spec.replicas handler")

        deleting = api.request("DELETE", f"{WIDGETS}/w")
        assert deleting.status_code == 202  # held by kopf's finalizer until its handler ran
        eventually(lambda: api.request("GET", f"{WIDGETS}/w").status_code == 404, "the deletion")

        def farewell() -> bool:
            events = api.request("GET", "/api/v1/namespaces/default/events").json()["items"]
            return any(event["reason"] == "Farewell" for event in events)

        eventually(farewell, "the delete handler's event")


def test_kopf_with_peering_on_announces_itself_and_handles_objects(
    api: Api, kubeconfig: Path
) -> None:
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "widgets"},
    }
    assert (
        api.request("POST", "/apis/kopf.dev/v1/clusterkopfpeerings", json=peering).status_code
        == 201
    )

    with kopf_operator(kubeconfig, "--peering", "widgets"):
        eventually(
            lambda: (
                api.request("GET", "/apis/kopf.dev/v1/clusterkopfpeerings/widgets")
                .json()
                .get("status")
            ),
            "kopf's presence in the peering object",
        )
        widget = {
            "apiVersion": "example.smoothscale.io/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"color": "red"},
        }
        assert api.request("POST", WIDGETS, json=widget).status_code == 201
        eventually(lambda: status(api, "w").get("phase") == "Created", "the create handler")
