"""The controller of the local control plane: kube-controller-manager's part that a Helm
install needs. `smoothscale dev controllers` runs it as an ordinary client of the API.

- Deployments: each Deployment's pods are created from its template (labelled with the
  template's hash, `pod-template-hash`, owned by the Deployment), and replaced when the template
  changes: Recreate deletes the old pods and waits for them to be gone before it creates new
  ones; RollingUpdate creates up to maxSurge new pods beside the old ones and deletes old pods
  while at least replicas - maxUnavailable are ready. The status says what `kubectl rollout
  status` and Helm read: observedGeneration, replicas, updatedReplicas, readyReplicas,
  availableReplicas, unavailableReplicas, and the Available and Progressing conditions
  (NewReplicaSetAvailable once done, ProgressDeadlineExceeded after progressDeadlineSeconds
  without progress). Unlike Kubernetes there are no ReplicaSets: the Deployment owns its pods,
  and the API server's garbage collector deletes them with it.

The process kubelet then runs the pods like any other.
"""

import hashlib
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from smoothscale.kubeapi import MERGE_PATCH, JsonObject, KubeApi, KubeApiError

logger = logging.getLogger("smoothscale.controllers")

TEMPLATE_HASH_LABEL = "pod-template-hash"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(timestamp: str) -> float:
    return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def template_hash(template: JsonObject) -> str:
    """A short, stable name for a pod template (what pod-template-hash holds)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    number = int.from_bytes(digest[:8], "big")
    letters = []
    for _ in range(10):
        number, index = divmod(number, len(_NAME_ALPHABET))
        letters.append(_NAME_ALPHABET[index])
    return "".join(letters)


def _key(obj: JsonObject) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


def _version(obj: JsonObject) -> int:
    return int(obj["metadata"].get("resourceVersion") or 0)


class Informer:
    """A cache of one collection, kept by list + watch; calls `on_change` after each change.

    The controller also puts the answers of its own writes in (`remember`, `forget`), so that
    its next pass sees them even before their watch events arrive; an older version never
    replaces a newer one, nor brings back an object deleted since.
    """

    def __init__(
        self,
        api: KubeApi,
        path: str,
        on_change: Callable[[], None],
        stopping: threading.Event,
        watch_timeout_seconds: int = 30,
    ) -> None:
        self.api = api
        self.path = path
        self._on_change = on_change
        self._stopping = stopping
        self._watch_timeout = watch_timeout_seconds
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], JsonObject] = {}
        self._deleted: dict[tuple[str, str], int] = {}
        """The resourceVersion each object was deleted at (so a late answer cannot revive it)."""
        self.synced = threading.Event()

    def objects(self) -> list[JsonObject]:
        with self._lock:
            return list(self._objects.values())

    def remember(self, obj: JsonObject) -> None:
        with self._lock:
            key = _key(obj)
            known = self._objects.get(key)
            if self._deleted.get(key, -1) >= _version(obj):
                return
            if known is None or _version(known) <= _version(obj):
                self._objects[key] = obj

    def forget(self, obj: JsonObject) -> None:
        with self._lock:
            key = _key(obj)
            self._deleted[key] = max(self._deleted.get(key, -1), _version(obj))
            known = self._objects.get(key)
            if known is not None and _version(known) <= _version(obj):
                del self._objects[key]

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.api.request("GET", self.path)
                with self._lock:
                    self._objects = {_key(obj): obj for obj in listing.get("items") or []}
                    self._deleted = {}
                self.synced.set()
                self._on_change()
                version = str(listing["metadata"]["resourceVersion"])
                while not self._stopping.is_set():
                    version = self._follow(version)
            except KubeApiError as error:
                if error.status != 410:  # 410: the version expired, list again at once
                    logger.warning("watching %s: %s; listing again", self.path, error)
                    self._stopping.wait(1.0)
            except Exception:  # a malformed answer must not end the watch for good
                logger.exception("watching %s failed; listing again", self.path)
                self._stopping.wait(1.0)

    def _follow(self, version: str) -> str:
        for event in self.api.watch(self.path, version, self._watch_timeout):
            obj = event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion", version))
            if event["type"] in ("ADDED", "MODIFIED"):
                self.remember(obj)
            elif event["type"] == "DELETED":
                self.forget(obj)
            else:
                continue
            self._on_change()
            if self._stopping.is_set():
                break
        return version


def _ready(pod: JsonObject) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _controller_uid(pod: JsonObject) -> str | None:
    for reference in pod["metadata"].get("ownerReferences") or []:
        if reference.get("controller") and reference.get("kind") == "Deployment":
            return str(reference.get("uid"))
    return None


def resolve_count(value: int | str | None, replicas: int, *, round_up: bool) -> int:
    """maxSurge / maxUnavailable: a number, or a percentage of the replicas."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        return int(text)
    exact = int(text[:-1]) * replicas / 100
    return math.ceil(exact) if round_up else math.floor(exact)


