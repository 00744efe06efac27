"""The PATCH formats: JSON patch, JSON merge patch, strategic merge patch and (simplified)
server-side apply."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from devstack.apiserver.errors import ApiError, JsonObject, bad_request

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Lists of the core kinds that strategic merge patch merges item by item, by this key (the
# patchMergeKey of the Kubernetes Go types); any other list is replaced as a whole.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "conditions": "type",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
# Lists of scalars that strategic merge patch merges as sets.
_MERGED_SCALAR_LISTS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: JsonObject, patch: Any) -> JsonObject:
    """RFC 6902 operations; a failed `test` or a missing path is a 422 like the API server's."""
    if not isinstance(patch, list):
        raise bad_request("a JSON patch must be a list of operations")
    try:
        result = jsonpatch.apply_patch(target, patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
        raise ApiError(422, "Invalid", f"the JSON patch could not be applied: {error}") from None
    if not isinstance(result, dict):
        raise ApiError(422, "Invalid", "the JSON patch replaced the object with a non-object")
    return result


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        has_container_port = any(
            isinstance(item, dict) and "containerPort" in item for item in items
        )
        return "containerPort" if has_container_port else "port"
    return _MERGE_KEYS.get(field)


def _merge_list(field: str, original: list[Any], patch: list[Any]) -> list[Any]:
    if field in _MERGED_SCALAR_LISTS:
        return [*original, *(item for item in patch if item not in original)]
    key = _merge_key(field, [*original, *patch])
    if key is None:
        return [item for item in copy.deepcopy(patch) if not _is_directive_item(item)]
    result = copy.deepcopy(original)
    for item in patch:
        if not isinstance(item, dict):
            continue
        matches = [
            index
            for index, old in enumerate(result)
            if isinstance(old, dict) and old.get(key) == item.get(key)
        ]
        if item.get("$patch") == "delete":
            result = [old for index, old in enumerate(result) if index not in matches]
        elif matches:
            result[matches[0]] = strategic_merge_patch(result[matches[0]], item)
        else:
            result.append(strategic_merge_patch({}, item))
    return result


def _is_directive_item(item: Any) -> bool:
    return isinstance(item, dict) and "$patch" in item


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge patch, for the lists of the core kinds that kubectl touches:
    lists with a merge key merge item by item, `$patch: delete|replace` and
    `$deleteFromPrimitiveList` are honoured, `$setElementOrder` and `$retainKeys` are ignored."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {key: copy.deepcopy(value) for key, value in patch.items() if key != "$patch"}
    if directive == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.removeprefix("$deleteFromPrimitiveList/")
            result[field] = [item for item in result.get(field, []) if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = _merge_list(key, [], value)
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def apply_patch(target: JsonObject | None, applied: JsonObject) -> JsonObject:
    """Server-side apply, simplified: the applied configuration is merged into the live object
    (objects merge, lists and scalars replace). Field ownership (managedFields) is not tracked,
    so fields a manager stops applying are not removed and there are no apply conflicts."""

    def merge(live: Any, config: Any) -> Any:
        if isinstance(live, dict) and isinstance(config, dict):
            result = copy.deepcopy(live)
            for key, value in config.items():
                result[key] = merge(live.get(key), value)
            return result
        return copy.deepcopy(config)

    merged: JsonObject = merge(target or {}, applied)
    return merged
