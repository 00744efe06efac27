"""Injected API trouble: the next matching requests get a real API server's error, once each."""

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


def test_a_watch_can_be_told_its_resource_version_expired(api: Api) -> None:
    fault = {"code": 410, "count": 2, "watch": True}
    assert api.request("POST", "/smoothscale.dev/faults", json=[fault]).ok
    listed = api.request("GET", "/api/v1/namespaces")
    assert listed.status_code == 200, "a list is no watch"
    gone = api.request("GET", "/api/v1/namespaces", params={"watch": "true"})
    assert gone.status_code == 410
    assert gone.json()["reason"] == "Expired"


def test_a_fault_the_server_cannot_give_is_refused_with_the_reason(api: Api) -> None:
    answer = api.request("POST", "/smoothscale.dev/faults", json=[{"code": 418}])
    assert answer.status_code == 400
    assert "418" in answer.json()["message"]
