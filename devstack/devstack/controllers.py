"""The controllers of the local control plane: kube-controller-manager's part that a Helm
install needs. `smoothscale dev controllers` runs them as an ordinary client of the API.

- Deployments: each pod template of a Deployment gets a ReplicaSet (named and labelled with the
  template's hash, `pod-template-hash`, owned by the Deployment, with its revision); a changed
  template is rolled out by scaling them: Recreate scales the old ones to 0 and waits for their
  pods to be gone before it scales the new one up; RollingUpdate grows the new one by up to
  maxSurge and shrinks the old ones (their unready pods first) while at least replicas -
  maxUnavailable pods are ready. The status says what `kubectl rollout
  status` and Helm read: observedGeneration, replicas, updatedReplicas, readyReplicas,
  availableReplicas, unavailableReplicas, and the Available and Progressing conditions
  (NewReplicaSetAvailable once done, ProgressDeadlineExceeded after progressDeadlineSeconds
  without progress).
- ReplicaSets: each one's pods are created from its template (owned by it) or deleted (unready
  ones first) until they are spec.replicas, and its status counts them. Deleting a Deployment
  deletes its ReplicaSets and their pods (the API server's garbage collector).
- PodDisruptionBudgets (the disruption controller): each budget's status counts the pods it
  selects: expectedPods, desiredHealthy (minAvailable, or expectedPods - maxUnavailable; a
  percentage or a maxUnavailable takes expectedPods from the pods' controllers' scale:
  ReplicaSets, Deployments, or any controller with a scale subresource, a StreamingApp say),
  currentHealthy (Ready, not being deleted, not evicted in the last two minutes),
  disruptionsAllowed and the DisruptionAllowed condition, at the budget's observedGeneration:
  what the API server's eviction subresource reads.

The process kubelet then runs the pods like any other.
"""

import hashlib
import json
import logging
import math
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from devstack.disruption import (
    count_healthy,
    is_ready,
    recently_disrupted,
    selector_matches,
    with_disruption_allowed_condition,
)
from smoothscale.kubeapi import MERGE_PATCH, JsonObject, KubeApi, KubeApiError

logger = logging.getLogger("devstack.controllers")

TEMPLATE_HASH_LABEL = "pod-template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
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

    def by_uid(self, uid: str) -> JsonObject | None:
        return next((obj for obj in self.objects() if obj["metadata"]["uid"] == uid), None)

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


def _sync_each(
    objects: list[JsonObject], sync_one: Callable[[JsonObject], None], what: str
) -> None:
    """`sync_one` each object; an object gone or changed meanwhile (404, 409) waits for the next
    pass, any other error is logged."""
    for obj in objects:
        try:
            sync_one(obj)
        except KubeApiError as error:
            if error.status not in (404, 409):
                logger.warning("%s %s/%s: %s", what, *_key(obj), error)


def _controller_uid(obj: JsonObject, kind: str) -> str | None:
    """The uid of the object's controller, when that is a `kind`."""
    for reference in obj["metadata"].get("ownerReferences") or []:
        if reference.get("controller") and reference.get("kind") == kind:
            return str(reference.get("uid"))
    return None


