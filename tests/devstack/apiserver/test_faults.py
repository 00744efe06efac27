"""Injected API trouble: the next matching requests get a real API server's error, once each."""

import json
import time

import requests

from tests.devstack.apiserver.conftest import Api, Kubectl


def test_an_injected_conflict_answers_the_next_matching_request_once(
    api: Api, kubectl: Kubectl
) -> None:
    kubectl("create", "configmap", "settings", "--from-literal=a=1")
    fault = {"code": 409, "count": 1, "method": "PATCH", "path": "/configmaps/settings"}
    assert api.request("POST", "/smoothscale.dev/faults", json=[fault]).ok

    refused = kubectl.run("label", "configmap", "settings", "x=1")
    assert refused.returncode != 0
    assert "the object has been modified" in refused.stderr
    kubectl("label", "configmap", "settings", "x=1")  # the next one goes through
    kubectl("get", "configmap", "settings")  # other requests never matched

    report = api.request("GET", "/smoothscale.dev/faults").json()
    assert report == {"injected": {"409": 1}, "pending": 0}


def expired(answer: requests.Response) -> bool:
    """Whether a watch was told its resourceVersion expired as a real server tells it: a 200
    stream with one ERROR event carrying a 410 Status (never a 410 answer, which clients such
    as kopf take for a failure of the request)."""
    events = [json.loads(line) for line in answer.text.splitlines() if line]
    return answer.status_code == 200 and [(e["type"], e["object"]["code"]) for e in events] == [
        ("ERROR", 410)
    ]


def test_a_watch_can_be_told_its_resource_version_expired(api: Api) -> None:
    fault = {"code": 410, "count": 2, "watch": True}
    assert api.request("POST", "/smoothscale.dev/faults", json=[fault]).ok
    listed = api.request("GET", "/api/v1/namespaces")
    assert listed.status_code == 200, "a list is no watch"
    assert "items" in listed.json()
    gone = api.request("GET", "/api/v1/namespaces", params={"watch": "true"})
    assert expired(gone), gone.text
    assert json.loads(gone.text)["object"]["reason"] == "Expired"


def test_a_fault_the_server_cannot_give_is_refused_with_the_reason(api: Api) -> None:
    answer = api.request("POST", "/smoothscale.dev/faults", json=[{"code": 418}])
    assert answer.status_code == 400
    assert "418" in answer.json()["message"]


def namespace_reader(kubectl: Kubectl, name: str) -> dict[str, str]:
    """A ServiceAccount `name` that may list and watch namespaces: its requests' headers."""
    kubectl("create", "serviceaccount", name)
    rbac = (
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n"
        f"metadata: {{name: {name}-namespaces}}\n"
        "rules: [{apiGroups: [''], resources: [namespaces], verbs: [list, watch]}]\n"
        "---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n"
        f"metadata: {{name: {name}}}\n"
        "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, "
        f"name: {name}-namespaces}}\n"
        f"subjects: [{{kind: ServiceAccount, name: {name}, namespace: default}}]\n"
    )
    kubectl("apply", "-f", "-", stdin=rbac)
    return {"Authorization": f"Bearer {kubectl('create', 'token', name).strip()}"}


def test_a_watch_fault_ends_the_open_watches_it_matches_so_they_meet_it(
    api: Api, kubectl: Kubectl
) -> None:
    as_watcher = namespace_reader(kubectl, "watcher")
    version = api.request("GET", "/api/v1/namespaces").json()["metadata"]["resourceVersion"]
    watch = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "60"}
    started = time.monotonic()
    with (
        requests.get(
            f"{api.url}/api/v1/namespaces", params=watch, headers=as_watcher, stream=True,
            timeout=30,
        ) as theirs,
        requests.get(
            f"{api.url}/api/v1/namespaces", params={**watch, "timeoutSeconds": "3"},
            stream=True, timeout=30,
        ) as admins,
    ):  # fmt: skip
        assert theirs.status_code == admins.status_code == 200
        fault = {"code": 410, "count": 1, "watch": True, "user": "system:serviceaccount:"}
        assert api.request("POST", "/smoothscale.dev/faults", json=[fault]).ok
        assert b"".join(theirs.iter_content()) == b"", "ended at once, with no event"
        ended = time.monotonic() - started
        assert b"".join(admins.iter_content()) == b"", "the admin's ran to its own timeout"
        assert time.monotonic() - started >= 3 > ended
    again = api.request("GET", "/api/v1/namespaces", params=watch, headers=as_watcher)
    assert expired(again), again.text


def test_a_fault_for_one_user_passes_over_the_requests_of_others(
    api: Api, kubectl: Kubectl
) -> None:
    as_operator = namespace_reader(kubectl, "operator")
    fault = {"code": 503, "count": 1, "path": "/namespaces", "user": "system:serviceaccount:"}
    assert api.request("POST", "/smoothscale.dev/faults", json=[fault]).ok

    kubectl("get", "namespaces")  # the admin's kubectl: not the user the fault is for
    refused = api.request("GET", "/api/v1/namespaces", headers=as_operator)
    assert refused.status_code == 503
    assert api.request("GET", "/api/v1/namespaces", headers=as_operator).status_code == 200
    assert api.request("GET", "/smoothscale.dev/faults").json() == {
        "injected": {"503": 1},
        "pending": 0,
    }
