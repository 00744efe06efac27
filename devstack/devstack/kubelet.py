"""The process kubelet: runs the pods of one node as local processes.

It is an ordinary client of the Kubernetes API. It registers its Node, watches every pod, binds
unscheduled pods to its node unless a scheduler places them (`smoothscale dev scheduler`; alone,
the kubelet is the whole scheduler of a one-node cluster), runs the pods bound to its node with
the ProcessRunner, reports their status through pods/status, and on a
graceful delete stops the processes (SIGTERM, the grace period, SIGKILL) before it finishes
the delete with a grace period of 0, as a real kubelet does.

A pod that mounts its ServiceAccount's token (automountServiceAccountToken not false, on the pod
or else on the ServiceAccount) gets one from the TokenRequest API, as a kubelet does, in
`<pod directory>/serviceaccount/` (token, namespace) with a kubeconfig that uses it, named by
KUBECONFIG in every container: the local form of in-cluster config (the API server speaks plain
HTTP on loopback, so the in-cluster https://KUBERNETES_SERVICE_HOST form does not fit).

Two classes: PodSyncer decides (API objects <-> runner), and is driven by one thread only;
Kubelet owns the threads (the watch, the sync loop, background stops) and the event queue.
"""

import base64
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devstack.podspec import (
    NODE_IP,
    PodConfigError,
    ValueSources,
    pod_key,
    process_spec,
    termination_grace_seconds,
)
from devstack.podstatus import (
    container_status,
    pod_phase,
    pod_status,
    timestamp,
    waiting_status,
)
from devstack.processes import Backoff, ProcessRunner
from smoothscale.kubeapi import MERGE_PATCH, JsonObject, KubeApi, KubeApiError

logger = logging.getLogger("devstack.kubelet")

DEFAULT_NODE_NAME = "local"
TOKEN_SECONDS = 365 * 24 * 3600
"""A pod's ServiceAccount token lasts a year: the process kubelet does not rotate tokens."""
PODS = "/api/v1/pods"


def _pod_path(pod: JsonObject, subresource: str = "") -> str:
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}"
    return f"{path}/{subresource}" if subresource else path


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _PodRecord:
    """What the syncer knows of one pod on its node."""

    pod: JsonObject
    key: str
    start_time: datetime
    running: bool = False
    config_error: str | None = None
    stopping: bool = False
    last_status: JsonObject | None = None


@dataclass(frozen=True)
class Stopped:
    """A pod's processes have all stopped; finish its delete in the API when asked to."""

    uid: str
    finish_delete: bool


