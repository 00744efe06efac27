"""What the API server does to an object before storing it: defaulting and validation of custom
resources against their CRD schema (smoothscale.api.schema, shared with the operator), the
checks of the built-in kinds that kubectl users meet, and the status of a new CRD."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from devstack.apiserver.errors import ApiError, JsonObject, invalid
from devstack.apiserver.registry import (
    CRD_GROUP,
    POLICY_GROUP,
    RBAC_GROUP,
    ResourceType,
    crd_problems,
)
from devstack.apiserver.store import now
from smoothscale.api.schema import FieldError, apply_defaults, validate

STRICT, WARN, IGNORE = "Strict", "Warn", "Ignore"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_PATH_PART = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]")


def _value_at(obj: Any, path: str) -> Any:
    for match in _PATH_PART.finditer(path):
        key = match.group(1) if match.group(1) is not None else match.group(2)
        if isinstance(obj, list) and key.isdigit() and int(key) < len(obj):
            obj = obj[int(key)]
        elif isinstance(obj, dict) and key in obj:
            obj = obj[key]
        else:
            return None
    return obj


def _is_unknown_field(error: FieldError) -> bool:
    return error.message.startswith("unknown field")


def _cause(obj: JsonObject, error: FieldError) -> tuple[str, str, str]:
    """(reason, field, message) in the API server's words, e.g. "Invalid value: -1: ..."."""
    if error.message.startswith("is required"):
        return ("FieldValueRequired", error.path, f"Required value: {error.message}")
    if error.message.startswith("must be one of"):
        value = json.dumps(_value_at(obj, error.path))
        return (
            "FieldValueNotSupported",
            error.path,
            f"Unsupported value: {value}: {error.message}",
        )
    if error.message.startswith("duplicate"):
        return ("FieldValueDuplicate", error.path, f"Duplicate value: {error.message}")
    if not error.path:
        return ("FieldValueInvalid", "", error.message)
    value = _value_at(obj, error.path)
    shown = json.dumps(value) if value is not None else "null"
    return ("FieldValueInvalid", error.path, f"Invalid value: {shown}: {error.message}")


def _prune(schema: Mapping[str, Any], value: Any) -> Any:
    """Drop fields the schema does not know, as the API server does unless asked to refuse."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        pruned = {}
        for key, item in value.items():
            if key in properties:
                pruned[key] = _prune(properties[key], item)
            elif isinstance(additional, Mapping):
                pruned[key] = _prune(additional, item)
            elif additional is True or key in ("apiVersion", "kind", "metadata"):
                pruned[key] = item
        return pruned
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_prune(schema["items"], item) for item in value]
    return value


def admit_custom(
    rt: ResourceType, obj: JsonObject, field_validation: str
) -> tuple[JsonObject, list[str]]:
    """Default and validate a custom resource; returns it (pruned of unknown fields unless the
    validation is Strict) and warnings. Raises 400/422 as the API server would."""
    assert rt.schema is not None
    defaulted: JsonObject = apply_defaults(rt.schema, obj)
    errors = validate(rt.schema, defaulted)
    unknown = [error for error in errors if _is_unknown_field(error)]
    errors = [error for error in errors if not _is_unknown_field(error)]
    meta = defaulted.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName", "")
    if unknown and field_validation == STRICT:
        fields = ", ".join(f'unknown field "{error.path}"' for error in unknown)
        raise ApiError(
            400,
            "BadRequest",
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
            f"strict decoding error: {fields}",
        )
    if errors:
        raise invalid(rt.kind, rt.group, name, [_cause(defaulted, error) for error in errors])
    warnings = (
        [f'unknown field "{error.path}"' for error in unknown] if field_validation == WARN else []
    )
    pruned: JsonObject = _prune(rt.schema, defaulted)
    pruned["metadata"] = meta  # ObjectMeta is not described by the CRD schema
    return pruned, warnings


Causes = list[tuple[str, str, str]]


def _container_causes(pod_spec: JsonObject, prefix: str) -> Causes:
    containers = pod_spec.get("containers")
    causes: Causes = []
    if not containers:
        causes.append(("FieldValueRequired", f"{prefix}.containers", "Required value"))
    for index, container in enumerate(containers or []):
        for field in ("name", "image"):
            if not container.get(field):
                causes.append(
                    (
                        "FieldValueRequired",
                        f"{prefix}.containers[{index}].{field}",
                        "Required value",
                    )
                )
    return causes


def _deployment(obj: JsonObject) -> Causes:
    """A Deployment's checks, and the defaults the API server gives it."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxSurge", "25%")
        rolling.setdefault("maxUnavailable", "25%")
    causes: Causes = []
    if strategy.get("type") not in ("RollingUpdate", "Recreate"):
        value = json.dumps(strategy.get("type"))
        causes.append(
            (
                "FieldValueNotSupported",
                "spec.strategy.type",
                f'Unsupported value: {value}: supported values: "Recreate", "RollingUpdate"',
            )
        )
    match_labels = (spec.get("selector") or {}).get("matchLabels") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not spec.get("selector"):
        causes.append(("FieldValueRequired", "spec.selector", "Required value"))
    elif any(labels.get(key) != value for key, value in match_labels.items()):
        causes.append(
            (
                "FieldValueInvalid",
                "spec.template.metadata.labels",
                f"Invalid value: {json.dumps(labels)}: `selector` does not match template `labels`",
            )
        )
    causes += _container_causes(template.get("spec") or {}, "spec.template.spec")
    return causes