def _owner_reference(owner: JsonObject, kind: str) -> JsonObject:
    meta = owner["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _terminating(obj: JsonObject) -> bool:
    return "deletionTimestamp" in obj["metadata"]


def _spec_replicas(replica_set: JsonObject) -> int:
    return int((replica_set.get("spec") or {}).get("replicas", 0))


def _revision(replica_set: JsonObject) -> int:
    annotations = replica_set["metadata"].get("annotations") or {}
    return int(annotations.get(REVISION_ANNOTATION, 0))


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
        return self.updated == self.replicas == self.ready == wanted and self.old == 0


class DeploymentController:
    """Scales each Deployment's ReplicaSets (one per pod template) and keeps its status; see
    the module docstring."""

    def __init__(
        self, api: KubeApi, deployments: Informer, replica_sets: Informer, pods: Informer
    ) -> None:
        self.api = api
        self.deployments = deployments
        self.replica_sets = replica_sets
        self.pods = pods

    def sync(self) -> None:
        replica_sets = self.replica_sets.objects()
        for deployment in self.deployments.objects():
            if _terminating(deployment):
                continue
            uid = deployment["metadata"]["uid"]
            owned = [rs for rs in replica_sets if _controller_uid(rs, "Deployment") == uid]
            try:
                self.sync_one(deployment, owned)
            except KubeApiError as error:
                if error.status not in (404, 409):
                    logger.warning("deployment %s/%s: %s", *_key(deployment), error)

    def _pods_of(self, replica_set: JsonObject, *, terminating: bool = False) -> list[JsonObject]:
        uid = replica_set["metadata"]["uid"]
        return [
            pod
            for pod in self.pods.objects()
            if _controller_uid(pod, "ReplicaSet") == uid and (terminating or not _terminating(pod))
        ]

    def sync_one(self, deployment: JsonObject, replica_sets: list[JsonObject]) -> None:
        spec = deployment.get("spec") or {}
        wanted = int(spec.get("replicas", 1))
        current_hash = template_hash(spec.get("template") or {})
        live_sets = [rs for rs in replica_sets if not _terminating(rs)]
        current = next((rs for rs in live_sets if _hash_of(rs) == current_hash), None)
        if current is None:
            current = self._create_replica_set(deployment, current_hash, replica_sets)
        old_sets = sorted((rs for rs in live_sets if _hash_of(rs) != current_hash), key=_revision)
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate":
            for replica_set in old_sets:
                if _spec_replicas(replica_set) > 0:
                    self._scale(replica_set, 0)
            if not any(self._pods_of(rs, terminating=True) for rs in old_sets):
                self._scale(current, wanted)
        else:
            self._roll(spec, wanted, current, old_sets)
        self._record(deployment, current, old_sets)

    def _roll(
        self,
        spec: JsonObject,
        wanted: int,
        current: JsonObject,
        old_sets: list[JsonObject],
    ) -> None:
        """RollingUpdate: grow the new ReplicaSet within maxSurge, shrink the old ones (their
        unready pods first) while replicas - maxUnavailable pods stay ready."""
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        surge = resolve_count(rolling.get("maxSurge", "25%"), wanted, round_up=True)
        unavailable = resolve_count(rolling.get("maxUnavailable", "25%"), wanted, round_up=False)
        if surge == 0 and unavailable == 0:
            unavailable = 1
        total = sum(_spec_replicas(rs) for rs in [current, *old_sets])
        room = max(0, wanted + surge - total)
        self._scale(current, min(wanted, _spec_replicas(current) + room))
        new_ready = sum(1 for pod in self._pods_of(current) if is_ready(pod))
        old_pods = {rs["metadata"]["name"]: self._pods_of(rs) for rs in old_sets}
        ready_now = new_ready + sum(is_ready(pod) for pods in old_pods.values() for pod in pods)
        removable = max(0, ready_now - (wanted - unavailable))
        for replica_set in old_sets:
            pods = old_pods[replica_set["metadata"]["name"]]
            unready = sum(1 for pod in pods if not is_ready(pod))
            take = min(len(pods) - unready, removable)
            removable -= take
            target = max(0, min(_spec_replicas(replica_set), len(pods)) - unready - take)
            if target != _spec_replicas(replica_set):
                self._scale(replica_set, target)

    def _create_replica_set(
        self, deployment: JsonObject, current_hash: str, replica_sets: list[JsonObject]
    ) -> JsonObject:
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        template = spec.get("template") or {}
        template_meta = template.get("metadata") or {}
        labels = {**(template_meta.get("labels") or {}), TEMPLATE_HASH_LABEL: current_hash}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        revision = 1 + max((_revision(rs) for rs in replica_sets), default=0)
        replica_set = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{meta['name']}-{current_hash}",
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": {REVISION_ANNOTATION: str(revision)},
                "ownerReferences": [_owner_reference(deployment, "Deployment")],
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {**selector, TEMPLATE_HASH_LABEL: current_hash}},
                "template": {
                    "metadata": {**template_meta, "labels": labels},
                    "spec": template.get("spec") or {},
                },
            },
        }
        created = self.api.request(
            "POST",
            f"/apis/apps/v1/namespaces/{meta['namespace']}/replicasets",
            body=replica_set,
        )
        self.replica_sets.remember(created)
        logger.info("deployment %s/%s: created replica set %s", *_key(deployment), current_hash)
        return created

    def _scale(self, replica_set: JsonObject, replicas: int) -> None:
        if replicas == _spec_replicas(replica_set):
            return
        namespace, name = _key(replica_set)
        answer = self.api.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/replicasets/{name}",
            body={"spec": {"replicas": replicas}},
            content_type=MERGE_PATCH,
        )
        self.replica_sets.remember(answer)
        replica_set.setdefault("spec", {})["replicas"] = replicas

    def _record(
        self, deployment: JsonObject, current: JsonObject, old_sets: list[JsonObject]
    ) -> None:
        """Write the status `kubectl rollout status` and Helm read, when it changed."""
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        wanted = int(spec.get("replicas", 1))
        new_pods = self._pods_of(current)
        old_pods = [pod for rs in old_sets for pod in self._pods_of(rs, terminating=True)]
        live = new_pods + [pod for pod in old_pods if not _terminating(pod)]
        rollout = Rollout(
            replicas=len(live),
            updated=len(new_pods),
            ready=sum(1 for pod in live if is_ready(pod)),
            old=len(old_pods),
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
        replica_set = current["metadata"]["name"]
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


class ReplicaSetController:
    """Keeps each ReplicaSet's pods at its spec.replicas (deleting unready pods first) and its
    status current."""

    def __init__(self, api: KubeApi, replica_sets: Informer, pods: Informer) -> None:
        self.api = api
        self.replica_sets = replica_sets
        self.pods = pods

    def sync(self) -> None:
        live = [rs for rs in self.replica_sets.objects() if not _terminating(rs)]
        _sync_each(live, self.sync_one, "replica set")

    def _live_pods(self, replica_set: JsonObject) -> list[JsonObject]:
        uid = replica_set["metadata"]["uid"]
        return [
            pod
            for pod in self.pods.objects()
            if _controller_uid(pod, "ReplicaSet") == uid and not _terminating(pod)
        ]

    def sync_one(self, replica_set: JsonObject) -> None:
        wanted = _spec_replicas(replica_set)
        live = self._live_pods(replica_set)
        for _ in range(wanted - len(live)):
            self._create_pod(replica_set)
        for pod in sorted(live, key=is_ready)[: max(0, len(live) - wanted)]:
            self._delete(pod)
        live = self._live_pods(replica_set)
        ready = sum(1 for pod in live if is_ready(pod))
        status = {
            "replicas": len(live),
            "fullyLabeledReplicas": len(live),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": replica_set["metadata"].get("generation", 1),
        }
        if status == (replica_set.get("status") or {}):
            return
        namespace, name = _key(replica_set)
        answer = self.api.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/replicasets/{name}/status",
            body={"status": status},
            content_type=MERGE_PATCH,
        )
        self.replica_sets.remember(answer)

    def _create_pod(self, replica_set: JsonObject) -> None:
        namespace, name = _key(replica_set)
        template = replica_set["spec"].get("template") or {}
        template_meta = template.get("metadata") or {}
        suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{suffix}",
                "namespace": namespace,
                "labels": dict(template_meta.get("labels") or {}),
                "annotations": dict(template_meta.get("annotations") or {}),
                "ownerReferences": [_owner_reference(replica_set, "ReplicaSet")],
            },
            "spec": template.get("spec") or {},
        }
        created = self.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
        self.pods.remember(created)
        logger.info(
            "replica set %s/%s: created pod %s", namespace, name, created["metadata"]["name"]
        )

    def _delete(self, pod: JsonObject) -> None:
        namespace, name = _key(pod)
        try:
            answer = self.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeApiError as error:
            if error.status != 404:
                raise
            return
        if answer.get("kind") == "Pod" and _terminating(answer):
            self.pods.remember(answer)  # terminating: its kubelet stops it, then removes it
        elif answer.get("kind") == "Pod":
            self.pods.forget(answer)
        logger.info("deleted pod %s/%s", namespace, name)