class PodSyncer:
    """Brings the runner in line with the pods bound to `node_name`, and the pods' status in
    line with the runner. Not thread-safe: one thread calls every method."""

    def __init__(
        self,
        api: KubeApi,
        runner: ProcessRunner,
        node_name: str = DEFAULT_NODE_NAME,
        *,
        stop_in_background: Callable[[str, float, Stopped], None] | None = None,
        base_env: Mapping[str, str] | None = None,
        api_server: str | None = None,
        bind_unscheduled: bool = True,
    ) -> None:
        """`api_server`: the URL pods reach the API at with their ServiceAccount's token (None:
        pods get no token). `bind_unscheduled`: bind pods without a node to this one (False
        when a scheduler does)."""
        self.api = api
        self._api_server = api_server
        self.runner = runner
        self.node_name = node_name
        self._stop_in_background = stop_in_background or self._stop_now
        self._base_env = base_env
        self._bind_unscheduled = bind_unscheduled
        self._records: dict[str, _PodRecord] = {}
        self._uid_by_key: dict[str, str] = {}
        self._sources = ValueSources(self._config_map_value, self._secret_value)

    # Events.

    def on_pod(self, pod: JsonObject) -> None:
        """A pod was listed, added or modified."""
        meta = pod["metadata"]
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node != self.node_name:
            return
        if not node:
            if self._bind_unscheduled and "deletionTimestamp" not in meta:
                self._bind(pod)
            return
        uid = meta["uid"]
        record = self._records.get(uid)
        if record is None:
            record = _PodRecord(pod, pod_key(pod), _now())
            self._records[uid] = record
            self._uid_by_key[record.key] = uid
        record.pod = pod
        if "deletionTimestamp" in meta:
            self._begin_stop(record, finish_delete=True)
            return
        if not record.running and not record.stopping:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                return  # finished before this kubelet started: never run it again
            self._start(record)
        self._sync_status(record)

    def on_pod_gone(self, pod: JsonObject) -> None:
        """The pod was removed from the API (deleted at once, or its delete finished)."""
        record = self._records.get(pod["metadata"]["uid"])
        if record is not None:
            record.pod = pod
            self._begin_stop(record, finish_delete=False)

    def on_pods_listed(self, pods: list[JsonObject]) -> None:
        """A full list: every pod in it as on_pod; pods no longer there are gone."""
        listed = {pod["metadata"]["uid"] for pod in pods}
        for uid, record in list(self._records.items()):
            if uid not in listed:
                self.on_pod_gone(record.pod)
        for pod in pods:
            self.on_pod(pod)

    def on_containers_changed(self, key: str) -> None:
        uid = self._uid_by_key.get(key)
        if uid is not None and uid in self._records:
            self._sync_status(self._records[uid])

    def on_stopped(self, stopped: Stopped) -> None:
        record = self._records.pop(stopped.uid, None)
        if record is None:
            return
        self._uid_by_key.pop(record.key, None)
        if stopped.finish_delete:
            self._finish_delete(record.pod)

    def resync(self) -> None:
        """Pods that could not start (a missing ConfigMap, say) are tried again, and every
        pod's status is written again where the API server does not have it yet: a status
        write that failed (an overloaded API server, a timeout) is retried, as a kubelet's
        status manager does, instead of leaving the pod's last change unsaid for good."""
        for record in list(self._records.values()):
            if record.config_error is not None and not record.stopping:
                self._start(record)
            self._sync_status(record)

    # Actions.

    def _bind(self, pod: JsonObject) -> None:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self.api.request("POST", _pod_path(pod, "binding"), body=binding)
        except KubeApiError as error:
            if error.status not in (404, 405):
                if error.status != 409:  # someone else bound it first
                    logger.warning("cannot bind pod %s: %s", meta["name"], error)
                return
            # No binding subresource on this server: set spec.nodeName directly.
            try:
                self.api.request(
                    "PATCH",
                    _pod_path(pod),
                    body={"spec": {"nodeName": self.node_name}},
                    content_type=MERGE_PATCH,
                )
            except KubeApiError as patch_error:
                logger.warning("cannot bind pod %s: %s", meta["name"], patch_error)

    def _start(self, record: _PodRecord) -> None:
        try:
            cluster_env = self._service_account_env(record)
            spec = process_spec(
                record.pod, self.node_name, self._sources, self._base_env, cluster_env
            )
        except PodConfigError as error:
            if record.config_error != str(error):
                logger.warning("pod %s cannot start: %s", record.key, error)
            record.config_error = str(error)
            return
        except KubeApiError as error:
            record.config_error = f"cannot read a referenced object: {error}"
            return
        record.config_error = None
        self.runner.start(spec)
        record.running = True
        logger.info("started pod %s", record.key)

    def _service_account_env(self, record: _PodRecord) -> dict[str, str]:
        """The token of the pod's ServiceAccount, mounted; {} when the pod does not want it."""
        pod = record.pod
        spec = pod.get("spec") or {}
        namespace = pod["metadata"].get("namespace", "default")
        name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        if self._api_server is None or spec.get("automountServiceAccountToken") is False:
            return {}
        account = self._read("serviceaccounts", namespace, name)
        if account is None:
            raise PodConfigError(
                f'error looking up service account {namespace}/{name}: serviceaccount "{name}" '
                "not found; create it (the pod starts once it exists)"
            )
        wanted = spec.get(
            "automountServiceAccountToken", account.get("automountServiceAccountToken")
        )
        if wanted is False:
            return {}
        answer = self.api.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": TOKEN_SECONDS},
            },
        )
        token = str(answer["status"]["token"])
        directory = self.runner.pod_directory(record.key) / "serviceaccount"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(token)
        (directory / "namespace").write_text(namespace)
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(_service_account_kubeconfig(self._api_server, namespace, name, token))
        )
        return {"KUBECONFIG": str(kubeconfig)}

    def _begin_stop(self, record: _PodRecord, finish_delete: bool) -> None:
        if record.stopping:
            return
        record.stopping = True
        stopped = Stopped(record.pod["metadata"]["uid"], finish_delete)
        if record.running:
            grace = termination_grace_seconds(record.pod)
            logger.info("stopping pod %s (grace period %.0f s)", record.key, grace)
            self._stop_in_background(record.key, grace, stopped)
        else:
            self.on_stopped(stopped)

    def _stop_now(self, key: str, grace: float, stopped: Stopped) -> None:
        self.runner.stop(key, grace)
        self.on_stopped(stopped)

    def _finish_delete(self, pod: JsonObject) -> None:
        meta = pod["metadata"]
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        try:
            self.api.request("DELETE", _pod_path(pod), body=options)
        except KubeApiError as error:
            if error.status not in (404, 409):  # already gone, or a new pod of that name
                logger.warning("cannot finish deleting pod %s: %s", meta["name"], error)

    def _sync_status(self, record: _PodRecord) -> None:
        containers = (record.pod.get("spec") or {}).get("containers") or []
        message = None
        if record.config_error is not None:
            statuses = [
                waiting_status(container, "CreateContainerConfigError", record.config_error)
                for container in containers
            ]
            phase, message = "Pending", record.config_error
        elif record.running and record.key in self.runner:
            try:
                snapshots = self.runner.snapshot(record.key)
            except KeyError:
                return  # stopped in the meantime
            statuses = [
                container_status(spec, snapshot)
                for spec, snapshot in zip(containers, snapshots, strict=True)
            ]
            phase = pod_phase(snapshots)
        else:
            return
        status = pod_status(
            record.pod, statuses, phase, start_time=record.start_time, now=_now(), message=message
        )
        if _comparable(status) == _comparable(record.last_status):
            return
        try:
            self.api.request(
                "PATCH",
                _pod_path(record.pod, "status"),
                body={"status": status},
                content_type=MERGE_PATCH,
            )
        except KubeApiError as error:
            if error.status != 404:
                logger.warning("cannot update the status of pod %s: %s", record.key, error)
            return
        record.last_status = status

    # Value sources for env.

    def _read(self, kind: str, namespace: str, name: str) -> JsonObject | None:
        try:
            return self.api.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def _config_map_value(self, namespace: str, name: str, key: str) -> str | None:
        config_map = self._read("configmaps", namespace, name)
        if config_map is None:
            return None
        value = (config_map.get("data") or {}).get(key)
        return None if value is None else str(value)

    def _secret_value(self, namespace: str, name: str, key: str) -> str | None:
        secret = self._read("secrets", namespace, name)
        if secret is None:
            return None
        string_value = (secret.get("stringData") or {}).get(key)
        if string_value is not None:
            return str(string_value)
        value = (secret.get("data") or {}).get(key)
        return None if value is None else base64.b64decode(value).decode()


