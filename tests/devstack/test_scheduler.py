"""The scheduler: which node a pod goes to (kube-scheduler's filters, fewest pods first), what
an unschedulable pod says, and the scheduler against the API server (binding, PodScheduled
False and a FailedScheduling event, and a second try once a node fits)."""

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devstack.scheduler import Scheduler, place, unfit_reason
from smoothscale.kubeapi import MERGE_PATCH, KubeApi

JsonObject = dict[str, Any]


def node(name: str, *, ready: bool = True, **spec: Any) -> JsonObject:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(name: str = "p", node_name: str = "", phase: str = "Pending", **spec: Any) -> JsonObject:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"nodeName": node_name, **spec},
        "status": {"phase": phase},
    }


def test_the_node_with_fewest_running_pods_gets_the_pod() -> None:
    nodes = [node("a"), node("b"), node("c")]
    pods = [
        pod("1", "a", "Running"),
        pod("2", "a", "Running"),
        pod("3", "b", "Running"),
        pod("4", "c", "Running"),
        pod("5", "c", "Succeeded"),  # finished pods take no room
    ]

    assert place(pod(), nodes, pods).node == "b"
    assert place(pod(), nodes, []).node == "a"  # ties: by name


def test_cordoned_tainted_unready_and_unselected_nodes_do_not_fit() -> None:
    taint = {"key": "dedicated", "value": "kafka", "effect": "NoSchedule"}
    selector = {"kubernetes.io/hostname": "a"}

    assert unfit_reason(pod(), node("a", unschedulable=True)) == "node(s) were unschedulable"
    assert unfit_reason(pod(), node("a", taints=[taint])) == (
        "node(s) had untolerated taint {dedicated: kafka}"
    )
    assert unfit_reason(pod(), node("a", ready=False)) == (
        "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
    )
    assert unfit_reason(pod(nodeSelector=selector), node("b")) == (
        "node(s) didn't match Pod's node affinity/selector"
    )
    assert unfit_reason(pod(nodeSelector=selector), node("a")) is None
    soft = {"key": "x", "effect": "PreferNoSchedule"}
    assert unfit_reason(pod(), node("a", taints=[soft])) is None


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "kafka"},
        {"key": "dedicated", "operator": "Exists"},
        {"operator": "Exists"},
    ],
)
def test_a_tolerated_taint_lets_the_pod_in(toleration: JsonObject) -> None:
    taint = {"key": "dedicated", "value": "kafka", "effect": "NoSchedule"}

    assert unfit_reason(pod(tolerations=[toleration]), node("a", taints=[taint])) is None


def test_a_pod_tolerating_the_unschedulable_taint_may_go_to_a_cordoned_node() -> None:
    toleration = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}

    assert unfit_reason(pod(tolerations=[toleration]), node("a", unschedulable=True)) is None
    assert (
        unfit_reason(
            pod(tolerations=[{"key": "other", "operator": "Exists"}]), node("a", unschedulable=True)
        )
        == "node(s) were unschedulable"
    )


def test_when_nothing_fits_the_message_is_kube_schedulers() -> None:
    nodes = [node("a", unschedulable=True), node("b"), node("c")]

    placement = place(pod(nodeSelector={"disk": "ssd"}), nodes, [])

    assert placement.node is None
    assert placement.message == (
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match Pod's "
        "node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not "
        "helpful for scheduling."
    )
    assert place(pod(), [], []).message == "no nodes available to schedule pods"


@pytest.fixture
def api(kube_api: KubeApi) -> Iterator[KubeApi]:
    """The API, with the scheduler at work."""
    scheduler = Scheduler(kube_api, resync_seconds=0.5)
    scheduler.start()
    yield kube_api
    scheduler.stop()


def eventually(check: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def add_node(api: KubeApi, name: str, **spec: Any) -> None:
    api.request("POST", "/api/v1/nodes", body={"metadata": node(name)["metadata"], "spec": spec})
    api.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        body={"status": node(name)["status"]},
        content_type=MERGE_PATCH,
    )


def create_pod(api: KubeApi, name: str) -> None:
    manifest = {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    api.request("POST", "/api/v1/namespaces/default/pods", body=manifest)


def read_pod(api: KubeApi, name: str) -> JsonObject:
    return api.request("GET", f"/api/v1/namespaces/default/pods/{name}")


def test_pods_are_bound_one_per_node_through_the_binding_subresource(api: KubeApi) -> None:
    for name in ("n1", "n2", "n3"):
        add_node(api, name)
    for name in ("a", "b", "c"):
        create_pod(api, name)

    nodes = eventually(
        lambda: (
            all(read_pod(api, p)["spec"].get("nodeName") for p in "abc")
            and sorted(read_pod(api, p)["spec"]["nodeName"] for p in "abc")
        )
    )

    assert nodes == ["n1", "n2", "n3"]
    scheduled = read_pod(api, "a")["status"]["conditions"][0]
    assert (scheduled["type"], scheduled["status"]) == ("PodScheduled", "True")


def test_a_pod_no_node_fits_waits_unschedulable_until_one_does(api: KubeApi) -> None:
    add_node(api, "n1", unschedulable=True)
    create_pod(api, "p")

    def unschedulable() -> JsonObject | None:
        conditions = read_pod(api, "p")["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    condition = eventually(unschedulable)
    events = eventually(
        lambda: api.request(
            "GET",
            "/api/v1/namespaces/default/events",
            query={"fieldSelector": "involvedObject.name=p"},
        )["items"]
    )
    api.request(
        "PATCH",
        "/api/v1/nodes/n1",
        body={"spec": {"unschedulable": None}},
        content_type=MERGE_PATCH,
    )
    bound = eventually(lambda: read_pod(api, "p")["spec"].get("nodeName"))

    message = (
        "0/1 nodes are available: 1 node(s) were unschedulable. preemption: 0/1 nodes are "
        "available: 1 Preemption is not helpful for scheduling."
    )
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "Unschedulable",
        message,
    )
    assert [(e["type"], e["reason"], e["message"]) for e in events] == [
        ("Warning", "FailedScheduling", message)
    ]
    assert events[0]["source"] == {"component": "default-scheduler"}
    assert read_pod(api, "p")["status"]["phase"] == "Pending"
    assert bound == "n1"
