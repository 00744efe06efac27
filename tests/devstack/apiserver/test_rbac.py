"""ServiceAccount tokens and RBAC: a ServiceAccount may do what its bound roles allow, and
nothing else, with Kubernetes' 403 message; the admin (no token) may do everything."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from devstack.apiserver import LocalApiServer, write_kubeconfig
from devstack.apiserver.auth import read_audit_log
from tests.devstack.apiserver.conftest import CRD_PATHS, Kubectl

USER = "system:serviceaccount:shop:operator"


@pytest.fixture
def audited(tmp_path: Path) -> Iterator[tuple[LocalApiServer, Path]]:
    audit_log = tmp_path / "audit.log"
    with LocalApiServer(crd_paths=CRD_PATHS, audit_log=audit_log) as running:
        yield running, audit_log


@pytest.fixture
def admin(audited: tuple[LocalApiServer, Path], tmp_path: Path) -> Kubectl:
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, audited[0].url)
    kubectl = Kubectl(kubeconfig=kubeconfig, cache=tmp_path / "kube-cache")
    kubectl("create", "namespace", "shop")
    kubectl("create", "namespace", "other")
    kubectl("create", "serviceaccount", "operator", "-n", "shop")
    return kubectl


@pytest.fixture
def token(admin: Kubectl) -> str:
    return admin("create", "token", "operator", "-n", "shop").strip()


class Account:
    """Requests with the ServiceAccount's token (kubectl sends no token over plain HTTP)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token

    def __call__(self, method: str, path: str, body: str | None = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        return requests.request(method, self.url + path, data=body, headers=headers, timeout=10)

    def message(self, method: str, path: str) -> str:
        answer = self(method, path)
        assert answer.status_code == 403, answer.text
        assert answer.json()["reason"] == "Forbidden"
        message: str = answer.json()["message"]
        return message


@pytest.fixture
def account(audited: tuple[LocalApiServer, Path], token: str) -> Account:
    return Account(audited[0].url, token)


def apply(admin: Kubectl, *objects: dict[str, Any]) -> None:
    for obj in objects:
        admin("apply", "-f", "-", stdin=json.dumps(obj))


def role(name: str, namespace: str | None, *rules: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role" if namespace else "ClusterRole",
        "metadata": meta,
        "rules": list(rules),
    }


def binding(name: str, namespace: str | None, role_kind: str, role_name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": "shop"}],
    }


def rule(groups: list[str], resources: list[str], verbs: list[str], **more: Any) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **more}


def test_a_service_account_without_roles_is_forbidden_with_kubernetes_message(
    admin: Kubectl, account: Account
) -> None:
    assert account.message("GET", "/api/v1/namespaces/shop/pods") == (
        f'pods is forbidden: User "{USER}" cannot list resource "pods" in API group "" in the '
        'namespace "shop"'
    )
    assert account.message("GET", "/api/v1/namespaces/shop/secrets/kafka") == (
        f'secrets "kafka" is forbidden: User "{USER}" cannot get resource "secrets" in API group '
        '"" in the namespace "shop"'
    )
    assert account.message("GET", "/api/v1/namespaces") == (
        f'namespaces is forbidden: User "{USER}" cannot list resource "namespaces" in API group '
        '"" at the cluster scope'
    )
    assert admin("get", "pods", "-n", "shop", "-o", "name") == ""  # the admin may


def test_a_role_bound_in_a_namespace_allows_its_verbs_there_only(
    admin: Kubectl, account: Account
) -> None:
    apply(
        admin,
        role("reader", "shop", rule([""], ["pods"], ["get", "list"])),
        binding("reader", "shop", "Role", "reader"),
    )

    assert account("GET", "/api/v1/namespaces/shop/pods").ok
    assert account("GET", "/api/v1/namespaces/other/pods").status_code == 403
    assert account("GET", "/api/v1/pods").status_code == 403
    deleted = account.message("DELETE", "/api/v1/namespaces/shop/pods/p")
    assert 'cannot delete resource "pods"' in deleted


