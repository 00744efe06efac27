"""API discovery (the legacy, unaggregated format; kubectl falls back to it) and the OpenAPI v3
documents kubectl reads to learn that the server validates fields itself and how to patch."""

from __future__ import annotations

import hashlib
import json

from devstack.apiserver.errors import JsonObject
from devstack.apiserver.registry import Registry, ResourceType

KUBERNETES_VERSION = {"major": "1", "minor": "33", "gitVersion": "v1.33.0-smoothscale.local"}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
SUBRESOURCE_VERBS = ["get", "patch", "update"]


def api_versions() -> JsonObject:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }


def _group(name: str, versions: list[str]) -> JsonObject:
    entries = [{"groupVersion": f"{name}/{version}", "version": version} for version in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: Registry) -> JsonObject:
    groups = registry.group_versions()
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(name, versions) for name, versions in sorted(groups.items()) if name],
    }


def api_group(registry: Registry, group: str) -> JsonObject | None:
    versions = registry.group_versions().get(group)
    if not group or versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def _resource_entries(rt: ResourceType) -> list[JsonObject]:
    entries: list[JsonObject] = [
        {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": VERBS,
            "shortNames": list(rt.short_names),
            "categories": list(rt.categories),
        }
    ]
    if rt.status_subresource:
        entries.append(
            {
                "name": f"{rt.plural}/status",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": SUBRESOURCE_VERBS,
            }
        )
    if rt.key == ("", "pods"):
        entries.append(
            {
                "name": "pods/binding",
                "singularName": "",
                "namespaced": True,
                "kind": "Binding",
                "verbs": ["create"],
            }
        )
        entries.append(
            {
                "name": "pods/log",
                "singularName": "",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get"],
            }
        )
        entries.append(  # kubectl drain evicts (policy/v1) only when this entry is there
            {
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": True,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }
        )
    if rt.key == ("", "serviceaccounts"):
        entries.append(
            {
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": True,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }
        )
    if rt.scale is not None:
        entries.append(
            {
                "name": f"{rt.plural}/scale",
                "singularName": "",
                "namespaced": rt.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": SUBRESOURCE_VERBS,
            }
        )
    return entries


def api_resource_list(registry: Registry, group: str, version: str) -> JsonObject | None:
    types = registry.in_group_version(group, version)
    if not types:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [entry for rt in types for entry in _resource_entries(rt)],
    }


# -- OpenAPI v3 ---------------------------------------------------------------------------

_PATCH_TYPES_CUSTOM = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
]
_QUERY_PARAMETERS = ["dryRun", "fieldManager", "fieldValidation", "force"]


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _schema_name(rt: ResourceType) -> str:
    group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{group}.{rt.version}.{rt.kind}"


def _gvk(rt: ResourceType) -> JsonObject:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _operation(rt: ResourceType, *, with_body: list[str] | None, action: str) -> JsonObject:
    operation: JsonObject = {
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt),
        "parameters": [
            {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for name in _QUERY_PARAMETERS
        ],
        "responses": {"200": {"description": "OK"}},
    }
    if with_body is not None:
        reference = {"$ref": f"#/components/schemas/{_schema_name(rt)}"}
        operation["requestBody"] = {
            "content": {media: {"schema": reference} for media in with_body},
            "required": True,
        }
    return operation


def openapi_v3_document(registry: Registry, group: str, version: str) -> JsonObject | None:
    """The document of one group/version. PATCH of the built-in kinds does not list strategic
    merge patch, so kubectl computes it from its compiled-in types rather than from here."""
    types = registry.in_group_version(group, version)
    if not types:
        return None
    paths: JsonObject = {}
    schemas: JsonObject = {}
    for rt in types:
        prefix = f"/{_gv_path(group, version)}/" + (
            "namespaces/{namespace}/" if rt.namespaced else ""
        )
        json_body = ["application/json"]
        paths[f"{prefix}{rt.plural}"] = {
            "get": _operation(rt, with_body=None, action="list"),
            "post": _operation(rt, with_body=json_body, action="post"),
        }
        paths[f"{prefix}{rt.plural}/{{name}}"] = {
            "get": _operation(rt, with_body=None, action="get"),
            "put": _operation(rt, with_body=json_body, action="put"),
            "patch": _operation(rt, with_body=_PATCH_TYPES_CUSTOM, action="patch"),
            "delete": _operation(rt, with_body=None, action="delete"),
        }
        schema: JsonObject = (
            dict(rt.schema)
            if rt.schema is not None
            else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        )
        schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
        schemas[_schema_name(rt)] = schema
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (smoothscale local API server)", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def openapi_v3_index(registry: Registry) -> JsonObject:
    """The root document: where each group/version's document is, with a content hash."""
    paths = {}
    for group, versions in registry.group_versions().items():
        for version in versions:
            document = openapi_v3_document(registry, group, version)
            digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32]
            path = _gv_path(group, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest.upper()}"}
    return {"paths": paths}