@dataclass(frozen=True)
class Rollout:
    """How far a Deployment is, from its pods."""

    replicas: int
    updated: int
    ready: int
    old: int
    """Old-template pods still there, terminating ones included."""

    def complete(self, wanted: int) -> bool:
        return (
            self.updated == wanted
            and self.replicas == wanted
            and self.ready == wanted
            and (self.old == 0)
        )


class DeploymentController:
    """Runs each Deployment's pods and keeps its status; see the module docstring."""

    def __init__(self, api: KubeApi, deployments: Informer, pods: Informer) -> None:
        self.api = api
        self.deployments = deployments
        self.pods = pods

    def sync(self) -> None:
        pods = self.pods.objects()
        for deployment in self.deployments.objects():
            if "deletionTimestamp" in deployment["metadata"]:
                continue
            uid = deployment["metadata"]["uid"]
            owned = [pod for pod in pods if _controller_uid(pod) == uid]
            try:
                self.sync_one(deployment, owned)
            except KubeApiError as error:
                if error.status not in (404, 409):
                    logger.warning("deployment %s/%s: %s", *_key(deployment), error)

    def sync_one(self, deployment: JsonObject, owned: list[JsonObject]) -> None:
        spec = deployment.get("spec") or {}
        wanted = int(spec.get("replicas", 1))
        current_hash = template_hash(spec.get("template") or {})
        live = [pod for pod in owned if "deletionTimestamp" not in pod["metadata"]]
        new = [pod for pod in live if _hash_of(pod) == current_hash]
        old = [pod for pod in live if _hash_of(pod) != current_hash]
        old_anywhere = [pod for pod in owned if _hash_of(pod) != current_hash]
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate":
            for pod in old:
                self._delete(pod)
            if not old_anywhere:
                self._scale(deployment, new, wanted, current_hash)
        else:
            rolling = strategy.get("rollingUpdate") or {}
            surge = resolve_count(rolling.get("maxSurge", "25%"), wanted, round_up=True)
            unavailable = resolve_count(
                rolling.get("maxUnavailable", "25%"), wanted, round_up=False
            )
            if surge == 0 and unavailable == 0:
                unavailable = 1
            room = max(0, wanted + surge - len(live))
            self._scale(deployment, new, min(wanted, len(new) + room), current_hash)
            for pod in [pod for pod in old if not _ready(pod)]:
                self._delete(pod)
            ready_old = [pod for pod in old if _ready(pod)]
            ready_now = sum(1 for pod in new if _ready(pod)) + len(ready_old)
            for pod in ready_old[: max(0, ready_now - (wanted - unavailable))]:
                self._delete(pod)
        self._record(deployment, current_hash)

    def _scale(
        self, deployment: JsonObject, new: list[JsonObject], count: int, current_hash: str
    ) -> None:
        for _ in range(count - len(new)):
            self._create_pod(deployment, current_hash)
        surplus = sorted(new, key=_ready)[: max(0, len(new) - count)]
        for pod in surplus:
            self._delete(pod)

    def _create_pod(self, deployment: JsonObject, current_hash: str) -> None:
        meta = deployment["metadata"]
        template = deployment["spec"].get("template") or {}
        template_meta = template.get("metadata") or {}
        suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{current_hash}-{suffix}",
                "namespace": meta["namespace"],
                "labels": {
                    **(template_meta.get("labels") or {}),
                    TEMPLATE_HASH_LABEL: current_hash,
                },
                "annotations": dict(template_meta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template.get("spec") or {},
        }
        created = self.api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", body=pod)
        self.pods.remember(created)
        logger.info(
            "deployment %s/%s: created pod %s",
            meta["namespace"],
            meta["name"],
            created["metadata"]["name"],
        )

    def _delete(self, pod: JsonObject) -> None:
        namespace, name = _key(pod)
        try:
            answer = self.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeApiError as error:
            if error.status != 404:
                raise
            return
        if answer.get("kind") == "Pod" and "deletionTimestamp" in answer["metadata"]:
            self.pods.remember(answer)  # terminating: its kubelet stops it, then removes it
        elif answer.get("kind") == "Pod":
            self.pods.forget(answer)
        logger.info("deleted pod %s/%s", namespace, name)

    def _record(self, deployment: JsonObject, current_hash: str) -> None:
        """Write the status `kubectl rollout status` and Helm read, when it changed."""
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        wanted = int(spec.get("replicas", 1))
        pods = self.pods.objects()
        owned_now = [pod for pod in pods if _controller_uid(pod) == meta["uid"]]
        live = [pod for pod in owned_now if "deletionTimestamp" not in pod["metadata"]]
        rollout = Rollout(
            replicas=len(live),
            updated=sum(1 for pod in live if _hash_of(pod) == current_hash),
            ready=sum(1 for pod in live if _ready(pod)),
            old=sum(1 for pod in owned_now if _hash_of(pod) != current_hash),
        )
        previous: JsonObject = deployment.get("status") or {}
        counts = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": rollout.replicas,
            "updatedReplicas": rollout.updated,
            "readyReplicas": rollout.ready,
            "availableReplicas": rollout.ready,
            "unavailableReplicas": max(0, wanted - rollout.ready),
        }
        strategy = spec.get("strategy") or {}
        unavailable = 0
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            rolling = strategy.get("rollingUpdate") or {}
            unavailable = resolve_count(
                rolling.get("maxUnavailable", "25%"), wanted, round_up=False
            )
        conditions = {c["type"]: c for c in previous.get("conditions") or []}
        available = rollout.ready >= wanted - unavailable
        conditions["Available"] = _condition(
            conditions.get("Available"),
            "Available",
            available,
            "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "Deployment has minimum availability."
            if available
            else "Deployment does not have minimum availability.",
        )
        replica_set = f"{meta['name']}-{current_hash}"
        progressed = any(previous.get(k) != v for k, v in counts.items())
        old_progress = conditions.get("Progressing")
        if rollout.complete(wanted):
            progressing = _condition(
                old_progress,
                "Progressing",
                True,
                "NewReplicaSetAvailable",
                f'ReplicaSet "{replica_set}" has successfully progressed.',
            )
        elif (
            progressed
            or old_progress is None
            or old_progress.get("reason") == ("NewReplicaSetAvailable")
        ):
            progressing = _condition(
                old_progress,
                "Progressing",
                True,
                "ReplicaSetUpdated",
                f'ReplicaSet "{replica_set}" is progressing.',
                touch=True,
            )
        elif time.time() - _parse(old_progress["lastUpdateTime"]) > int(
            spec.get("progressDeadlineSeconds", 600)
        ):
            progressing = _condition(
                old_progress,
                "Progressing",
                False,
                "ProgressDeadlineExceeded",
                f'ReplicaSet "{replica_set}" has timed out progressing.',
            )
        else:
            progressing = old_progress
        conditions["Progressing"] = progressing
        status = {**counts, "conditions": [conditions["Available"], conditions["Progressing"]]}
        if status == previous:
            return
        answer = self.api.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{meta['namespace']}/deployments/{meta['name']}/status",
            body={"status": status},
            content_type=MERGE_PATCH,
        )
        self.deployments.remember(answer)


