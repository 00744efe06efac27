"""Who sends a request, and what they may do: ServiceAccount tokens, RBAC and the audit log.

A request without credentials comes from the cluster's admin (the kubeconfig `smoothscale dev
up` writes has none) and may do everything, as before. A request with a bearer token is a
ServiceAccount's: the token must be one this server issued through the TokenRequest API
(`serviceaccounts/NAME/token`, what `kubectl create token` and the kubelet ask for) for a
ServiceAccount that still exists, else 401. Its resource requests are then authorized as
Kubernetes' RBAC authorizer does: the rules of the Roles and ClusterRoles bound to it by
RoleBindings (in the request's namespace) and ClusterRoleBindings (everywhere), with verbs, API
groups, resources, subresources ("pods/status") and resourceNames; anything no rule allows is
403 Forbidden with Kubernetes' message. Discovery and other non-resource paths are open to every
authenticated user, as the default system:discovery ClusterRole makes them.

Every decision on a ServiceAccount's resource request is written to the audit log as an
audit.k8s.io/v1 Event (level Metadata, JSON lines), the format a real API server writes with
--audit-log-path, so what an operator did can be compared with what its RBAC grants.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devstack.apiserver.errors import ApiError, JsonObject
from devstack.apiserver.registry import RBAC_GROUP

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
DEFAULT_TOKEN_SECONDS = 3600
AUDIT_API_VERSION = "audit.k8s.io/v1"


@dataclass(frozen=True)
class User:
    """An authenticated user: its name and groups, as the RBAC subjects name them."""

    name: str
    groups: tuple[str, ...]

    @classmethod
    def service_account(cls, namespace: str, name: str) -> User:
        return cls(
            f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
            (
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ),
        )


@dataclass(frozen=True)
class Attributes:
    """What a resource request asks to do, in the terms of an RBAC rule."""

    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    namespace: str
    name: str
    path: str = ""

    @property
    def qualified_resource(self) -> str:
        """The resource a rule names: "pods", or "pods/status" for a subresource."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(user: User, attributes: Attributes, reason: str = "") -> ApiError:
    """403 in the API server's words: 'pods "p" is forbidden: User "..." cannot get resource
    "pods" in API group "" in the namespace "shop"'."""
    where = (
        f'in the namespace "{attributes.namespace}"'
        if attributes.namespace
        else "at the cluster scope"
    )
    why = (
        f'User "{user.name}" cannot {attributes.verb} resource '
        f'"{attributes.qualified_resource}" in API group "{attributes.group}" {where}'
    )
    if reason:
        why += f": {reason}"
    resource = (
        f"{attributes.resource}.{attributes.group}" if attributes.group else attributes.resource
    )
    subject = f'{resource} "{attributes.name}"' if attributes.name else resource
    return ApiError(
        403,
        "Forbidden",
        f"{subject} is forbidden: {why}",
        {"name": attributes.name, "group": attributes.group, "kind": attributes.resource},
    )


# -- tokens ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Grant:
    namespace: str
    name: str
    uid: str
    expires: float


class Tokens:
    """The ServiceAccount tokens this server issued (opaque, in memory, with an expiry)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._grants: dict[str, _Grant] = {}
        self._clock = clock

    def issue(self, service_account: JsonObject, seconds: int) -> tuple[str, float]:
        """A new token for this ServiceAccount object; returns it and its expiry (epoch)."""
        meta = service_account["metadata"]
        token = "smoothscale-sa." + secrets.token_urlsafe(32)
        expires = self._clock() + seconds
        self._grants[token] = _Grant(meta["namespace"], meta["name"], meta["uid"], expires)
        return token, expires

    def user_of(self, token: str, service_account_uid: Callable[[str, str], str | None]) -> User:
        """The ServiceAccount a token was issued to; 401 when it is unknown, expired, or its
        ServiceAccount was deleted since (`service_account_uid` looks the current one up)."""
        grant = self._grants.get(token)
        if grant is None or grant.expires < self._clock():
            raise unauthorized()
        if service_account_uid(grant.namespace, grant.name) != grant.uid:
            raise unauthorized()
        return User.service_account(grant.namespace, grant.name)


def token_request_response(
    service_account: JsonObject, request: JsonObject, token: str, expires: float
) -> JsonObject:
    """The TokenRequest the API server answers `serviceaccounts/NAME/token` with."""
    meta = service_account["metadata"]
    spec = dict(request.get("spec") or {})
    spec.setdefault("audiences", [])
    spec.setdefault("expirationSeconds", DEFAULT_TOKEN_SECONDS)
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": spec,
        "status": {
            "token": token,
            "expirationTimestamp": datetime.fromtimestamp(expires, UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        },
    }


# -- RBAC -----------------------------------------------------------------------------------

ObjectsOf = Callable[[str, str | None], list[JsonObject]]
"""(RBAC plural, namespace or None for all) -> the stored objects."""


def _subject_matches(subject: JsonObject, user: User) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        wanted = f"{SERVICE_ACCOUNT_PREFIX}{subject.get('namespace', '')}:{subject.get('name')}"
        return wanted == user.name
    if kind == "User":
        return bool(subject.get("name") == user.name)
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


def rule_allows(rule: JsonObject, attributes: Attributes) -> bool:
    """Whether one PolicyRule allows a resource request, as Kubernetes' RBAC matches it."""

    def has(values: Iterable[str], wanted: str) -> bool:
        listed = list(values or [])
        return "*" in listed or wanted in listed

    resources = list(rule.get("resources") or [])
    if attributes.subresource:
        resource_ok = (
            "*" in resources
            or attributes.qualified_resource in resources
            or f"*/{attributes.subresource}" in resources
        )
    else:
        resource_ok = "*" in resources or attributes.resource in resources
    names = list(rule.get("resourceNames") or [])
    return (
        has(rule.get("verbs") or [], attributes.verb)
        and has(rule.get("apiGroups") or [], attributes.group)
        and resource_ok
        and (not names or attributes.name in names)
    )


