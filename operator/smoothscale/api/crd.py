"""The StreamingApp CustomResourceDefinition, generated from the pydantic models.

pydantic writes JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema. The translation
inlines every `$ref`, turns `Optional[X]` (anyOf X/null) into X (an unset field is left out,
never null), drops what Kubernetes refuses (`title`, `additionalProperties: false` beside
`properties`, `default: null`) and keeps what the models say: types, bounds, patterns, enums,
required fields, defaults, descriptions and the `x-kubernetes-*` extensions (CEL rules,
list types, int-or-string). Nothing about a field is restated here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from smoothscale.api import models

CRD_NAME = f"{models.PLURAL}.{models.GROUP}"

_DROPPED_KEYS = frozenset({"title", "$defs", "const", "discriminator", "examples"})


class _KubernetesJsonSchema(GenerateJsonSchema):
    """pydantic's generator, writing defaults the way the CRD spells values."""

    def encode_default(self, dft: Any) -> Any:
        if isinstance(dft, timedelta):
            return models.format_duration(dft)
        return super().encode_default(dft)


def _resolve(node: Mapping[str, Any], definitions: Mapping[str, Any]) -> dict[str, Any]:
    """Inline `$ref`s (siblings such as description or default override the referenced schema)."""
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**_resolve(target, definitions)}
        merged.update({key: value for key, value in node.items() if key != "$ref"})
        return _resolve(merged, definitions)
    return dict(node)


def _optional_inner(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """X for an `anyOf: [X, {type: null}]` (pydantic's Optional[X]), else None."""
    alternatives = node.get("anyOf")
    if not isinstance(alternatives, list) or len(alternatives) != 2:
        return None
    rest = [alt for alt in alternatives if alt != {"type": "null"}]
    return rest[0] if len(rest) == 1 else None


def _structural(node: Mapping[str, Any], definitions: Mapping[str, Any]) -> dict[str, Any]:
    node = _resolve(node, definitions)
    inner = _optional_inner(node)
    if inner is not None:
        outer = {key: value for key, value in node.items() if key != "anyOf"}
        node = {**_resolve(inner, definitions), **outer}
    if node.get("default", 0) is None:
        del node["default"]
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, definitions) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, definitions)
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                out[key] = _structural(value, definitions)
        elif key in {"anyOf", "allOf", "oneOf"}:
            out[key] = [_structural(sub, definitions) for sub in value]
        else:
            out[key] = copy.deepcopy(value)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "description" in out:
        out["description"] = " ".join(out["description"].split())
    return dict(sorted(out.items(), key=lambda item: _key_rank(item[0])))


_KEY_ORDER = (
    "type",
    "description",
    "default",
    "enum",
    "format",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "anyOf",
)


def _key_rank(key: str) -> tuple[int, str]:
    """Type and description first, nested schemas and extensions last, the rest in between."""
    return (_KEY_ORDER.index(key), "") if key in _KEY_ORDER else (len(_KEY_ORDER), key)


def _model_schema(model: type[models.ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, schema_generator=_KubernetesJsonSchema)
    return _structural(raw, raw.get("$defs", {}))


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of smoothscale.io/v1alpha1 StreamingApp."""
    app = _model_schema(models.StreamingApp)
    properties = app["properties"]
    return {
        "type": "object",
        "description": app["description"],
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": properties["apiVersion"]["description"],
            },
            "kind": {"type": "string", "description": properties["kind"]["description"]},
            "metadata": {"type": "object", "description": properties["metadata"]["description"]},
            "spec": properties["spec"],
            "status": properties["status"],
        },
    }


def _printer_column(
    name: str, type_: str, path: str, description: str, *, wide: bool = False
) -> dict[str, str | int]:
    """A column of `kubectl get`; `wide`: only with `-o wide` (priority 1)."""
    column: dict[str, str | int] = {
        "name": name,
        "type": type_,
        "jsonPath": path,
        "description": description,
    }
    if wide:
        column["priority"] = 1
    return column


def custom_resource_definition() -> dict[str, Any]:
    """The CRD object, ready for `kubectl apply`."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "smoothscale"},
        },
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": list(models.SHORT_NAMES),
                "categories": list(models.CATEGORIES),
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        _printer_column("Desired", "integer", ".spec.replicas", "Instances wanted"),
                        _printer_column(
                            "Ready", "integer", ".status.readyReplicas", "Instances ready"
                        ),
                        _printer_column(
                            "Active",
                            "integer",
                            ".status.activeReplicas",
                            "Instances owning active tasks",
                        ),
                        _printer_column(
                            "Warm-up",
                            "integer",
                            ".status.warmupReplicas",
                            "Instances warming up tasks",
                        ),
                        _printer_column(
                            "Max-Lag",
                            "integer",
                            ".status.maxLag",
                            "Largest changelog lag of a warm-up or standby (records)",
                        ),
                        _printer_column(
                            "Input-Lag",
                            "integer",
                            ".status.inputLag",
                            "Input records not processed yet",
                        ),
                        _printer_column("Phase", "string", ".status.phase", "The app's phase"),
                        _printer_column("Age", "date", ".metadata.creationTimestamp", "Age"),
                        _printer_column(
                            "Tasks", "integer", ".status.tasksTotal", "Tasks", wide=True
                        ),
                        _printer_column(
                            "Lag-Seconds",
                            "number",
                            ".status.inputLagSeconds",
                            "Age of the newest input record processed, while input waits",
                            wide=True,
                        ),
                        _printer_column(
                            "Progress",
                            "string",
                            ".status.conditions[?(@.type=='Progressing')].reason",
                            "What is moving (the Progressing condition's reason)",
                            wide=True,
                        ),
                        _printer_column(
                            "Last-Scaled",
                            "date",
                            ".status.lastScaling.started",
                            "When the last change of the instance count began",
                            wide=True,
                        ),
                    ],
                }
            ],
        },
    }