def _hash_of(pod: JsonObject) -> str | None:
    labels: dict[str, str] = pod["metadata"].get("labels") or {}
    return labels.get(TEMPLATE_HASH_LABEL)


def _condition(
    old: JsonObject | None,
    kind: str,
    status: bool,
    reason: str,
    message: str,
    *,
    touch: bool = False,
) -> JsonObject:
    """A Deployment condition; its times move only when its status changes (or, `touch`,
    when the Deployment progressed)."""
    text = "True" if status else "False"
    now = _now()
    same = old is not None and old.get("status") == text
    changed = old is None or (old.get("status"), old.get("reason")) != (text, reason)
    return {
        "type": kind,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": old["lastTransitionTime"] if same and old else now,
        "lastUpdateTime": now if (touch or changed or old is None) else old["lastUpdateTime"],
    }


class ControllerManager:
    """The controllers, each pass over everything; a pass runs after any change (at most
    every 0.1 s) and every `resync_seconds` (progress deadlines)."""

    def __init__(self, api: KubeApi, resync_seconds: float = 5.0) -> None:
        self.api = api
        self.resync_seconds = resync_seconds
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self.deployments = self._informer("/apis/apps/v1/deployments")
        self.pods = self._informer("/api/v1/pods")
        self.deployment_controller = DeploymentController(api, self.deployments, self.pods)
        self._threads = [
            threading.Thread(target=i.run, name=f"controllers-watch-{n}", daemon=True)
            for n, i in (("deployments", self.deployments), ("pods", self.pods))
        ]
        self._threads.append(threading.Thread(target=self._loop, name="controllers", daemon=True))

    def _informer(self, path: str) -> Informer:
        return Informer(self.api, path, self._wake.set, self._stopping)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._threads[-1].join(timeout=10)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.resync_seconds)
            self._wake.clear()
            if not (self.deployments.synced.is_set() and self.pods.synced.is_set()):
                continue
            try:
                self.deployment_controller.sync()
            except Exception:
                logger.exception("syncing Deployments failed")
            self._stopping.wait(0.1)