class ExpectedCountError(Exception):
    """The pods' controllers cannot say how many pods there should be."""


def _controller_reference(obj: JsonObject) -> JsonObject | None:
    references = obj["metadata"].get("ownerReferences") or []
    return next((reference for reference in references if reference.get("controller")), None)


class DisruptionController:
    """Keeps each PodDisruptionBudget's status, as kube-controller-manager's disruption
    controller does (pkg/controller/disruption); see the module docstring."""

    def __init__(
        self,
        api: KubeApi,
        budgets: Informer,
        pods: Informer,
        replica_sets: Informer,
        deployments: Informer,
    ) -> None:
        self.api = api
        self.budgets = budgets
        self.pods = pods
        self.replica_sets = replica_sets
        self.deployments = deployments
        self._scale_paths: dict[tuple[str, str], str] = {}
        """(apiVersion, kind) -> the collection path of a controller kind with a scale."""

    def sync(self) -> None:
        _sync_each(self.budgets.objects(), self.sync_one, "pod disruption budget")

    def _pods_of(self, budget: JsonObject) -> list[JsonObject]:
        """The pods of its namespace its selector selects (no selector: none; {}: all)."""
        selector = (budget.get("spec") or {}).get("selector")
        if selector is None:
            return []
        namespace = budget["metadata"]["namespace"]
        return [
            pod
            for pod in self.pods.objects()
            if pod["metadata"].get("namespace") == namespace
            and selector_matches(selector, pod["metadata"].get("labels") or {})
        ]

    def sync_one(self, budget: JsonObject) -> None:
        now = datetime.now(UTC)
        pods = self._pods_of(budget)
        previous: JsonObject = budget.get("status") or {}
        try:
            expected, desired = self._expected_and_desired(budget, pods)
        except ExpectedCountError as error:
            failed = with_disruption_allowed_condition(
                {**previous, "disruptionsAllowed": 0}, now, failure=str(error)
            )
            self._write(budget, failed)
            return
        noted = previous.get("disruptedPods") or {}
        disrupted = {
            pod["metadata"]["name"]: noted[pod["metadata"]["name"]]
            for pod in pods
            if "deletionTimestamp" not in pod["metadata"]
            and recently_disrupted(noted, pod["metadata"]["name"], now)
        }
        healthy = count_healthy(pods, disrupted, now)
        allowed = healthy - desired if expected > 0 else 0
        status: JsonObject = {
            "observedGeneration": budget["metadata"].get("generation", 1),
            "expectedPods": expected,
            "desiredHealthy": desired,
            "currentHealthy": healthy,
            "disruptionsAllowed": max(allowed, 0),
            "conditions": previous.get("conditions") or [],
        }
        if disrupted:
            status["disruptedPods"] = disrupted
        self._write(budget, with_disruption_allowed_condition(status, now))

    def _write(self, budget: JsonObject, status: JsonObject) -> None:
        if status == (budget.get("status") or {}):
            return
        namespace, name = _key(budget)
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}/status"
        # The whole status, as an update: keys that went (disruptedPods) must go.
        body = {**budget, "status": status}
        self.budgets.remember(self.api.request("PUT", path, body=body))

    def _expected_and_desired(self, budget: JsonObject, pods: list[JsonObject]) -> tuple[int, int]:
        """(expectedPods, desiredHealthy): minAvailable N counts the selected pods; a
        percentage or maxUnavailable asks their controllers' scale."""
        spec = budget.get("spec") or {}
        max_unavailable, min_available = spec.get("maxUnavailable"), spec.get("minAvailable")
        if max_unavailable is not None:
            expected = self._expected_scale(pods)
            unavailable = resolve_count(max_unavailable, expected, round_up=True)
            return expected, max(expected - unavailable, 0)
        if isinstance(min_available, int):
            return len(pods), min_available
        if min_available is not None:
            expected = self._expected_scale(pods)
            return expected, resolve_count(min_available, expected, round_up=True)
        return 0, 0

    def _expected_scale(self, pods: list[JsonObject]) -> int:
        """The sum of the scale of the pods' controllers (pods without one are left out)."""
        scales: dict[str, int] = {}
        for pod in pods:
            reference = _controller_reference(pod)
            if reference is None or reference.get("uid") in scales:
                continue
            found = self._scale_of(reference, pod["metadata"]["namespace"])
            if found is None:
                name = pod["metadata"]["name"]
                raise ExpectedCountError(f'found no controllers for pod "{name}"')
            uid, replicas = found
            scales[uid] = replicas
        return sum(scales.values())

    def _scale_of(self, reference: JsonObject, namespace: str) -> tuple[str, int] | None:
        """(uid, replicas) of a pod's controller: a ReplicaSet (or the Deployment that owns
        it), else whatever kind it is through its scale subresource."""
        if reference.get("kind") == "ReplicaSet" and reference.get("apiVersion") == "apps/v1":
            replica_set = self.replica_sets.by_uid(reference["uid"])
            if replica_set is None:
                return None
            owner = _controller_reference(replica_set)
            if owner is not None and owner.get("kind") == "Deployment":
                deployment = self.deployments.by_uid(owner["uid"])
                if deployment is None:
                    return None
                return str(owner["uid"]), int(deployment["spec"].get("replicas", 1))
            return str(reference["uid"]), _spec_replicas(replica_set)
        collection = self._scale_collection(reference)
        try:
            scale = self.api.request(
                "GET", f"{collection.format(namespace=namespace)}/{reference['name']}/scale"
            )
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise
        if scale["metadata"].get("uid") != reference.get("uid"):
            return None
        return str(reference["uid"]), int((scale.get("spec") or {}).get("replicas", 0))

    def _scale_collection(self, reference: JsonObject) -> str:
        """The collection path of the controller's kind, found through discovery, as the
        disruption controller's RESTMapper does; the kind must serve a scale subresource."""
        api_version, kind = str(reference.get("apiVersion", "")), str(reference.get("kind", ""))
        known = self._scale_paths.get((api_version, kind))
        if known is not None:
            return known
        root = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        try:
            resources = self.api.request("GET", root).get("resources") or []
        except KubeApiError as error:
            raise ExpectedCountError(f"{api_version} {kind}: {error}") from error
        plural = next(
            (r["name"] for r in resources if r.get("kind") == kind and "/" not in r["name"]), None
        )
        if plural is None:
            raise ExpectedCountError(f'no resource of kind "{kind}" in {api_version}')
        if not any(r["name"] == f"{plural}/scale" for r in resources):
            group = api_version.rpartition("/")[0]
            resource = f"{plural}.{group}" if group else plural
            raise ExpectedCountError(f"{resource} does not implement the scale subresource")
        collection = f"{root}/namespaces/{{namespace}}/{plural}"
        self._scale_paths[(api_version, kind)] = collection
        return collection