def _service_account_kubeconfig(server: str, namespace: str, name: str, token: str) -> JsonObject:
    user = f"system:serviceaccount:{namespace}:{name}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": "in-cluster",
                "context": {"cluster": "local", "user": user, "namespace": namespace},
            }
        ],
        "current-context": "in-cluster",
    }


def _comparable(status: JsonObject | None) -> Any:
    """A status without the times that move by themselves."""
    if status is None:
        return None
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions", [])
    ]
    return {**status, "conditions": conditions}


@dataclass
class KubeletConfig:
    node_name: str = DEFAULT_NODE_NAME
    root: Path = field(default_factory=lambda: Path(".smoothscale/kubelet"))
    backoff: Backoff = field(default_factory=Backoff)
    resync_seconds: float = 2.0
    watch_timeout_seconds: int = 30
    shutdown_grace_seconds: float = 10.0
    """On shutdown, each pod gets its grace period, but no more than this."""
    bind_unscheduled: bool = True
    """Bind pods that have no node to this one; False when a scheduler places them."""


class Kubelet:
    """Runs a PodSyncer: one thread watches pods, one applies events in order."""

    def __init__(self, api: KubeApi, config: KubeletConfig | None = None) -> None:
        self.config = config or KubeletConfig()
        self.api = api
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stopping = threading.Event()
        self.runner = ProcessRunner(
            self.config.root,
            backoff=self.config.backoff,
            on_change=lambda key: self._events.put(("changed", key)),
        )
        self.syncer = PodSyncer(
            api,
            self.runner,
            self.config.node_name,
            stop_in_background=self._stop_in_background,
            api_server=api.server,
            bind_unscheduled=self.config.bind_unscheduled,
        )
        self._threads = [
            threading.Thread(target=self._watch_pods, name="kubelet-watch", daemon=True),
            threading.Thread(target=self._sync_loop, name="kubelet-sync", daemon=True),
        ]

    def start(self) -> None:
        self.config.root.mkdir(parents=True, exist_ok=True)
        self.register_node()
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop watching and stop every pod's processes (within the shutdown grace)."""
        self._stopping.set()
        self._events.put(("wake", None))
        if self._threads[1].is_alive():
            self._threads[1].join()
        self.runner.stop_all(max_grace_seconds=self.config.shutdown_grace_seconds)

    def register_node(self) -> None:
        """Create this kubelet's Node (if missing) and report it Ready."""
        name = self.config.node_name
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            },
        }
        try:
            self.api.request("POST", "/api/v1/nodes", body=node)
        except KubeApiError as error:
            if error.status != 409:
                raise
        now = timestamp(_now())
        status = {
            "addresses": [
                {"type": "InternalIP", "address": NODE_IP},
                {"type": "Hostname", "address": name},
            ],
            "capacity": {"cpu": str(os.cpu_count() or 1), "pods": "110"},
            "allocatable": {"cpu": str(os.cpu_count() or 1), "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "smoothscale process kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "smoothscale-process-kubelet",
                "operatingSystem": "linux",
            },
        }
        self.api.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body={"status": status},
            content_type=MERGE_PATCH,
        )

    def _stop_in_background(self, key: str, grace: float, stopped: Stopped) -> None:
        def stop() -> None:
            self.runner.stop(key, grace)
            self._events.put(("stopped", stopped))

        threading.Thread(target=stop, name=f"kubelet-stop-{key}", daemon=True).start()

    def _sync_loop(self) -> None:
        next_resync = time.monotonic() + self.config.resync_seconds
        while not self._stopping.is_set():
            try:
                kind, payload = self._events.get(timeout=max(next_resync - time.monotonic(), 0))
            except queue.Empty:
                kind, payload = "resync", None
            try:
                self._apply(kind, payload)
            except Exception:
                logger.exception("kubelet: handling %s failed", kind)
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + self.config.resync_seconds
                self.syncer.resync()

    def _apply(self, kind: str, payload: Any) -> None:
        if kind == "pod":
            self.syncer.on_pod(payload)
        elif kind == "gone":
            self.syncer.on_pod_gone(payload)
        elif kind == "listed":
            self.syncer.on_pods_listed(payload)
        elif kind == "changed":
            self.syncer.on_containers_changed(payload)
        elif kind == "stopped":
            self.syncer.on_stopped(payload)

    def _watch_pods(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.api.request("GET", PODS)
                self._events.put(("listed", listing.get("items") or []))
                version = str(listing["metadata"]["resourceVersion"])
                while not self._stopping.is_set():
                    version = self._follow(version)
            except KubeApiError as error:
                if error.status != 410:  # 410: the version expired, list again at once
                    logger.warning("kubelet: watching pods: %s; listing again", error)
                    self._stopping.wait(1.0)
            except Exception:  # a malformed answer must not end the watch for good
                logger.exception("kubelet: watching pods failed; listing again")
                self._stopping.wait(1.0)

    def _follow(self, version: str) -> str:
        """Pass one watch stream's events on; return the last resourceVersion seen."""
        for event in self.api.watch(PODS, version, self.config.watch_timeout_seconds):
            obj = event.get("object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion", version))
            if event["type"] in ("ADDED", "MODIFIED"):
                self._events.put(("pod", obj))
            elif event["type"] == "DELETED":
                self._events.put(("gone", obj))
            if self._stopping.is_set():
                break
        return version
