"""The eviction subresource and PodDisruptionBudgets, against the API server alone: a budget's
status is written here as the disruption controller would (tests/devstack/test_disruption.py
runs the controller itself), and what the eviction answers is what Kubernetes 1.33 answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from tests.devstack.apiserver.conftest import Api, Kubectl

PODS = "/api/v1/namespaces/default/pods"
BUDGETS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
MERGE = {"Content-Type": "application/merge-patch+json"}
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


def running_pod(api: Api, name: str, *, ready: bool = True, grace: int = 30) -> dict[str, Any]:
    """A pod bound to node n1, Running, Ready or not (as its kubelet would report it)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "terminationGracePeriodSeconds": grace,
        },
    }
    assert api.request("POST", PODS, json=pod).status_code == 201
    binding = {"target": {"kind": "Node", "name": "n1"}}
    assert api.request("POST", f"{PODS}/{name}/binding", json=binding).status_code == 201
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    answer = api.request("PATCH", f"{PODS}/{name}/status", headers=MERGE, json={"status": status})
    assert answer.status_code == 200, answer.text
    updated: dict[str, Any] = answer.json()
    return updated


def budget(api: Api, name: str = "web", *, status: dict[str, Any], **spec: Any) -> None:
    """A budget selecting app=web, with the status the disruption controller would write."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }
    answer = api.request("POST", BUDGETS, json=body)
    assert answer.status_code == 201, answer.text
    counted = {"observedGeneration": 1, **status}
    answer = api.request(
        "PATCH", f"{BUDGETS}/{name}/status", headers=MERGE, json={"status": counted}
    )
    assert answer.status_code == 200, answer.text


def evict(api: Api, name: str, **delete_options: Any) -> requests.Response:
    eviction: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"},
    }
    if delete_options:
        eviction["deleteOptions"] = delete_options
    return api.request("POST", f"{PODS}/{name}/eviction", json=eviction)


def get(api: Api, path: str) -> dict[str, Any]:
    answer = api.request("GET", path)
    assert answer.status_code == 200, answer.text
    obj: dict[str, Any] = answer.json()
    return obj


def test_a_pod_without_a_budget_is_evicted_gracefully_and_marked_as_disrupted(api: Api) -> None:
    running_pod(api, "p", grace=12)

    answer = evict(api, "p")

    assert answer.status_code == 201, answer.text
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    pod = get(api, f"{PODS}/p")  # still there: its kubelet finishes the delete
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 12
    assert "deletionTimestamp" in pod["metadata"]
    target = [c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert target[0]["reason"] == "EvictionByEvictionAPI"
    assert target[0]["message"] == "Eviction API: evicting"


def test_the_grace_period_of_the_delete_options_wins(api: Api) -> None:
    running_pod(api, "p", grace=30)

    assert evict(api, "p", gracePeriodSeconds=3).status_code == 201

    assert get(api, f"{PODS}/p")["metadata"]["deletionGracePeriodSeconds"] == 3


def test_an_eviction_that_would_break_the_budget_is_429_and_names_the_budget(api: Api) -> None:
    running_pod(api, "p")
    running_pod(api, "q")
    budget(
        api,
        minAvailable=2,
        status={"currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2},
    )

    answer = evict(api, "p")

    assert answer.status_code == 429
    assert "Retry-After" not in answer.headers  # kubectl drain retries by itself, every 5 s
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": VIOLATION,
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
                }
            ]
        },
        "code": 429,
    }
    assert "deletionTimestamp" not in get(api, f"{PODS}/p")["metadata"]


def test_an_allowed_eviction_spends_the_budget_so_the_next_one_waits(api: Api) -> None:
    running_pod(api, "p")
    running_pod(api, "q")
    budget(
        api,
        maxUnavailable=1,
        status={
            "currentHealthy": 2,
            "desiredHealthy": 1,
            "expectedPods": 2,
            "disruptionsAllowed": 1,
        },
    )

    assert evict(api, "p").status_code == 201
    status = get(api, f"{BUDGETS}/web")["status"]
    second = evict(api, "q")

    assert status["disruptionsAllowed"] == 0
    assert list(status["disruptedPods"]) == ["p"]
    assert status["conditions"][-1]["type"] == "DisruptionAllowed"
    assert status["conditions"][-1]["status"] == "False"
    assert status["conditions"][-1]["reason"] == "InsufficientPods"
    assert second.status_code == 429
    assert "deletionTimestamp" not in get(api, f"{PODS}/q")["metadata"]


def test_a_budget_changed_since_it_was_counted_is_429_with_retry_after(api: Api) -> None:
    running_pod(api, "p")
    budget(api, minAvailable=0, status={"currentHealthy": 1, "disruptionsAllowed": 1})
    api.request("PATCH", f"{BUDGETS}/web", headers=MERGE, json={"spec": {"minAvailable": 1}})

    answer = evict(api, "p")

    assert answer.status_code == 429
    assert answer.headers["Retry-After"] == "10"
    assert answer.json()["details"] == {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget web is still being processed by the server.",
            }
        ],
        "retryAfterSeconds": 10,
    }


def test_pending_pods_and_unready_pods_of_a_healthy_app_go_without_spending_the_budget(
    api: Api,
) -> None:
    pending = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pending", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    api.request("POST", PODS, json=pending)
    running_pod(api, "unready", ready=False)
    running_pod(api, "ready")
    counted = {"currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 3}
    budget(api, minAvailable=1, status=counted)

    assert evict(api, "pending").status_code == 201
    assert evict(api, "unready").status_code == 201
    assert evict(api, "ready").status_code == 429
    assert api.request("GET", f"{PODS}/pending").status_code == 404  # unbound: gone at once
    assert get(api, f"{BUDGETS}/web")["status"]["disruptionsAllowed"] == 0
    assert "disruptedPods" not in get(api, f"{BUDGETS}/web")["status"]


def test_a_pod_selected_by_two_budgets_cannot_be_evicted(api: Api) -> None:
    running_pod(api, "p")
    budget(api, "one", minAvailable=0, status={"currentHealthy": 1, "disruptionsAllowed": 1})
    budget(api, "two", minAvailable=0, status={"currentHealthy": 1, "disruptionsAllowed": 1})

    answer = evict(api, "p")

    assert answer.status_code == 500
    assert answer.json()["message"] == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
        "not support."
    )


def test_a_dry_run_eviction_changes_nothing(api: Api) -> None:
    running_pod(api, "p")
    budget(api, minAvailable=0, status={"currentHealthy": 1, "disruptionsAllowed": 1})

    assert evict(api, "p", dryRun=["All"]).status_code == 201

    assert "deletionTimestamp" not in get(api, f"{PODS}/p")["metadata"]
    assert get(api, f"{BUDGETS}/web")["status"]["disruptionsAllowed"] == 1


def test_evictions_that_make_no_sense_are_refused_like_kubernetes(api: Api) -> None:
    running_pod(api, "p")
    wrong_name = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "q"}}

    mismatch = api.request("POST", f"{PODS}/p/eviction", json=wrong_name)
    missing = evict(api, "nobody")
    stale = evict(api, "p", preconditions={"uid": "not-its-uid"})
    listed = api.request("GET", f"{PODS}/p/eviction")

    assert (mismatch.status_code, mismatch.json()["message"]) == (
        400,
        "name in URL does not match name in Eviction object",
    )
    assert (missing.status_code, missing.json()["message"]) == (404, 'pods "nobody" not found')
    assert stale.status_code == 409
    assert listed.status_code == 405


def _length_delimited(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_an_eviction_sent_as_protobuf_is_read_like_kubectl_drain_sends_it(api: Api) -> None:
    running_pod(api, "p")
    type_meta = _length_delimited(1, b"policy/v1") + _length_delimited(2, b"Eviction")
    meta = _length_delimited(1, b"p") + _length_delimited(3, b"default")
    delete_options = bytes([1 << 3, 4])  # gracePeriodSeconds: 4
    eviction = _length_delimited(1, meta) + _length_delimited(2, delete_options)
    body = b"k8s\x00" + _length_delimited(1, type_meta) + _length_delimited(2, eviction)

    answer = api.request(
        "POST",
        f"{PODS}/p/eviction",
        data=body,
        headers={"Content-Type": "application/vnd.kubernetes.protobuf"},
    )

    assert answer.status_code == 201, answer.text
    assert get(api, f"{PODS}/p")["metadata"]["deletionGracePeriodSeconds"] == 4


def test_discovery_offers_policy_v1_evictions_which_is_what_kubectl_drain_asks(
    api: Api,
) -> None:
    resources = get(api, "/api/v1")["resources"]

    eviction = next(r for r in resources if r["name"] == "pods/eviction")

    assert (eviction["group"], eviction["version"], eviction["kind"]) == (
        "policy",
        "v1",
        "Eviction",
    )
    assert eviction["verbs"] == ["create"]


def test_kubectl_creates_budgets_and_shows_their_allowed_disruptions(
    api: Api, kubectl: Kubectl
) -> None:
    kubectl("create", "poddisruptionbudget", "web", "--selector=app=web", "--min-available=1")
    kubectl("create", "pdb", "db", "--selector=app=db", "--max-unavailable=25%")
    counted = {"observedGeneration": 1, "currentHealthy": 3, "disruptionsAllowed": 2}
    api.request("PATCH", f"{BUDGETS}/web/status", headers=MERGE, json={"status": counted})

    table = kubectl("get", "pdb").splitlines()
    created = kubectl.json("get", "pdb", "db")

    assert table[0].split() == [
        "NAME",
        "MIN",
        "AVAILABLE",
        "MAX",
        "UNAVAILABLE",
        "ALLOWED",
        "DISRUPTIONS",
        "AGE",
    ]
    assert table[1].split()[:4] == ["db", "N/A", "25%", "0"]
    assert table[2].split()[:4] == ["web", "1", "N/A", "2"]
    assert created["spec"] == {"maxUnavailable": "25%", "selector": {"matchLabels": {"app": "db"}}}
    assert created["status"] == {
        "currentHealthy": 0,
        "desiredHealthy": 0,
        "disruptionsAllowed": 0,
        "expectedPods": 0,
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"minAvailable": 1, "maxUnavailable": 1},
            "minAvailable and maxUnavailable cannot be both set",
        ),
        ({"minAvailable": "120%"}, 'spec.minAvailable: Invalid value: "120%": must not be '),
        ({"maxUnavailable": -1}, "spec.maxUnavailable: Invalid value: -1: must be greater than"),
        ({"maxUnavailable": "half"}, "must be an integer or percentage (e.g '5%')"),
    ],
)
def test_an_invalid_budget_is_refused(api: Api, spec: dict[str, Any], message: str) -> None:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }

    answer = api.request("POST", BUDGETS, data=json.dumps(body))

    assert answer.status_code == 422
    assert message in answer.json()["message"]


def test_kubectl_cordon_and_uncordon_mark_the_node_unschedulable(
    api: Api, kubectl: Kubectl
) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    api.request("POST", "/api/v1/nodes", json=node)
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    api.request("PATCH", "/api/v1/nodes/n1/status", headers=MERGE, json={"status": ready})

    cordoned = kubectl("cordon", "n1")
    status_cordoned = kubectl("get", "nodes").splitlines()[1].split()[1]
    unschedulable = get(api, "/api/v1/nodes/n1")["spec"]
    uncordoned = kubectl("uncordon", "n1")
    status_uncordoned = kubectl("get", "nodes").splitlines()[1].split()[1]

    assert cordoned.strip() == "node/n1 cordoned"
    assert unschedulable == {"unschedulable": True}
    assert status_cordoned == "Ready,SchedulingDisabled"
    assert uncordoned.strip() == "node/n1 uncordoned"
    assert get(api, "/api/v1/nodes/n1")["spec"] == {}  # kubectl sends unschedulable: null
    assert status_uncordoned == "Ready"
