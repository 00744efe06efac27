"""`kubectl get` output: meta.k8s.io/v1 Tables with the columns the API server would give."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from devstack.apiserver.errors import JsonObject
from devstack.apiserver.registry import PrinterColumn, ResourceType

TABLE_MEDIA_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"

_NAME = PrinterColumn(
    name="Name",
    type="string",
    json_path=".metadata.name",
    format="name",
    description="Name must be unique within a namespace.",
)
_AGE = PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp")
_STEP = re.compile(
    r"\.([A-Za-z0-9_-]+)|\[(\d+|\*)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]"
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Values at a simple JSONPath: .a.b, .a[0], .a[*].b, .a[?(@.type=="Ready")].status."""
    values = [obj]
    path = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    for match in _STEP.finditer(path):
        field, index, filter_field, filter_value = match.groups()
        found: list[Any] = []
        for value in values:
            if field is not None and isinstance(value, dict) and field in value:
                found.append(value[field])
            elif index == "*" and isinstance(value, list):
                found.extend(value)
            elif index is not None and index != "*" and isinstance(value, list):
                if int(index) < len(value):
                    found.append(value[int(index)])
            elif filter_field is not None and isinstance(value, list):
                found.extend(item for item in value if _has(item, filter_field, filter_value))
        values = found
    return values


def _has(item: Any, field: str, expected: str) -> bool:
    values = jsonpath(item, "." + field)
    return bool(values) and str(values[0]) == expected


