"""Objects in memory, as etcd and the API server's generic registry keep them.

One global resourceVersion counter orders every write. Each resource keeps a bounded history
of its changes so that a watch can resume from a resourceVersion; older ones are "expired"
(410 Gone), like after an etcd compaction. Deletion honours finalizers (the object only gets a
deletionTimestamp until the last finalizer is removed), and removing an object removes its
dependents (ownerReferences garbage collection, background propagation).
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from devstack.apiserver.errors import (
    ApiError,
    JsonObject,
    already_exists,
    conflict,
    gone,
    not_found,
)
from devstack.apiserver.registry import ResourceType

StorageKey = tuple[str, str]
ObjectKey = tuple[str, str]
"""(namespace, name); the namespace is "" for cluster-scoped objects."""

NAMESPACES: StorageKey = ("", "namespaces")


def now(later_by_seconds: int = 0) -> str:
    moment = datetime.now(UTC) + timedelta(seconds=later_by_seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Change:
    """One write, as a watch reports it; `old` is the object before (None when created)."""

    type: str
    object: JsonObject
    old: JsonObject | None
    resource_version: int


@dataclass(eq=False)
class Watch:
    """A subscription to the changes of one resource; changes arrive on `queue`."""

    key: StorageKey
    queue: asyncio.Queue[Change] = field(default_factory=asyncio.Queue)


def _without(obj: JsonObject, *fields: str) -> JsonObject:
    return {key: value for key, value in obj.items() if key not in fields}


class Store:
    """All objects of all resources, and their recent history for watches."""

    def __init__(self, history_size: int = 1000) -> None:
        self._history_size = history_size
        self._resource_version = 0
        self._objects: dict[StorageKey, dict[ObjectKey, JsonObject]] = {}
        self._types: dict[StorageKey, ResourceType] = {}
        self._history: dict[StorageKey, deque[Change]] = {}
        self._compacted: dict[StorageKey, int] = {}
        self._watches: dict[StorageKey, set[Watch]] = {}
        self.listeners: list[Callable[[StorageKey, Change], None]] = []
        """Called after every change, e.g. to register a CRD's types once it is stored."""

    @property
    def resource_version(self) -> int:
        return self._resource_version

    # -- reading ---------------------------------------------------------------------------

    def list(self, rt: ResourceType, namespace: str | None = None) -> list[JsonObject]:
        objects = self._objects.get(rt.key, {})
        return [
            copy.deepcopy(obj)
            for (obj_namespace, _), obj in sorted(objects.items())
            if namespace is None or obj_namespace == namespace
        ]

    def get(self, rt: ResourceType, namespace: str, name: str) -> JsonObject:
        obj = self._objects.get(rt.key, {}).get((namespace, name))
        if obj is None:
            raise not_found(rt.resource, name)
        return copy.deepcopy(obj)

    def exists(self, rt: ResourceType, namespace: str, name: str) -> bool:
        return (namespace, name) in self._objects.get(rt.key, {})

    # -- writing ---------------------------------------------------------------------------

    def _next_version(self) -> int:
        self._resource_version += 1
        return self._resource_version

    def _record(self, rt: ResourceType, change: Change) -> None:
        history = self._history.setdefault(rt.key, deque())
        if len(history) >= self._history_size:
            self._compacted[rt.key] = history.popleft().resource_version
        history.append(change)
        for watch in self._watches.get(rt.key, set()):
            watch.queue.put_nowait(change)
        for listener in self.listeners:
            listener(rt.key, change)

    def create(self, rt: ResourceType, obj: JsonObject, *, dry_run: bool = False) -> JsonObject:
        """Store a new object; the caller has admitted it (defaults, validation, name)."""
        meta = obj.setdefault("metadata", {})
        namespace, name = meta.get("namespace", ""), meta["name"]
        if self.exists(rt, namespace, name):
            raise already_exists(rt.resource, name)
        for server_set in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(server_set, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["generation"] = 1
        if dry_run:
            meta["resourceVersion"] = str(self._resource_version)
            return obj
        meta["resourceVersion"] = str(self._next_version())
        self._types[rt.key] = rt
        self._objects.setdefault(rt.key, {})[(namespace, name)] = copy.deepcopy(obj)
        self._record(rt, Change("ADDED", copy.deepcopy(obj), None, self._resource_version))
        return obj

    def update(self, rt: ResourceType, obj: JsonObject, *, dry_run: bool = False) -> JsonObject:
        """Replace an object with `obj` (already admitted). A metadata.resourceVersion in `obj`
        must be the current one (optimistic concurrency); server-owned metadata is kept."""
        meta = obj.setdefault("metadata", {})
        namespace, name = meta.get("namespace", ""), meta["name"]
        old = self.get(rt, namespace, name)
        old_meta = old["metadata"]
        if meta.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise conflict(rt.resource, name)
        for server_owned in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
            if server_owned in old_meta:
                meta[server_owned] = old_meta[server_owned]
            else:
                meta.pop(server_owned, None)
        meta.pop("managedFields", None)
        if "deletionTimestamp" in old_meta:
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{rt.resource} "{name}" is invalid: metadata.finalizers: Forbidden: no new '
                    f"finalizers can be added if the object is being deleted, found new "
                    f"finalizers {sorted(added)}",
                )
        ignored = ("metadata", "status") if rt.status_subresource else ("metadata",)
        if _without(obj, *ignored, "apiVersion", "kind") != _without(
            old, *ignored, "apiVersion", "kind"
        ):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if _without(obj, "apiVersion", "kind") == _without(old, "apiVersion", "kind"):
            return obj  # a no-op write changes nothing, not even the resourceVersion
        if dry_run:
            return obj
        if rt.key != NAMESPACES and self._deletion_finished(meta):
            return self._remove(rt, obj)  # a namespace goes once it is empty
        meta["resourceVersion"] = str(self._next_version())
        self._objects[rt.key][(namespace, name)] = copy.deepcopy(obj)
        self._record(rt, Change("MODIFIED", copy.deepcopy(obj), old, self._resource_version))
        return obj

    @staticmethod
    def _deletion_finished(meta: JsonObject) -> bool:
        """Being deleted, with no finalizer left and no grace period running."""
        return (
            "deletionTimestamp" in meta
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        )

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        grace_seconds: int = 0,
        dry_run: bool = False,
    ) -> tuple[JsonObject, bool]:
        """Delete now, or only mark as being deleted (deletionTimestamp) while finalizers remain
        or for a grace period (a pod on a node: its kubelet deletes it again with 0 once the
        containers have stopped); returns the object and whether it is gone."""
        obj = self.get(rt, namespace, name)
        meta = obj["metadata"]
        if rt.key == NAMESPACES:
            return self._delete_namespace(rt, obj, dry_run=dry_run)
        if grace_seconds > 0:
            current_grace = meta.get("deletionGracePeriodSeconds")
            if dry_run or (current_grace is not None and current_grace <= grace_seconds):
                return obj, False
            meta["deletionTimestamp"] = now(grace_seconds)
            meta["deletionGracePeriodSeconds"] = grace_seconds
            return self._write_server_change(rt, obj), False
        if not meta.get("finalizers"):
            return (obj if dry_run else self._remove(rt, obj)), True
        if meta.get("deletionGracePeriodSeconds") == 0 or dry_run:
            return obj, False
        meta.setdefault("deletionTimestamp", now())
        meta["deletionGracePeriodSeconds"] = 0
        return self._write_server_change(rt, obj), False

    def _write_server_change(self, rt: ResourceType, obj: JsonObject) -> JsonObject:
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        old = copy.deepcopy(self._objects[rt.key][key])
        meta["resourceVersion"] = str(self._next_version())
        self._objects[rt.key][key] = copy.deepcopy(obj)
        self._record(rt, Change("MODIFIED", copy.deepcopy(obj), old, self._resource_version))
        return obj

    def _remove(self, rt: ResourceType, obj: JsonObject) -> JsonObject:
        meta = obj["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        old = self._objects[rt.key].pop((namespace, name))
        meta["resourceVersion"] = str(self._next_version())
        self._record(rt, Change("DELETED", copy.deepcopy(obj), old, self._resource_version))
        self._collect_garbage(meta["uid"])
        if namespace:
            self._finish_namespace_if_empty(namespace)
        return obj

    # -- garbage collection and namespaces ---------------------------------------------------

    def _all(self) -> Iterator[tuple[ResourceType, JsonObject]]:
        for key, objects in list(self._objects.items()):
            for obj in list(objects.values()):
                yield self._types[key], obj

    def _collect_garbage(self, removed_uid: str) -> None:
        """Delete the dependents of a removed owner that have no other owner left."""
        live_uids = {obj["metadata"]["uid"] for _, obj in self._all()}
        for rt, obj in self._all():
            meta = obj["metadata"]
            owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
            orphaned = removed_uid in owners and not owners & live_uids
            if orphaned and self.exists(rt, meta.get("namespace", ""), meta["name"]):
                self.delete(rt, meta.get("namespace", ""), meta["name"])

    def _delete_namespace(
        self, rt: ResourceType, namespace_obj: JsonObject, *, dry_run: bool
    ) -> tuple[JsonObject, bool]:
        name = namespace_obj["metadata"]["name"]
        if dry_run:
            return namespace_obj, False
        if "deletionTimestamp" not in namespace_obj["metadata"]:
            namespace_obj["metadata"]["deletionTimestamp"] = now()
            namespace_obj.setdefault("status", {})["phase"] = "Terminating"
            self._write_server_change(rt, namespace_obj)
        for member_rt, obj in self._all():
            meta = obj["metadata"]
            if meta.get("namespace") == name and self.exists(member_rt, name, meta["name"]):
                self.delete(member_rt, name, meta["name"])
        if self.exists(rt, "", name):
            self._finish_namespace_if_empty(name)
        return namespace_obj, not self.exists(rt, "", name)

    def _finish_namespace_if_empty(self, namespace: str) -> None:
        namespace_obj = self._objects.get(NAMESPACES, {}).get(("", namespace))
        if namespace_obj is None or "deletionTimestamp" not in namespace_obj["metadata"]:
            return
        if any(obj["metadata"].get("namespace") == namespace for _, obj in self._all()):
            return
        self._remove(self._types[NAMESPACES], copy.deepcopy(namespace_obj))

    def drop_resource(self, rt: ResourceType) -> None:
        """Remove every object of a resource whose CRD is gone (each gets a DELETED event)."""
        for obj in self.list(rt):
            self._remove(rt, obj)

    # -- watching --------------------------------------------------------------------------

    def watch(self, rt: ResourceType, since: int | None) -> Watch:
        """Subscribe to changes after resourceVersion `since`; with None, the current objects
        come first as ADDED. A `since` older than the kept history is 410 Gone."""
        compacted = self._compacted.get(rt.key, 0)
        if since is not None and since < compacted:
            raise gone(f"too old resource version: {since} ({compacted})")
        watch = Watch(rt.key)
        if since is None:
            for obj in self.list(rt):
                version = int(obj["metadata"]["resourceVersion"])
                watch.queue.put_nowait(Change("ADDED", obj, None, version))
        else:
            for change in self._history.get(rt.key, ()):
                if change.resource_version > since:
                    watch.queue.put_nowait(change)
        self._watches.setdefault(rt.key, set()).add(watch)
        return watch

    def unwatch(self, watch: Watch) -> None:
        self._watches.get(watch.key, set()).discard(watch)
