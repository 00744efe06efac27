"""Decoding of the Kubernetes protobuf bodies that kubectl's typed commands send.

`kubectl create namespace|configmap|secret|serviceaccount|token|poddisruptionbudget` encode the
new object (or the TokenRequest) as protobuf (application/vnd.kubernetes.protobuf) whatever the
server prefers, helm sends DeleteOptions that way, and `kubectl drain` its Evictions. This reads
exactly those kinds, from the field numbers of k8s.io/api's generated.proto; any other protobuf
body is a 415 that says to send JSON (kubectl create -f / apply -f do).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

from devstack.apiserver.errors import JsonObject, bad_request, unsupported_media_type

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"
_VARINT, _LENGTH = 0, 2

Fields = list[tuple[int, int | bytes]]


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise bad_request("the protobuf body is truncated")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def _fields(data: bytes) -> Fields:
    """(field number, value) pairs: an int for varints, bytes for length-delimited fields."""
    fields: Fields = []
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, position = _varint(data, position)
            fields.append((number, value))
        elif wire_type == _LENGTH:
            length, position = _varint(data, position)
            fields.append((number, data[position : position + length]))
            position += length
        else:
            raise bad_request(f"unexpected protobuf wire type {wire_type}: send JSON instead")
    return fields


def _bytes_of(fields: Fields, number: int) -> Iterator[bytes]:
    for field, value in fields:
        if field == number and isinstance(value, bytes):
            yield value


def _string(fields: Fields, number: int) -> str | None:
    values = list(_bytes_of(fields, number))
    return values[-1].decode() if values else None


def _map(fields: Fields, number: int, *, binary: bool = False) -> dict[str, str] | None:
    entries = {}
    for entry in _bytes_of(fields, number):
        pairs = _fields(entry)
        key = _string(pairs, 1) or ""
        raw = b"".join(_bytes_of(pairs, 2))
        entries[key] = base64.b64encode(raw).decode() if binary else raw.decode()
    return entries or None


def _bool(fields: Fields, number: int) -> bool | None:
    values = [value for field, value in fields if field == number and isinstance(value, int)]
    return bool(values[-1]) if values else None


def _object_meta(data: bytes) -> JsonObject:
    fields = _fields(data)
    meta: JsonObject = {}
    for number, name in ((1, "name"), (2, "generateName"), (3, "namespace")):
        if value := _string(fields, number):  # Go writes empty strings too
            meta[name] = value
    for number, name in ((11, "labels"), (12, "annotations")):
        if (entries := _map(fields, number)) is not None:
            meta[name] = entries
    finalizers = [value.decode() for value in _bytes_of(fields, 14)]
    if finalizers:
        meta["finalizers"] = finalizers
    return meta


def _namespace(fields: Fields) -> JsonObject:
    finalizers = [
        value.decode() for spec in _bytes_of(fields, 2) for value in _bytes_of(_fields(spec), 1)
    ]
    return {"spec": {"finalizers": finalizers}} if finalizers else {}


def _config_map(fields: Fields) -> JsonObject:
    body: JsonObject = {}
    for name, value in (
        ("data", _map(fields, 2)),
        ("binaryData", _map(fields, 3, binary=True)),
        ("immutable", _bool(fields, 4)),
    ):
        if value is not None:
            body[name] = value
    return body


def _secret(fields: Fields) -> JsonObject:
    body: JsonObject = {}
    for name, value in (
        ("data", _map(fields, 2, binary=True)),
        ("type", _string(fields, 3)),
        ("stringData", _map(fields, 4)),
        ("immutable", _bool(fields, 5)),
    ):
        if value is not None:
            body[name] = value
    return body


def _service_account(fields: Fields) -> JsonObject:
    automount = _bool(fields, 4)
    return {} if automount is None else {"automountServiceAccountToken": automount}


def _token_request(fields: Fields) -> JsonObject:
    spec: JsonObject = {}
    for data in _bytes_of(fields, 2):
        spec_fields = _fields(data)
        spec["audiences"] = [value.decode() for value in _bytes_of(spec_fields, 1)]
        seconds = [value for field, value in spec_fields if field == 4 and isinstance(value, int)]
        if seconds:
            spec["expirationSeconds"] = seconds[-1]
    return {"spec": spec}


def _delete_options(fields: Fields) -> JsonObject:
    options: JsonObject = {}
    grace = [value for field, value in fields if field == 1 and isinstance(value, int)]
    if grace:
        options["gracePeriodSeconds"] = grace[-1]
    for data in _bytes_of(fields, 2):
        conditions = _fields(data)
        options["preconditions"] = {
            name: value
            for name, value in (
                ("uid", _string(conditions, 1)),
                ("resourceVersion", _string(conditions, 2)),
            )
            if value
        }
    if policy := _string(fields, 4):
        options["propagationPolicy"] = policy
    dry_run = [value.decode() for value in _bytes_of(fields, 5)]
    if dry_run:
        options["dryRun"] = dry_run
    return options


def _int_or_string(data: bytes) -> int | str:
    """An IntOrString: type 0 (an int32 in field 2) or 1 (a string in field 3)."""
    fields = _fields(data)
    kind = [value for field, value in fields if field == 1 and isinstance(value, int)]
    if kind and kind[-1] == 1:
        return _string(fields, 3) or ""
    numbers = [value for field, value in fields if field == 2 and isinstance(value, int)]
    return numbers[-1] if numbers else 0


def _label_selector(data: bytes) -> JsonObject:
    fields = _fields(data)
    selector: JsonObject = {}
    if (labels := _map(fields, 1)) is not None:
        selector["matchLabels"] = labels
    expressions = []
    for requirement in _bytes_of(fields, 2):
        parts = _fields(requirement)
        expression: JsonObject = {"key": _string(parts, 1) or "", "operator": _string(parts, 2)}
        values = [value.decode() for value in _bytes_of(parts, 3)]
        if values:
            expression["values"] = values
        expressions.append(expression)
    if expressions:
        selector["matchExpressions"] = expressions
    return selector


def _pod_disruption_budget(fields: Fields) -> JsonObject:
    """What `kubectl create poddisruptionbudget` sends: the spec (the status is the server's)."""
    spec: JsonObject = {}
    for data in _bytes_of(fields, 2):
        spec_fields = _fields(data)
        for number, name in ((1, "minAvailable"), (3, "maxUnavailable")):
            for value in _bytes_of(spec_fields, number):
                spec[name] = _int_or_string(value)
        for selector in _bytes_of(spec_fields, 2):
            spec["selector"] = _label_selector(selector)
        if policy := _string(spec_fields, 4):
            spec["unhealthyPodEvictionPolicy"] = policy
    return {"spec": spec}


def _eviction(fields: Fields) -> JsonObject:
    options = [_delete_options(_fields(data)) for data in _bytes_of(fields, 2)]
    return {"deleteOptions": options[-1]} if options else {}


_KINDS: dict[str, Callable[[Fields], JsonObject]] = {
    "Namespace": _namespace,
    "ConfigMap": _config_map,
    "Secret": _secret,
    "ServiceAccount": _service_account,
    "TokenRequest": _token_request,
    "DeleteOptions": _delete_options,
    "Eviction": _eviction,
    "PodDisruptionBudget": _pod_disruption_budget,
}


def decode(body: bytes) -> Any:
    """The JSON form of a protobuf-encoded Namespace, ConfigMap, Secret, ServiceAccount,
    TokenRequest, DeleteOptions, Eviction or PodDisruptionBudget."""
    if not body.startswith(_MAGIC):
        raise bad_request("a Kubernetes protobuf body starts with k8s\\x00")
    envelope = _fields(body[len(_MAGIC) :])
    type_meta = _fields(next(_bytes_of(envelope, 1), b""))
    api_version, kind = _string(type_meta, 1) or "", _string(type_meta, 2) or ""
    decoder = _KINDS.get(kind)
    if decoder is None:
        raise unsupported_media_type(
            f"{MEDIA_TYPE} for {kind or 'this kind'}: send JSON (e.g. kubectl create -f FILE)"
        )
    fields = _fields(b"".join(_bytes_of(envelope, 2)))
    meta = next((_object_meta(value) for value in _bytes_of(fields, 1)), {})
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **decoder(fields)}