class InformerLoop(ABC):
    """Informers (list + watch caches, each on a thread of its own) and `sync_all` over them,
    on a thread of its own: after any change they see (at most every 0.1 s) and every
    `resync_seconds`, once all of them have listed."""

    def __init__(self, api: KubeApi, name: str, resync_seconds: float) -> None:
        self.api = api
        self.name = name
        self.resync_seconds = resync_seconds
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._informers: list[Informer] = []
        self._loop_thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _informer(self, path: str) -> Informer:
        informer = Informer(self.api, path, self._wake.set, self._stopping)
        self._informers.append(informer)
        return informer

    @abstractmethod
    def sync_all(self) -> None:
        """One pass over what the informers hold."""

    def start(self) -> None:
        for informer in self._informers:
            name = f"{self.name}-watch-{informer.path.rpartition('/')[2]}"
            threading.Thread(target=informer.run, name=name, daemon=True).start()
        self._loop_thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._loop_thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.resync_seconds)
            self._wake.clear()
            if not all(informer.synced.is_set() for informer in self._informers):
                continue
            try:
                self.sync_all()
            except Exception:
                logger.exception("%s failed", self.name)
            self._stopping.wait(0.1)


class ControllerManager(InformerLoop):
    """The controllers, each pass over everything; a pass runs after any change (at most
    every 0.1 s) and every `resync_seconds` (progress deadlines, evictions to forget)."""

    def __init__(self, api: KubeApi, resync_seconds: float = 5.0) -> None:
        super().__init__(api, "controllers", resync_seconds)
        self.deployments = self._informer("/apis/apps/v1/deployments")
        self.replica_sets = self._informer("/apis/apps/v1/replicasets")
        self.pods = self._informer("/api/v1/pods")
        self.budgets = self._informer("/apis/policy/v1/poddisruptionbudgets")
        self.controllers = (
            DeploymentController(api, self.deployments, self.replica_sets, self.pods),
            ReplicaSetController(api, self.replica_sets, self.pods),
            DisruptionController(api, self.budgets, self.pods, self.replica_sets, self.deployments),
        )

    def sync_all(self) -> None:
        for controller in self.controllers:
            try:
                controller.sync()
            except Exception:
                logger.exception("%s failed", type(controller).__name__)
