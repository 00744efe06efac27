"""The disruption controller: each PodDisruptionBudget's status counts its pods as
kube-controller-manager's does (expected, desired and current healthy, disruptions allowed),
taking the expected count from the pods' controllers' scale when it needs one, and forgetting
an evicted pod only once it is gone or two minutes have passed."""

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devstack.controllers import ControllerManager
from smoothscale.kubeapi import MERGE_PATCH, KubeApi

JsonObject = dict[str, Any]
PODS = "/api/v1/namespaces/default/pods"
BUDGETS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
WIDGETS = "/apis/example.smoothscale.io/v1/namespaces/default/widgets"


@pytest.fixture
def api(kube_api: KubeApi) -> Iterator[KubeApi]:
    """The API, with the controllers at work (Widgets: custom controllers with a scale)."""
    manager = ControllerManager(kube_api, resync_seconds=0.5)
    manager.start()
    yield kube_api
    manager.stop()


def create_pod(api: KubeApi, name: str, owner: JsonObject | None = None) -> None:
    meta: JsonObject = {"name": name, "labels": {"app": "web"}}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    body = {"metadata": meta, "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    api.request("POST", PODS, body=body)


def set_ready(api: KubeApi, name: str, ready: bool = True) -> None:
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    api.request("PATCH", f"{PODS}/{name}/status", body={"status": status}, content_type=MERGE_PATCH)


def create_budget(api: KubeApi, **spec: Any) -> None:
    body = {
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }
    api.request("POST", BUDGETS, body=body)


def counts(api: KubeApi) -> tuple[int, int, int, int]:
    """(expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed)"""
    status = api.request("GET", f"{BUDGETS}/web")["status"]
    return (
        status["expectedPods"],
        status["desiredHealthy"],
        status["currentHealthy"],
        status["disruptionsAllowed"],
    )


def eventually(check: Callable[[], Any], expected: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (seen := check()) != expected:
        assert time.monotonic() < deadline, f"still {seen}, not {expected}"
        time.sleep(0.05)


def condition(api: KubeApi) -> tuple[str, str, str] | None:
    """The DisruptionAllowed condition's status, reason and message, once there is one."""
    status = api.request("GET", f"{BUDGETS}/web")["status"]
    for allowed in status.get("conditions") or []:
        if allowed["type"] == "DisruptionAllowed":
            return allowed["status"], allowed["reason"], allowed["message"]
    return None


def test_min_available_counts_the_selected_pods_that_are_ready(api: KubeApi) -> None:
    for name in ("a", "b", "c"):
        create_pod(api, name)
    set_ready(api, "a")
    set_ready(api, "b")
    create_budget(api, minAvailable=2)

    eventually(lambda: counts(api), (3, 2, 2, 0))
    assert condition(api) == ("False", "InsufficientPods", "")
    set_ready(api, "c")
    eventually(lambda: counts(api), (3, 2, 3, 1))
    assert condition(api) == ("True", "SufficientPods", "")
    assert api.request("GET", f"{BUDGETS}/web")["status"]["observedGeneration"] == 1


def test_max_unavailable_expects_as_many_pods_as_the_deployment_wants(api: KubeApi) -> None:
    deployment = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }
    api.request("POST", "/apis/apps/v1/namespaces/default/deployments", body=deployment)
    create_budget(api, maxUnavailable=1)
    eventually(lambda: len(api.request("GET", PODS)["items"]), 3)
    pods = [pod["metadata"]["name"] for pod in api.request("GET", PODS)["items"]]
    set_ready(api, pods[0])
    set_ready(api, pods[1])

    eventually(lambda: counts(api), (3, 2, 2, 0))
    set_ready(api, pods[2])
    eventually(lambda: counts(api), (3, 2, 3, 1))


def test_a_percentage_asks_a_custom_controller_through_its_scale_subresource(
    api: KubeApi,
) -> None:
    widget = api.request(
        "POST",
        WIDGETS,
        body={
            "apiVersion": "example.smoothscale.io/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"color": "red", "replicas": 4},
        },
    )
    for name in ("a", "b"):
        create_pod(api, name, owner=widget)
        set_ready(api, name)
    create_budget(api, minAvailable="50%")

    eventually(lambda: counts(api), (4, 2, 2, 0))  # 4 expected: the widget's spec.replicas


def test_a_controller_without_a_scale_subresource_fails_safe(api: KubeApi) -> None:
    config_map = api.request(
        "POST", "/api/v1/namespaces/default/configmaps", body={"metadata": {"name": "owner"}}
    )
    create_pod(api, "a", owner={**config_map, "apiVersion": "v1", "kind": "ConfigMap"})
    set_ready(api, "a")
    create_budget(api, maxUnavailable=1)

    eventually(
        lambda: condition(api),
        ("False", "SyncFailed", "configmaps does not implement the scale subresource"),
    )
    assert counts(api)[3] == 0


def test_a_recently_evicted_pod_is_not_healthy_until_two_minutes_have_passed(
    api: KubeApi,
) -> None:
    for name in ("a", "b"):
        create_pod(api, name)
        set_ready(api, name)
    create_budget(api, minAvailable=1)
    eventually(lambda: counts(api), (2, 1, 2, 1))

    def note_evictions(since: datetime) -> None:
        noted = {name: since.strftime("%Y-%m-%dT%H:%M:%SZ") for name in ("a", "gone")}
        current = api.request("GET", f"{BUDGETS}/web")
        current["status"]["disruptedPods"] = noted
        api.request("PUT", f"{BUDGETS}/web/status", body=current)

    note_evictions(datetime.now(UTC))
    eventually(lambda: counts(api), (2, 1, 1, 0))
    kept = api.request("GET", f"{BUDGETS}/web")["status"]["disruptedPods"]
    note_evictions(datetime.now(UTC) - timedelta(minutes=3))
    eventually(lambda: counts(api), (2, 1, 2, 1))

    assert list(kept) == ["a"]  # a pod that is not there any more is forgotten at once
    assert "disruptedPods" not in api.request("GET", f"{BUDGETS}/web")["status"]