def human_age(timestamp: str | None, at: datetime | None = None) -> str:
    """How long ago, the way kubectl prints it: 45s, 3m12s, 47m, 5h3m, 3d4h, 42d."""
    if not timestamp:
        return "<unknown>"
    then = datetime.fromisoformat(timestamp)  # RFC 3339: Z or an offset, maybe a fraction
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = int(((at or datetime.now(UTC)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d"


def _cell(column: PrinterColumn, obj: JsonObject) -> Any:
    values = jsonpath(obj, column.json_path)
    if not values:
        return None
    if column.type == "date":
        return human_age(values[0]) if isinstance(values[0], str) else None
    if len(values) == 1 and column.type in ("integer", "number", "boolean"):
        return values[0]
    return ",".join(value if isinstance(value, str) else json.dumps(value) for value in values)


def _definition(column: PrinterColumn) -> JsonObject:
    return {
        "name": column.name,
        "type": column.type,
        "format": column.format,
        "description": column.description,
        "priority": column.priority,
    }


# -- built-in kinds -----------------------------------------------------------------------


def _none(value: Any) -> Any:
    return "<none>" if value in (None, "") else value


def _pod_status(pod: JsonObject) -> str:
    status = pod.get("status", {})
    if "deletionTimestamp" in pod.get("metadata", {}):
        return "Terminating"
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for container in status.get("containerStatuses") or []:
        state = container.get("state", {})
        waiting = state.get("waiting", {}).get("reason")
        terminated = state.get("terminated", {}).get("reason")
        if (waiting and waiting != "ContainerCreating") or terminated:
            reason = waiting or terminated
    return str(reason)


def _pod_row(pod: JsonObject) -> list[Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    containers = pod.get("spec", {}).get("containers") or []
    ready = sum(1 for status in statuses if status.get("ready"))
    restarts = sum(int(status.get("restartCount", 0)) for status in statuses)
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        _pod_status(pod),
        restarts,
        human_age(pod["metadata"].get("creationTimestamp")),
        _none(pod.get("status", {}).get("podIP")),
        _none(pod.get("spec", {}).get("nodeName")),
        "<none>",
        "<none>",
    ]


def _event_row(event: JsonObject) -> list[Any]:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    event_time = event.get("eventTime")
    last = (
        event.get("lastTimestamp")
        or (event_time[:19] + "Z" if event_time else None)
        or event["metadata"].get("creationTimestamp")
    )
    first = event.get("firstTimestamp") or event["metadata"].get("creationTimestamp")
    source = event.get("source", {}).get("component") or event.get("reportingController", "")
    return [
        human_age(last),
        event.get("type", ""),
        event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        event.get("message") or event.get("note", ""),
        involved.get("fieldPath", ""),
        source,
        human_age(first),
        event.get("count", 1),
        event["metadata"]["name"],
    ]


def _node_row(node: JsonObject) -> list[Any]:
    """Status is Ready/NotReady/Unknown, then SchedulingDisabled when cordoned."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    states = [] if ready is None else ["Ready" if ready.get("status") == "True" else "NotReady"]
    states = states or ["Unknown"]
    if spec.get("unschedulable"):
        states.append("SchedulingDisabled")
    labels = node["metadata"].get("labels") or {}
    roles = sorted(
        key.removeprefix("node-role.kubernetes.io/")
        for key in labels
        if key.startswith("node-role.kubernetes.io/")
    )
    if labels.get("kubernetes.io/role"):
        roles.append(labels["kubernetes.io/role"])
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [
        node["metadata"]["name"],
        ",".join(states),
        ",".join(roles) or "<none>",
        human_age(node["metadata"].get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP") or "<none>",
        addresses.get("ExternalIP") or "<none>",
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _budget_row(budget: JsonObject) -> list[Any]:
    spec, status = budget.get("spec") or {}, budget.get("status") or {}
    return [
        budget["metadata"]["name"],
        "N/A" if spec.get("minAvailable") is None else str(spec["minAvailable"]),
        "N/A" if spec.get("maxUnavailable") is None else str(spec["maxUnavailable"]),
        int(status.get("disruptionsAllowed", 0)),
        human_age(budget["metadata"].get("creationTimestamp")),
    ]


def _builtin_columns(names: list[tuple[str, str, int]]) -> list[PrinterColumn]:
    return [
        PrinterColumn(name=name, type=kind, json_path="", priority=priority)
        for name, kind, priority in names
    ]


_BUILTIN: dict[tuple[str, str], tuple[list[PrinterColumn], Callable[[JsonObject], list[Any]]]] = {
    ("", "pods"): (
        _builtin_columns(
            [
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Status", "string", 0),
                ("Restarts", "string", 0),
                ("Age", "string", 0),
                ("IP", "string", 1),
                ("Node", "string", 1),
                ("Nominated Node", "string", 1),
                ("Readiness Gates", "string", 1),
            ]
        ),
        _pod_row,
    ),
    ("", "events"): (
        _builtin_columns(
            [
                ("Last Seen", "string", 0),
                ("Type", "string", 0),
                ("Reason", "string", 0),
                ("Object", "string", 0),
                ("Message", "string", 0),
                ("Subobject", "string", 1),
                ("Source", "string", 1),
                ("First Seen", "string", 1),
                ("Count", "integer", 1),
                ("Name", "string", 1),
            ]
        ),
        _event_row,
    ),
    ("apps", "deployments"): (
        _builtin_columns(
            [
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Up-to-date", "string", 0),
                ("Available", "string", 0),
                ("Age", "string", 0),
            ]
        ),
        lambda deployment: [
            deployment["metadata"]["name"],
            f"{deployment.get('status', {}).get('readyReplicas', 0)}/"
            f"{deployment.get('spec', {}).get('replicas', 1)}",
            deployment.get("status", {}).get("updatedReplicas", 0),
            deployment.get("status", {}).get("availableReplicas", 0),
            human_age(deployment["metadata"].get("creationTimestamp")),
        ],
    ),
    ("apps", "replicasets"): (
        _builtin_columns(
            [
                ("Name", "string", 0),
                ("Desired", "integer", 0),
                ("Current", "integer", 0),
                ("Ready", "integer", 0),
                ("Age", "string", 0),
            ]
        ),
        lambda replica_set: [
            replica_set["metadata"]["name"],
            replica_set.get("spec", {}).get("replicas", 1),
            replica_set.get("status", {}).get("replicas", 0),
            replica_set.get("status", {}).get("readyReplicas", 0),
            human_age(replica_set["metadata"].get("creationTimestamp")),
        ],
    ),
    ("", "nodes"): (
        _builtin_columns(
            [
                ("Name", "string", 0),
                ("Status", "string", 0),
                ("Roles", "string", 0),
                ("Age", "string", 0),
                ("Version", "string", 0),
                ("Internal-IP", "string", 1),
                ("External-IP", "string", 1),
                ("OS-Image", "string", 1),
                ("Kernel-Version", "string", 1),
                ("Container-Runtime", "string", 1),
            ]
        ),
        _node_row,
    ),
    ("policy", "poddisruptionbudgets"): (
        _builtin_columns(
            [
                ("Name", "string", 0),
                ("Min Available", "string", 0),
                ("Max Unavailable", "string", 0),
                ("Allowed Disruptions", "integer", 0),
                ("Age", "string", 0),
            ]
        ),
        _budget_row,
    ),
    ("", "namespaces"): (
        _builtin_columns([("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)]),
        lambda ns: [
            ns["metadata"]["name"],
            ns.get("status", {}).get("phase", "Active"),
            human_age(ns["metadata"].get("creationTimestamp")),
        ],
    ),
}


def table(
    rt: ResourceType, objects: list[JsonObject], resource_version: str, include_object: str
) -> JsonObject:
    """The Table for these objects; `include_object` is None, Object or Metadata (the default)."""
    builtin = _BUILTIN.get(rt.key)
    if builtin is not None:
        columns, row_of = builtin
    else:
        columns = [_NAME, *rt.printer_columns] if rt.printer_columns else [_NAME, _AGE]

        def row_of(obj: JsonObject) -> list[Any]:
            return [_cell(column, obj) for column in columns]

    rows = []
    for obj in objects:
        row: JsonObject = {"cells": row_of(obj)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata", {}),
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [_definition(column) for column in columns],
        "rows": rows,
    }