class Authorizer:
    """RBAC over the RBAC objects in the store."""

    def __init__(self, objects_of: ObjectsOf) -> None:
        self._objects_of = objects_of

    def _role_rules(self, ref: JsonObject, namespace: str, errors: list[str]) -> list[JsonObject]:
        kind, name = ref.get("kind"), ref.get("name")
        plural = "clusterroles" if kind == "ClusterRole" else "roles"
        scope = None if kind == "ClusterRole" else namespace
        for role in self._objects_of(plural, scope):
            if role["metadata"]["name"] == name:
                return list(role.get("rules") or [])
        errors.append(f'{str(kind).lower()}.{RBAC_GROUP} "{name}" not found')
        return []

    def bound_rules(
        self, user: User, namespace: str
    ) -> tuple[list[tuple[JsonObject, JsonObject]], list[str]]:
        """(binding, rule) for every rule bound to `user` that applies in `namespace` ("" for
        cluster-scoped requests): ClusterRoleBindings everywhere, RoleBindings in their own
        namespace; and the errors met (a binding whose role does not exist)."""
        errors: list[str] = []
        bindings = [("", binding) for binding in self._objects_of("clusterrolebindings", None)]
        if namespace:
            bindings += [(namespace, b) for b in self._objects_of("rolebindings", namespace)]
        rules = []
        for binding_namespace, binding in bindings:
            if not any(_subject_matches(s, user) for s in binding.get("subjects") or []):
                continue
            role_ref = binding.get("roleRef") or {}
            for rule in self._role_rules(role_ref, binding_namespace, errors):
                rules.append((binding, rule))
        return rules, errors

    def authorize(self, user: User, attributes: Attributes) -> None:
        """Return if some bound rule allows the request; raise 403 otherwise."""
        rules, errors = self.bound_rules(user, attributes.namespace)
        if any(rule_allows(rule, attributes) for _binding, rule in rules):
            return
        reason = ""
        if errors:
            joined = ", ".join(errors)
            reason = f"RBAC: {joined if len(errors) == 1 else '[' + joined + ']'}"
        raise forbidden(user, attributes, reason)


# -- the audit log --------------------------------------------------------------------------


class AuditLog:
    """Appends one audit.k8s.io/v1 Event (level Metadata) per authorization decision."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, user: User, attributes: Attributes, allowed: bool, reason: str = "") -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        object_ref: JsonObject = {
            "resource": attributes.resource,
            "namespace": attributes.namespace,
            "name": attributes.name,
            "apiGroup": attributes.group,
            "apiVersion": attributes.version,
        }
        if attributes.subresource:
            object_ref["subresource"] = attributes.subresource
        event: JsonObject = {
            "kind": "Event",
            "apiVersion": AUDIT_API_VERSION,
            "level": "Metadata",
            "auditID": secrets.token_hex(16),
            "stage": "ResponseComplete",
            "requestURI": attributes.path,
            "verb": attributes.verb,
            "user": {"username": user.name, "groups": list(user.groups)},
            "objectRef": {key: value for key, value in object_ref.items() if value},
            "responseStatus": {"metadata": {}, "code": 200 if allowed else 403},
            "requestReceivedTimestamp": stamp,
            "stageTimestamp": stamp,
            "annotations": {
                "authorization.k8s.io/decision": "allow" if allowed else "forbid",
                "authorization.k8s.io/reason": reason,
            },
        }
        line = json.dumps(event) + "\n"
        with self._lock, self.path.open("a") as log:
            log.write(line)


@dataclass(frozen=True)
class AuditedRequest:
    """One authorization decision read back from an audit log."""

    user: str
    attributes: Attributes
    allowed: bool


def read_audit_log(path: Path) -> list[AuditedRequest]:
    """The decisions in an audit log (ours, or a real API server's at level Metadata or more)."""
    requests: list[AuditedRequest] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        event: dict[str, Any] = json.loads(line)
        ref = event.get("objectRef")
        if ref is None or event.get("stage", "ResponseComplete") != "ResponseComplete":
            continue
        decision = (event.get("annotations") or {}).get("authorization.k8s.io/decision")
        requests.append(
            AuditedRequest(
                user=event["user"]["username"],
                attributes=Attributes(
                    verb=event["verb"],
                    group=ref.get("apiGroup", ""),
                    version=ref.get("apiVersion", ""),
                    resource=ref.get("resource", ""),
                    subresource=ref.get("subresource", ""),
                    namespace=ref.get("namespace", ""),
                    name=ref.get("name", ""),
                    path=event.get("requestURI", ""),
                ),
                allowed=decision == "allow",
            )
        )
    return requests
