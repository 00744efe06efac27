"""API server semantics that controllers rely on, over plain HTTP: resourceVersions and watch
resumption, optimistic concurrency, finalizers, garbage collection, Status errors."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.devstack.apiserver.conftest import Api

WIDGETS = "/apis/example.smoothscale.io/v1/namespaces/default/widgets"
PODS = "/api/v1/namespaces/default/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


def widget(name: str, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.smoothscale.io/v1",
        "kind": "Widget",
        "metadata": {"name": name, **metadata},
        "spec": {"color": "red"},
    }


def pod(name: str, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def create(api: Api, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = api.request("POST", path, json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def watch_events(api: Api, path: str, timeout: int = 1, **params: str) -> list[dict[str, Any]]:
    """Every event of a watch that the server ends after `timeout` seconds."""
    response = api.request(
        "GET", path, params={"watch": "1", "timeoutSeconds": str(timeout), **params}, stream=True
    )
    return [json.loads(line) for line in response.iter_lines() if line]


def test_a_watch_resumed_from_a_resource_version_sees_exactly_the_later_changes(api: Api) -> None:
    first = create(api, WIDGETS, widget("a"))
    since = first["metadata"]["resourceVersion"]
    create(api, WIDGETS, widget("b"))
    api.request("PATCH", f"{WIDGETS}/a", headers=MERGE, json={"spec": {"replicas": 3}})
    api.request("DELETE", f"{WIDGETS}/b")

    events = watch_events(api, WIDGETS, resourceVersion=since)

    assert [(event["type"], event["object"]["metadata"]["name"]) for event in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [int(event["object"]["metadata"]["resourceVersion"]) for event in events]
    assert versions == sorted(versions)
    assert versions[0] > int(since)


def test_a_watch_without_a_resource_version_starts_with_the_current_objects(api: Api) -> None:
    create(api, WIDGETS, widget("a"))

    events = watch_events(api, WIDGETS)

    assert [(event["type"], event["object"]["metadata"]["name"]) for event in events] == [
        ("ADDED", "a")
    ]


def test_a_watch_from_an_expired_resource_version_gets_410_gone(api: Api) -> None:
    since = create(api, WIDGETS, widget("a"))["metadata"]["resourceVersion"]
    for replicas in range(25):  # the test server keeps the last 20 changes per resource
        api.request("PATCH", f"{WIDGETS}/a", headers=MERGE, json={"spec": {"replicas": replicas}})

    events = watch_events(api, WIDGETS, resourceVersion=since)

    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert "too old resource version" in status["message"]


def test_a_watch_ends_at_its_timeout_with_a_bookmark_when_allowed(api: Api) -> None:
    started = time.monotonic()

    events = watch_events(api, WIDGETS, timeout=1, resourceVersion="1", allowWatchBookmarks="true")

    assert 0.9 <= time.monotonic() - started < 5
    assert [event["type"] for event in events] == ["BOOKMARK"]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > 1


def test_a_watch_with_a_label_selector_reports_objects_entering_and_leaving_it(api: Api) -> None:
    since = create(api, WIDGETS, widget("a"))["metadata"]["resourceVersion"]
    for tier in ("gold", "silver"):
        api.request(
            "PATCH", f"{WIDGETS}/a", headers=MERGE, json={"metadata": {"labels": {"tier": tier}}}
        )

    events = watch_events(api, WIDGETS, resourceVersion=since, labelSelector="tier=gold")

    assert [event["type"] for event in events] == ["ADDED", "DELETED"]


def test_list_filters_by_label_and_field_selectors(api: Api) -> None:
    create(api, PODS, pod("on-node", labels={"app": "x"}))
    create(api, PODS, pod("elsewhere", labels={"app": "y"}))
    api.request(
        "POST", f"{PODS}/on-node/binding", json={"target": {"kind": "Node", "name": "local"}}
    )

    def names(**params: str) -> list[str]:
        items = api.request("GET", PODS, params=params).json()["items"]
        return [item["metadata"]["name"] for item in items]

    assert names(labelSelector="app in (x,z)") == ["on-node"]
    assert names(labelSelector="app!=x") == ["elsewhere"]
    assert names(fieldSelector="spec.nodeName=local") == ["on-node"]
    assert names(fieldSelector="metadata.name=elsewhere,status.phase=Pending") == ["elsewhere"]


def test_a_write_with_a_stale_resource_version_is_a_409_conflict(api: Api) -> None:
    stale = create(api, WIDGETS, widget("a"))
    api.request("PATCH", f"{WIDGETS}/a", headers=MERGE, json={"spec": {"replicas": 2}})
    stale["spec"]["replicas"] = 9

    put = api.request("PUT", f"{WIDGETS}/a", json=stale)
    patch = api.request(
        "PATCH",
        f"{WIDGETS}/a",
        headers=MERGE,
        json={
            "metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
            "spec": {"replicas": 9},
        },
    )

    for response in (put, patch):
        assert response.status_code == 409
        assert response.json()["reason"] == "Conflict"
    assert api.request("GET", f"{WIDGETS}/a").json()["spec"]["replicas"] == 2


def test_errors_are_status_objects_with_code_and_reason(api: Api) -> None:
    create(api, WIDGETS, widget("a"))

    duplicate = api.request("POST", WIDGETS, json=widget("a"))
    missing = api.request("GET", f"{WIDGETS}/nothing")
    invalid = api.request("POST", WIDGETS, json={**widget("b"), "spec": {"color": "pink"}})
    no_namespace = api.request("POST", "/api/v1/namespaces/nowhere/pods", json=pod("p"))

    assert (duplicate.status_code, duplicate.json()["reason"]) == (409, "AlreadyExists")
    assert duplicate.json()["message"] == 'widgets.example.smoothscale.io "a" already exists'
    assert (missing.status_code, missing.json()["reason"]) == (404, "NotFound")
    assert (invalid.status_code, invalid.json()["reason"]) == (422, "Invalid")
    assert "spec.color" in [cause["field"] for cause in invalid.json()["details"]["causes"]]
    assert no_namespace.json()["message"] == 'namespaces "nowhere" not found'


def test_generation_counts_spec_changes_only(api: Api) -> None:
    create(api, WIDGETS, widget("a"))

    api.request("PATCH", f"{WIDGETS}/a", headers=MERGE, json={"metadata": {"labels": {"x": "y"}}})
    api.request("PATCH", f"{WIDGETS}/a/status", headers=MERGE, json={"status": {"phase": "Up"}})
    after_metadata_and_status = api.request("GET", f"{WIDGETS}/a").json()
    api.request("PATCH", f"{WIDGETS}/a", headers=MERGE, json={"spec": {"color": "blue"}})
    after_spec = api.request("GET", f"{WIDGETS}/a").json()

    assert after_metadata_and_status["metadata"]["generation"] == 1
    assert after_spec["metadata"]["generation"] == 2


def test_a_no_op_write_keeps_the_resource_version(api: Api) -> None:
    created = create(api, WIDGETS, widget("a"))

    same = api.request("PATCH", f"{WIDGETS}/a", headers=MERGE, json={"spec": {"color": "red"}})

    assert same.json()["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_finalizers_hold_a_deleted_object_until_the_last_one_is_removed(api: Api) -> None:
    create(api, WIDGETS, widget("a", finalizers=["example.com/a", "example.com/b"]))

    deleting = api.request("DELETE", f"{WIDGETS}/a")
    marked = api.request("GET", f"{WIDGETS}/a").json()
    adding = api.request(
        "PATCH",
        f"{WIDGETS}/a",
        headers=MERGE,
        json={"metadata": {"finalizers": ["example.com/a", "example.com/b", "new"]}},
    )
    api.request(
        "PATCH", f"{WIDGETS}/a", headers=MERGE, json={"metadata": {"finalizers": ["example.com/b"]}}
    )
    still_there = api.request("GET", f"{WIDGETS}/a")
    api.request("PATCH", f"{WIDGETS}/a", headers=MERGE, json={"metadata": {"finalizers": None}})

    assert deleting.status_code == 202
    assert "deletionTimestamp" in marked["metadata"]
    assert adding.status_code == 422
    assert still_there.status_code == 200
    assert api.request("GET", f"{WIDGETS}/a").status_code == 404


def test_deleting_an_owner_deletes_dependents_that_have_no_other_owner(api: Api) -> None:
    owner = create(api, WIDGETS, widget("owner"))
    other = create(api, WIDGETS, widget("other"))

    def owned_by(*owners: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": o["apiVersion"],
                "kind": o["kind"],
                "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"],
            }
            for o in owners
        ]

    create(api, PODS, pod("only-owner", ownerReferences=owned_by(owner)))
    create(api, PODS, pod("two-owners", ownerReferences=owned_by(owner, other)))

    api.request("DELETE", f"{WIDGETS}/owner")

    assert api.request("GET", f"{PODS}/only-owner").status_code == 404
    assert api.request("GET", f"{PODS}/two-owners").status_code == 200
    api.request("DELETE", f"{WIDGETS}/other")
    assert api.request("GET", f"{PODS}/two-owners").status_code == 404


def test_a_pod_bound_to_a_node_is_deleted_gracefully(api: Api) -> None:
    create(api, PODS, pod("p"))
    bound = api.request(
        "POST", f"{PODS}/p/binding", json={"target": {"kind": "Node", "name": "local"}}
    )
    rebound = api.request(
        "POST", f"{PODS}/p/binding", json={"target": {"kind": "Node", "name": "other"}}
    )

    first = api.request("DELETE", f"{PODS}/p", json={"gracePeriodSeconds": 30})
    api.request("PATCH", f"{PODS}/p/status", headers=MERGE, json={"status": {"phase": "Running"}})
    terminating = api.request("GET", f"{PODS}/p").json()
    final = api.request("DELETE", f"{PODS}/p", params={"gracePeriodSeconds": "0"})

    assert bound.status_code == 201
    assert rebound.status_code == 409
    assert first.status_code == 202
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    assert terminating["status"]["phase"] == "Running"  # the kubelet still reports meanwhile
    assert final.status_code == 200
    assert api.request("GET", f"{PODS}/p").status_code == 404


def test_deleting_a_namespace_deletes_what_is_in_it(api: Api) -> None:
    create(api, "/api/v1/namespaces", {"metadata": {"name": "team"}})
    create(api, "/apis/example.smoothscale.io/v1/namespaces/team/widgets", widget("a"))

    api.request("DELETE", "/api/v1/namespaces/team")

    assert (
        api.request("GET", "/apis/example.smoothscale.io/v1/namespaces/team/widgets/a").status_code
        == 404
    )
    assert api.request("GET", "/api/v1/namespaces/team").status_code == 404


def test_creating_a_crd_serves_its_resource_and_deleting_it_removes_its_objects(api: Api) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"kind": "Gadget", "plural": "gadgets"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    created = create(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    gadget = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}}
    create(api, "/apis/example.com/v1/gadgets", gadget)

    api.request(
        "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.example.com"
    )

    conditions = {c["type"]: c["status"] for c in created["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert api.request("GET", "/apis/example.com/v1").status_code == 404
    assert create(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert api.request("GET", "/apis/example.com/v1/gadgets").json()["items"] == []


@pytest.mark.parametrize(
    ("validation", "status", "kept"),
    [("Strict", 400, None), ("Warn", 201, False), ("Ignore", 201, False)],
)
def test_unknown_fields_follow_the_field_validation_parameter(
    api: Api, validation: str, status: int, kept: bool | None
) -> None:
    body = {**widget("a"), "spec": {"color": "red", "shade": "dark"}}

    response = api.request("POST", WIDGETS, params={"fieldValidation": validation}, json=body)

    assert response.status_code == status
    if kept is not None:
        assert ("shade" in response.json()["spec"]) == kept
    assert ("Warning" in response.headers) == (validation == "Warn")
