"""Default and validate custom resources from a CRD's openAPIV3Schema, as the API server does.

The Kubernetes API server handles a custom resource in this order: it drops null values of
fields that are not nullable, fills in the schema's defaults, checks the object against the
structural schema (types, bounds, patterns, enums, required fields, unknown fields when the
client asks for strict field validation, as kubectl does by default), checks the ObjectMeta
itself (a CRD schema does not describe metadata), enforces `x-kubernetes-list-type` set/map
uniqueness, and finally evaluates the `x-kubernetes-validations` CEL rules, unless an earlier
error makes the rules meaningless (a value of the wrong type).

This module does the same for any CRD version schema, so the operator, the local control plane
and the tests judge an object exactly alike. It uses jsonschema for the OpenAPI v3 subset and
cel-python for the CEL rules. cel-python implements standard CEL, not the Kubernetes CEL
libraries (quantity(), url(), isSorted(), ...): a rule that calls those is reported as one
that could not be evaluated.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import celpy
import jsonschema
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

__all__ = ["FieldError", "apply_defaults", "validate"]


@dataclass(frozen=True)
class FieldError:
    """One thing wrong with an object: where, and what is wrong and allowed there."""

    path: str
    """Where, e.g. "spec.scaling.maxWarmupReplicas" or "spec.kafka.inputTopics[0]"."""
    message: str
    """What is wrong and what is allowed."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


# ---------------------------------------------------------------------------------------------
# Paths


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key}]"


def _children(
    schema: Mapping[str, Any], value: Any, path: str
) -> Iterator[tuple[Mapping[str, Any], Any, str]]:
    """(schema, value, path) of each child of `value` that `schema` describes: its declared
    properties, the rest through additionalProperties, or the items of a list."""
    if isinstance(value, Mapping):
        properties: Mapping[str, Any] = schema.get("properties", {})
        for name, sub in properties.items():
            if name in value:
                yield sub, value[name], _join(path, name)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for name, item in value.items():
                if name not in properties:
                    yield additional, item, _join(path, name)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            yield schema["items"], item, _join(path, index)


def _path_of(parts: Sequence[str | int], start: str = "") -> str:
    path = start
    for part in parts:
        path = _join(path, part)
    return path


# ---------------------------------------------------------------------------------------------
# Defaulting


