"""What the API server does to an object before storing it: defaulting and validation of custom
resources against their CRD schema (smoothscale.api.schema, shared with the operator), the
checks of the built-in kinds that kubectl users meet, and the status of a new CRD."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from smoothscale.api.schema import FieldError, apply_defaults, validate
from smoothscale.devcluster.apiserver.errors import ApiError, JsonObject, invalid
from smoothscale.devcluster.apiserver.registry import CRD_GROUP, ResourceType, crd_problems
from smoothscale.devcluster.apiserver.store import now

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


def admit_builtin(rt: ResourceType, obj: JsonObject) -> JsonObject:
    """The checks of the built-in kinds: object names, pods' containers, a CRD's names."""
    meta = obj.get("metadata", {})
    name = meta.get("name", "")
    causes: list[tuple[str, str, str]] = []
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
        containers = obj.get("spec", {}).get("containers")
        if not containers:
            causes.append(("FieldValueRequired", "spec.containers", "Required value"))
        for index, container in enumerate(containers or []):
            for field in ("name", "image"):
                if not container.get(field):
                    causes.append(
                        (
                            "FieldValueRequired",
                            f"spec.containers[{index}].{field}",
                            "Required value",
                        )
                    )
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