def test_subresources_and_resource_names_must_each_match(admin: Kubectl, account: Account) -> None:
    apply(
        admin,
        role(
            "status-writer",
            "shop",
            rule(["smoothscale.io"], ["streamingapps/status"], ["patch"]),
            rule([""], ["secrets"], ["get"], resourceNames=["kafka"]),
        ),
        binding("status-writer", "shop", "Role", "status-writer"),
    )
    admin("create", "secret", "generic", "kafka", "-n", "shop", "--from-literal=k=v")
    admin("create", "secret", "generic", "other", "-n", "shop", "--from-literal=k=v")
    app = "/apis/smoothscale.io/v1alpha1/namespaces/shop/streamingapps/counts"

    assert account.message("PATCH", app) == (
        f'streamingapps.smoothscale.io "counts" is forbidden: User "{USER}" cannot patch '
        'resource "streamingapps" in API group "smoothscale.io" in the namespace "shop"'
    )
    assert account("PATCH", app + "/status", "{}").status_code == 404  # allowed; no such app
    assert account("GET", "/api/v1/namespaces/shop/secrets/kafka").ok
    assert account("GET", "/api/v1/namespaces/shop/secrets/other").status_code == 403
    assert account("GET", "/api/v1/namespaces/shop/secrets").status_code == 403


def test_a_cluster_role_binding_allows_everywhere_a_role_binding_to_it_in_one_namespace(
    admin: Kubectl, account: Account
) -> None:
    apply(admin, role("pod-reader", None, rule([""], ["pods"], ["list"])))
    apply(admin, binding("local", "other", "ClusterRole", "pod-reader"))

    assert account("GET", "/api/v1/namespaces/other/pods").ok
    assert account("GET", "/api/v1/namespaces/shop/pods").status_code == 403
    assert account("GET", "/api/v1/pods").status_code == 403

    apply(admin, binding("everywhere", None, "ClusterRole", "pod-reader"))
    assert account("GET", "/api/v1/pods").ok
    assert account("GET", "/api/v1/namespaces/shop/pods").ok


def test_a_binding_to_a_missing_role_says_so(admin: Kubectl, account: Account) -> None:
    apply(admin, binding("dangling", "shop", "Role", "ghost"))

    assert account.message("GET", "/api/v1/namespaces/shop/pods").endswith(
        ': RBAC: role.rbac.authorization.k8s.io "ghost" not found'
    )


def test_tokens_of_unknown_or_deleted_service_accounts_are_unauthorized(
    admin: Kubectl, account: Account
) -> None:
    forged = Account(account.url, "forged")("GET", "/api/v1/namespaces/shop/pods")
    admin("delete", "serviceaccount", "operator", "-n", "shop")
    stale = account("GET", "/api/v1/namespaces/shop/pods")

    assert (forged.status_code, forged.json()["reason"]) == (401, "Unauthorized")
    assert stale.status_code == 401


def test_discovery_is_open_to_every_service_account(account: Account) -> None:
    for path in ("/api", "/apis", "/api/v1", "/apis/smoothscale.io/v1alpha1", "/version"):
        assert account("GET", path).ok, path


def test_bindings_keep_their_role_ref(admin: Kubectl) -> None:
    apply(admin, binding("b", "shop", "Role", "first"))

    changed = admin.run(
        "apply", "-f", "-", stdin=json.dumps(binding("b", "shop", "Role", "second"))
    )

    assert "cannot change roleRef" in changed.stderr


def test_every_decision_on_a_service_account_request_is_audited(
    admin: Kubectl, account: Account, audited: tuple[LocalApiServer, Path]
) -> None:
    apply(
        admin,
        role("reader", "shop", rule([""], ["pods"], ["list"])),
        binding("reader", "shop", "Role", "reader"),
    )
    account("GET", "/api/v1/namespaces/shop/pods")
    account("GET", "/api/v1/namespaces/shop/configmaps")

    decisions = [
        (r.user, r.attributes.verb, r.attributes.resource, r.attributes.namespace, r.allowed)
        for r in read_audit_log(audited[1])
    ]

    assert decisions == [
        (USER, "list", "pods", "shop", True),
        (USER, "list", "configmaps", "shop", False),
    ]


def test_evicting_a_pod_needs_create_on_pods_eviction_not_delete_on_pods(
    admin: Kubectl, account: Account
) -> None:
    deleter = rule([""], ["pods"], ["delete"])
    apply(admin, role("evicter", "shop", deleter), binding("evicter", "shop", "Role", "evicter"))
    eviction = json.dumps(
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}}
    )
    path = "/api/v1/namespaces/shop/pods/p/eviction"

    refused = account("POST", path, eviction)
    apply(admin, role("evicter", "shop", deleter, rule([""], ["pods/eviction"], ["create"])))
    allowed = account("POST", path, eviction)

    assert refused.status_code == 403
    assert refused.json()["message"] == (
        f'pods "p" is forbidden: User "{USER}" cannot create resource "pods/eviction" in API '
        'group "" in the namespace "shop"'
    )
    assert allowed.status_code == 404  # allowed; there is no such pod