def _is_preserving(schema: Mapping[str, Any]) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def _default_node(schema: Mapping[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties", {})
        for name, sub in properties.items():
            if name in value and value[name] is None and not sub.get("nullable"):
                del value[name]
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _default_node(sub, value[name])
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for name in list(value):
                if name not in properties:
                    value[name] = _default_node(additional, value[name])
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                value[index] = _default_node(items, item)
    return value


def apply_defaults(schema: Mapping[str, Any], obj: Any) -> Any:
    """Return a copy of `obj` with the schema's defaults filled in, as the API server stores it.

    Like the API server: a null value of a field that is not nullable is dropped first (and
    so gets the field's default, if any); a default is itself defaulted further (a default of
    `{}` for an object gets the defaults of the object's fields); metadata is left alone.
    """
    result = copy.deepcopy(obj)
    return _default_node(schema, result)


# ---------------------------------------------------------------------------------------------
# OpenAPI v3 (Kubernetes flavour) -> JSON Schema draft 4


_OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_TYPE_META = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}


def _to_json_schema(schema: Mapping[str, Any], *, root: bool = False) -> dict[str, Any]:
    """Translate one schema node; unknown fields become `additionalProperties: false` errors."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in {"properties", "items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"}:
            continue
        if key.startswith("x-kubernetes-") or key in {"nullable", "default", "description"}:
            continue
        out[key] = copy.deepcopy(value)
    properties = {name: _to_json_schema(sub) for name, sub in schema.get("properties", {}).items()}
    embedded = bool(schema.get("x-kubernetes-embedded-resource"))
    if root or embedded:
        properties.setdefault("apiVersion", dict(_TYPE_META["apiVersion"]))
        properties.setdefault("kind", dict(_TYPE_META["kind"]))
        # The API server checks metadata itself (see _validate_object_meta); a CRD may only
        # narrow name and generateName further.
        declared = schema.get("properties", {}).get("metadata", {}).get("properties", {})
        narrowed = {
            field: _to_json_schema(declared[field])
            for field in ("name", "generateName")
            if field in declared
        }
        properties["metadata"] = {"type": "object", "properties": narrowed}
    if properties:
        out["properties"] = properties
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        out["additionalProperties"] = _to_json_schema(additional)
    elif additional is not None:
        out["additionalProperties"] = bool(additional)
    elif schema.get("type") == "object" and not _is_preserving(schema):
        out["additionalProperties"] = False
    if isinstance(schema.get("items"), Mapping):
        out["items"] = _to_json_schema(schema["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [_to_json_schema(sub) for sub in schema[key]]
    if "not" in schema:
        out["not"] = _to_json_schema(schema["not"])
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


@lru_cache(maxsize=64)
def _validator_for(schema_json: str) -> jsonschema.Draft4Validator:
    schema = json.loads(schema_json)
    return jsonschema.Draft4Validator(_to_json_schema(schema, root=True), format_checker=_FORMATS)


def _is_date_time(value: object) -> bool:
    if isinstance(value, str):
        datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    return True


def _is_int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


def _is_int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


_FORMATS = jsonschema.FormatChecker(formats=())
_FORMATS.checks("date-time", raises=ValueError)(_is_date_time)
_FORMATS.checks("int32")(_is_int32)
_FORMATS.checks("int64")(_is_int64)


# ---------------------------------------------------------------------------------------------
# Messages for structural errors


_TYPE_NAMES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _bound(limit: Any, *, exclusive: bool, above: bool) -> str:
    if above:
        return f"greater than {limit}" if exclusive else f"greater than or equal to {limit}"
    return f"less than {limit}" if exclusive else f"less than or equal to {limit}"


def _errors_for(error: jsonschema.ValidationError) -> Iterator[FieldError]:
    path = _path_of(list(error.absolute_path))
    keyword = error.validator
    expected = error.validator_value
    value = error.instance
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if keyword == "type":
        names = expected if isinstance(expected, list) else [expected]
        kinds = " or ".join(
            _TYPE_NAMES.get(str(name), str(name)) for name in names if name != "null"
        )
        yield FieldError(path, f"must be {kinds}, not {_TYPE_NAMES[_json_type(value)]}")
    elif keyword == "required":
        for name in expected:
            if isinstance(value, Mapping) and name not in value:
                yield FieldError(_join(path, name), "is required")
    elif keyword == "additionalProperties":
        fields = sorted(schema.get("properties", {}))
        hint = f"allowed fields: {', '.join(fields)}" if fields else "this object has no fields"
        for name in value:
            if name not in schema.get("properties", {}):
                yield FieldError(_join(path, name), f'unknown field "{name}"; {hint}')
    elif keyword == "minimum":
        exclusive = bool(schema.get("exclusiveMinimum"))
        yield FieldError(
            path, f"must be {_bound(expected, exclusive=exclusive, above=True)}, got {value}"
        )
    elif keyword == "maximum":
        exclusive = bool(schema.get("exclusiveMaximum"))
        yield FieldError(
            path, f"must be {_bound(expected, exclusive=exclusive, above=False)}, got {value}"
        )
    elif keyword == "minLength":
        if expected == 1:
            yield FieldError(path, "must not be empty")
        else:
            yield FieldError(path, f"must be at least {expected} characters long, got {len(value)}")
    elif keyword == "maxLength":
        yield FieldError(path, f"must be at most {expected} characters long, got {len(value)}")
    elif keyword == "pattern":
        yield FieldError(path, f"must match the pattern {expected}, got {_show(value)}")
    elif keyword == "enum":
        allowed = ", ".join(_show(item) for item in expected if item is not None)
        yield FieldError(path, f"must be one of {allowed}; got {_show(value)}")
    elif keyword == "minItems":
        if expected == 1:
            yield FieldError(path, "must not be empty: give at least 1 item")
        else:
            yield FieldError(path, f"must have at least {expected} items, got {len(value)}")
    elif keyword == "maxItems":
        yield FieldError(path, f"must have at most {expected} items, got {len(value)}")
    elif keyword == "minProperties":
        yield FieldError(path, f"must have at least {expected} entries, got {len(value)}")
    elif keyword == "maxProperties":
        yield FieldError(path, f"must have at most {expected} entries, got {len(value)}")
    elif keyword == "multipleOf":
        yield FieldError(path, f"must be a multiple of {expected}, got {value}")
    elif keyword == "format":
        yield FieldError(path, f"must be a valid {expected}, got {_show(value)}")
    elif keyword in {"anyOf", "oneOf"} and _is_int_or_string(expected):
        yield FieldError(
            path, f"must be an integer or a string, not {_TYPE_NAMES[_json_type(value)]}"
        )
    elif keyword == "anyOf":
        yield FieldError(path, f"must match at least one of the allowed forms, got {_show(value)}")
    elif keyword == "oneOf":
        yield FieldError(path, f"must match exactly one of the allowed forms, got {_show(value)}")
    elif keyword == "not":
        yield FieldError(path, f"must not match the forbidden form, got {_show(value)}")
    elif keyword == "uniqueItems":
        yield FieldError(path, "must not contain the same item twice")
    else:
        yield FieldError(path, error.message)


def _is_int_or_string(alternatives: Any) -> bool:
    return isinstance(alternatives, list) and sorted(
        str(alternative.get("type")) for alternative in alternatives
    ) == ["integer", "string"]


# ---------------------------------------------------------------------------------------------
# ObjectMeta, as the API server checks it for every custom resource


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ANNOTATIONS_MAX_BYTES = 256 * 1024


def _dns_subdomain_problem(value: str) -> str | None:
    if len(value) > 253:
        return f"must be at most 253 characters long, got {len(value)}"
    if not _DNS_SUBDOMAIN.match(value):
        return (
            f"must be a lowercase RFC 1123 subdomain: lowercase letters, digits, '-' and '.', "
            f"starting and ending with a letter or digit (e.g. 'my-app'), got {_show(value)}"
        )
    return None


def _qualified_name_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or _dns_subdomain_problem(prefix)):
        return f"the prefix of key {_show(key)} must be a DNS subdomain such as example.com"
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            f"key {_show(key)} must be a name of at most 63 characters: letters, digits, "
            "'-', '_' and '.', starting and ending with a letter or digit, with an optional "
            "DNS subdomain prefix and '/'"
        )
    return None


def _validate_object_meta(meta: Any, path: str) -> Iterator[FieldError]:
    if meta is None:
        yield FieldError(_join(path, "name"), "is required: give metadata.name or generateName")
        return
    if not isinstance(meta, Mapping):
        yield FieldError(path, f"must be an object, not {_TYPE_NAMES[_json_type(meta)]}")
        return
    for key in meta:
        if key not in _OBJECT_META_FIELDS:
            allowed = ", ".join(sorted(_OBJECT_META_FIELDS))
            yield FieldError(_join(path, key), f'unknown field "{key}"; allowed fields: {allowed}')
    name, generate_name = meta.get("name"), meta.get("generateName")
    if not name and not generate_name:
        yield FieldError(_join(path, "name"), "is required: give metadata.name or generateName")
    for field in ("name", "generateName", "namespace"):
        value = meta.get(field)
        if value is not None and not isinstance(value, str):
            yield FieldError(_join(path, field), f"must be a string, not {_json_type(value)}")
    if isinstance(name, str) and name and (problem := _dns_subdomain_problem(name)):
        yield FieldError(_join(path, "name"), problem)
    namespace = meta.get("namespace")
    if (
        isinstance(namespace, str)
        and namespace
        and not (len(namespace) <= 63 and _DNS_LABEL.match(namespace))
    ):
        yield FieldError(
            _join(path, "namespace"),
            "must be an RFC 1123 label of at most 63 characters: lowercase letters, digits "
            f"and '-', starting and ending with a letter or digit, got {_show(namespace)}",
        )
    yield from _validate_string_map(meta.get("labels"), _join(path, "labels"), labels=True)
    yield from _validate_string_map(
        meta.get("annotations"), _join(path, "annotations"), labels=False
    )


def _validate_string_map(value: Any, path: str, *, labels: bool) -> Iterator[FieldError]:
    if value is None:
        return
    if not isinstance(value, Mapping):
        yield FieldError(path, f"must be an object of strings, not {_json_type(value)}")
        return
    size = 0
    for key, item in value.items():
        item_path = _join(path, key)
        if problem := _qualified_name_problem(key):
            yield FieldError(item_path, problem)
        if not isinstance(item, str):
            yield FieldError(item_path, f"must be a string, not {_TYPE_NAMES[_json_type(item)]}")
            continue
        size += len(key) + len(item)
        if labels and (len(item) > 63 or not _LABEL_VALUE.match(item)):
            yield FieldError(
                item_path,
                "a label value must be empty or at most 63 characters: letters, digits, "
                f"'-', '_' and '.', starting and ending with a letter or digit, got {_show(item)}",
            )
    if not labels and size > _ANNOTATIONS_MAX_BYTES:
        yield FieldError(
            path, f"annotations must total at most {_ANNOTATIONS_MAX_BYTES} bytes, got {size}"
        )


def _validate_embedded_meta(
    schema: Mapping[str, Any], value: Any, path: str
) -> Iterator[FieldError]:
    """ObjectMeta of x-kubernetes-embedded-resource nodes below the root."""
    if (
        isinstance(value, Mapping)
        and path
        and schema.get("x-kubernetes-embedded-resource")
        and "metadata" in value
    ):
        yield from _validate_object_meta(value["metadata"], _join(path, "metadata"))
    for sub, item, where in _children(schema, value, path):
        yield from _validate_embedded_meta(sub, item, where)


# ---------------------------------------------------------------------------------------------
# x-kubernetes-list-type


def _validate_list_types(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[FieldError]:
    for sub, item, where in _children(schema, value, path):
        yield from _validate_list_types(sub, item, where)
    if not isinstance(value, list):
        return
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        seen: list[Any] = []
        for index, item in enumerate(value):
            if item in seen:
                yield FieldError(
                    _join(path, index),
                    f"duplicate value {_show(item)}: the items of this list must be unique",
                )
            seen.append(item)
    elif list_type == "map":
        keys: list[str] = list(schema.get("x-kubernetes-list-map-keys", []))
        seen_keys: set[str] = set()
        for index, item in enumerate(value):
            if not isinstance(item, Mapping):
                continue
            key = json.dumps([item.get(name) for name in keys])
            if key in seen_keys:
                described = ", ".join(f"{name}={_show(item.get(name))}" for name in keys)
                yield FieldError(
                    _join(path, index),
                    f"duplicate entry with {described}: each entry must have a different "
                    f"{' and '.join(keys)}",
                )
            seen_keys.add(key)


# ---------------------------------------------------------------------------------------------
# x-kubernetes-validations (CEL)


_CEL = celpy.Environment()


@lru_cache(maxsize=512)
def _cel_program(expression: str) -> Any:
    return _CEL.program(_CEL.compile(expression))


_FIELD_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\['([^']*)'\]")


def _rule_path(path: str, field_path: str | None) -> str:
    if not field_path:
        return path
    for match in _FIELD_PATH_PART.finditer(field_path):
        path = _join(path, match.group(1) if match.group(1) is not None else match.group(2))
    return path


def _evaluate(expression: str, value: Any) -> Any:
    return _cel_program(expression).evaluate({"self": json_to_cel(value)})


def _validate_rules(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[FieldError]:
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations", []):
        expression = rule["rule"]
        where = _rule_path(path, rule.get("fieldPath"))
        try:
            passed = _evaluate(expression, value)
        except (CELEvalError, CELParseError, TypeError, ValueError) as problem:
            yield FieldError(where, f"rule {expression!r} could not be evaluated: {problem}")
            continue
        if passed is True or (isinstance(passed, celpy.celtypes.BoolType) and bool(passed)):
            continue
        yield FieldError(where, _rule_message(rule, value))
    for sub, item, child in _children(schema, value, path):
        yield from _validate_rules(sub, item, child)


def _rule_message(rule: Mapping[str, Any], value: Any) -> str:
    if "messageExpression" in rule:
        try:
            message = _evaluate(rule["messageExpression"], value)
        except (CELEvalError, CELParseError, TypeError, ValueError):
            message = None
        if isinstance(message, str) and message.strip():
            return str(message)
    if rule.get("message"):
        return str(rule["message"])
    return f"failed rule: {rule['rule']}"


# ---------------------------------------------------------------------------------------------
# The whole pipeline


# The API server skips the CEL rules after these errors (wrong type, missing required field,
# value not in the enum, too long, too many): rules over such values would only add noise.
_BLOCKING = frozenset(
    {"type", "anyOf", "oneOf", "required", "enum", "maxLength", "maxItems", "maxProperties"}
)


def _has_rules(schema: Any) -> bool:
    """Whether any node of `schema` carries x-kubernetes-validations."""
    if isinstance(schema, Mapping):
        return "x-kubernetes-validations" in schema or any(
            _has_rules(node) for node in schema.values()
        )
    if isinstance(schema, list):
        return any(_has_rules(node) for node in schema)
    return False


def validate(schema: Mapping[str, Any], obj: Any) -> list[FieldError]:
    """Every reason the API server would refuse `obj` under this CRD version's schema.

    `obj` is checked as the API server would store it, after `apply_defaults` (defaulting is
    idempotent, so an already defaulted object may be passed). Unknown fields are reported as
    with strict field validation (`kubectl apply`'s default). An empty list means valid.
    """
    if not isinstance(obj, Mapping):
        return [FieldError("", f"must be an object, not {_TYPE_NAMES[_json_type(obj)]}")]
    defaulted = apply_defaults(schema, obj)
    validator = _validator_for(json.dumps(schema, sort_keys=True))
    errors: list[FieldError] = []
    blocking = False
    for error in validator.iter_errors(defaulted):
        errors.extend(_errors_for(error))
        blocking = blocking or error.validator in _BLOCKING
    errors.extend(_validate_object_meta(defaulted.get("metadata"), "metadata"))
    errors.extend(_validate_embedded_meta(schema, defaulted, ""))
    errors.extend(_validate_list_types(schema, defaulted, ""))
    if blocking and _has_rules(schema):
        errors.append(
            FieldError(
                "",
                "some validation rules were not checked because the object was invalid; "
                "correct the existing errors to complete validation",
            )
        )
    else:
        errors.extend(_validate_rules(schema, defaulted, ""))
    unique = list(dict.fromkeys(errors))
    return sorted(unique, key=lambda error: error.path)