def _service(obj: JsonObject) -> None:
    """A Service's defaults: type ClusterIP, a cluster IP (derived from its name, so stable
    across re-creations), TCP ports whose targetPort is the port."""
    meta, spec = obj["metadata"], obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec.get("clusterIP") is None and spec["type"] != "ExternalName":
        digest = hashlib.sha256(f"{meta.get('namespace')}/{meta.get('name')}".encode()).digest()
        spec["clusterIP"] = f"10.96.{digest[0]}.{max(digest[1], 1)}"
    if spec.get("clusterIP"):
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))


def _rbac(rt: ResourceType, obj: JsonObject) -> Causes:
    """Roles need verbs in every rule; bindings a roleRef to a Role or ClusterRole."""
    causes: Causes = []
    if rt.plural in ("roles", "clusterroles"):
        for index, rule in enumerate(obj.get("rules") or []):
            if not rule.get("verbs"):
                causes.append(
                    (
                        "FieldValueRequired",
                        f"rules[{index}].verbs",
                        "Required value: verbs must contain at least one value",
                    )
                )
            if not rule.get("nonResourceURLs") and not rule.get("resources"):
                causes.append(
                    (
                        "FieldValueRequired",
                        f"rules[{index}].resources",
                        "Required value: resource rules must supply at least one resource",
                    )
                )
        return causes
    ref = obj.get("roleRef") or {}
    allowed = ("Role", "ClusterRole") if rt.plural == "rolebindings" else ("ClusterRole",)
    if ref.get("kind") not in allowed:
        shown = json.dumps(ref.get("kind", ""))
        causes.append(
            (
                "FieldValueNotSupported",
                "roleRef.kind",
                f"Unsupported value: {shown}: supported values: "
                + ", ".join(f'"{kind}"' for kind in allowed),
            )
        )
    if not ref.get("name"):
        causes.append(("FieldValueRequired", "roleRef.name", "Required value"))
    for index, subject in enumerate(obj.get("subjects") or []):
        if subject.get("kind") == "ServiceAccount" and not subject.get("namespace"):
            causes.append(("FieldValueRequired", f"subjects[{index}].namespace", "Required value"))
    return causes


_PERCENT = re.compile(r"^[0-9]+%$")
_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _int_or_percent(value: Any, path: str) -> Causes:
    """A minAvailable or maxUnavailable: a non-negative integer or a percentage up to 100%."""
    if isinstance(value, str):
        if not _PERCENT.match(value):
            return [
                (
                    "FieldValueInvalid",
                    path,
                    f"Invalid value: {json.dumps(value)}: must be an integer or percentage "
                    "(e.g '5%')",
                )
            ]
        if int(value[:-1]) > 100:
            return [
                (
                    "FieldValueInvalid",
                    path,
                    f"Invalid value: {json.dumps(value)}: must not be greater than 100%",
                )
            ]
        return []
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return [
            (
                "FieldValueInvalid",
                path,
                f"Invalid value: {json.dumps(value)}: must be greater than or equal to 0",
            )
        ]
    return []


def _pod_disruption_budget(obj: JsonObject) -> Causes:
    """policy/v1 PodDisruptionBudget: minAvailable or maxUnavailable (not both), a valid
    selector and unhealthyPodEvictionPolicy."""
    spec = obj.get("spec") or {}
    causes: Causes = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        causes.append(
            (
                "FieldValueInvalid",
                "spec",
                f"Invalid value: {json.dumps(spec)}: minAvailable and maxUnavailable cannot be "
                "both set",
            )
        )
    for field in ("minAvailable", "maxUnavailable"):
        if spec.get(field) is not None:
            causes += _int_or_percent(spec[field], f"spec.{field}")
    expressions = (spec.get("selector") or {}).get("matchExpressions") or []
    for index, expression in enumerate(expressions):
        if expression.get("operator") not in _SELECTOR_OPERATORS:
            shown = json.dumps(expression.get("operator"))
            causes.append(
                (
                    "FieldValueNotSupported",
                    f"spec.selector.matchExpressions[{index}].operator",
                    f"Unsupported value: {shown}: supported values: "
                    + ", ".join(f'"{op}"' for op in _SELECTOR_OPERATORS),
                )
            )
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("AlwaysAllow", "IfHealthyBudget"):
        causes.append(
            (
                "FieldValueNotSupported",
                "spec.unhealthyPodEvictionPolicy",
                f'Unsupported value: {json.dumps(policy)}: supported values: "AlwaysAllow", '
                '"IfHealthyBudget"',
            )
        )
    return causes


def admit_update(rt: ResourceType, current: JsonObject, obj: JsonObject) -> None:
    """What may not change in an update: a binding's roleRef."""
    binding = rt.group == RBAC_GROUP and rt.plural.endswith("bindings")
    if binding and (obj.get("roleRef") or {}) != (current.get("roleRef") or {}):
        name = obj["metadata"]["name"]
        raise invalid(
            rt.kind,
            rt.group,
            name,
            [
                (
                    "FieldValueInvalid",
                    "roleRef",
                    f"Invalid value: {json.dumps(obj.get('roleRef'))}: cannot change roleRef",
                )
            ],
        )


def admit_builtin(rt: ResourceType, obj: JsonObject) -> JsonObject:
    """The checks of the built-in kinds (object names, pods' containers, Deployments, RBAC,
    PodDisruptionBudgets, a CRD's names) and their defaults."""
    meta = obj.get("metadata", {})
    name = meta.get("name", "")
    causes: Causes = []
    if rt.plural != "events" and not _NAME.match(name):
        causes.append(
            (
                "FieldValueInvalid",
                "metadata.name",
                f"Invalid value: {json.dumps(name)}: a lowercase RFC 1123 subdomain must consist "
                "of lower case alphanumeric characters, '-' or '.'",
            )
        )
    if rt.key == ("", "pods"):
        causes += _container_causes(obj.get("spec") or {}, "spec")
    if rt.key == ("apps", "deployments"):
        causes += _deployment(obj)
    if rt.key == ("", "services"):
        _service(obj)
    if rt.group == RBAC_GROUP:
        causes += _rbac(rt, obj)
    if rt.key == (POLICY_GROUP, "poddisruptionbudgets"):
        causes += _pod_disruption_budget(obj)
    if rt.key == (CRD_GROUP, "customresourcedefinitions"):
        causes.extend(("FieldValueInvalid", field, message) for field, message in crd_problems(obj))
    if causes:
        raise invalid(rt.kind, rt.group, name, causes)
    if rt.key == (CRD_GROUP, "customresourcedefinitions"):
        obj["status"] = established_crd_status(obj)
    if rt.key == ("", "pods"):
        obj.setdefault("status", {}).setdefault("phase", "Pending")
    if rt.key == ("", "namespaces"):
        obj.setdefault("status", {}).setdefault("phase", "Active")
    if rt.key == (POLICY_GROUP, "poddisruptionbudgets"):
        status = obj.setdefault("status", {})
        for count in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods"):
            status.setdefault(count, 0)  # required fields: 0 until the controller counts
    return obj


def established_crd_status(crd: JsonObject) -> JsonObject:
    """The status the apiextensions controller gives a CRD it serves (conditions that were
    already true keep their lastTransitionTime)."""
    spec = crd["spec"]
    since = {
        condition["type"]: condition.get("lastTransitionTime")
        for condition in (crd.get("status") or {}).get("conditions", [])
    }
    return {
        "acceptedNames": spec["names"],
        "storedVersions": [
            version["name"] for version in spec["versions"] if version.get("storage")
        ],
        "conditions": [
            {
                "type": condition,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": since.get(condition) or now(),
            }
            for condition, reason, message in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ],
    }
