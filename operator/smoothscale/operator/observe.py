"""What the operator observes of an app in Kubernetes: its instance pods, the nodes they run
on, and its Secrets.

Kafka is observed through smoothscale.kafka.progress (the reports and changelog ends) and
smoothscale.operator.topics (the topics); this module reads the pods, one list request per poll
with the app's label selector, the nodes (which of them are being drained), and the Secrets the
app names, only those the platform labelled.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from smoothscale.kubeapi import KubeApi, KubeApiError
from smoothscale.operator.pods import app_selector, ordinal_of

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class PodView:
    """One instance pod, as far as the operator cares."""

    name: str
    uid: str
    ordinal: int | None
    """The pod's ordinal (from its name), None for a pod whose name is not an instance name."""
    ready: bool
    terminating: bool
    """Being deleted (deletionTimestamp set): its process has been told to stop, and stops
    once its tasks are handed over or its grace period runs out."""
    node: str | None = None
    """The node it is bound to (spec.nodeName), None while it is not scheduled."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    crash: str | None = None
    """Why its container keeps failing, when it waits to be restarted (CrashLoopBackOff): the
    exit code and the last line of the termination message; None while it starts or runs."""
    failed: str | None = None
    """Why the pod has ended for good (phase Failed: evicted for exceeding its storage, or by
    a node short of memory or disk), reason and message; None while it may run. Such a pod is
    never restarted, and stays until someone deletes it."""

    @classmethod
    def of(cls, pod: JsonObject) -> "PodView":
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        restarts = sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or [])
        name = str(meta.get("name", ""))
        return cls(
            name=name,
            uid=str(meta.get("uid", "")),
            ordinal=_ordinal(name),
            ready=ready,
            terminating=meta.get("deletionTimestamp") is not None,
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            restarts=restarts,
            crash=_crash(status),
            failed=_failed(status),
            node=(pod.get("spec") or {}).get("nodeName") or None,
        )


def _crash(status: JsonObject) -> str | None:
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") != "CrashLoopBackOff":
            continue
        ended = (container.get("lastState") or {}).get("terminated") or {}
        text = f"its container {container.get('name')} exited with code {ended.get('exitCode')}"
        lines = [line.strip() for line in str(ended.get("message") or "").splitlines()]
        last = next((line for line in reversed(lines) if line), None)
        return f"{text}: {last}" if last else text
    return None


def _failed(status: JsonObject) -> str | None:
    if status.get("phase") != "Failed":
        return None
    reason = status.get("reason") or "Failed"
    message = status.get("message")
    return f"{reason}: {message}" if message else str(reason)


def _ordinal(name: str) -> int | None:
    try:
        return ordinal_of(name)
    except ValueError:
        return None


def pods_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def observe_pods(kube: KubeApi, namespace: str, app_name: str) -> dict[str, PodView]:
    """The app's pods by name (one list request, by the app's label selector)."""
    listing = kube.request(
        "GET", pods_path(namespace), query={"labelSelector": app_selector(app_name)}
    )
    pods = (PodView.of(item) for item in listing.get("items") or [])
    return {pod.name: pod for pod in pods}


DRAIN_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",  # kubectl cordon / drain (with the taint manager)
        "karpenter.sh/disrupted",  # Karpenter: consolidation, drift, expiry
        "ToBeDeletedByClusterAutoscaler",  # the cluster autoscaler's scale-down
    }
)
"""Taints that announce a node's pods are about to be evicted: besides `kubectl cordon`
(spec.unschedulable), what the node autoscalers put on a node before they drain it."""


def draining_nodes(kube: KubeApi) -> dict[str, str] | None:
    """The nodes being drained, with why (one list request): cordoned, or tainted by a node
    autoscaler before it evicts their pods. None when the operator may not read nodes (the
    chart grants it; without it, a drain's evictions wait on the PodDisruptionBudget alone)."""
    try:
        listing = kube.request("GET", "/api/v1/nodes")
    except KubeApiError as error:
        if error.status in (401, 403):
            return None
        raise
    draining: dict[str, str] = {}
    for node in listing.get("items") or []:
        name = str((node.get("metadata") or {}).get("name", ""))
        spec = node.get("spec") or {}
        taints = [t.get("key") for t in spec.get("taints") or [] if t.get("key") in DRAIN_TAINTS]
        if spec.get("unschedulable"):
            draining[name] = "cordoned"
        elif taints:
            draining[name] = f"tainted {taints[0]}"
    return draining


def secrets_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets"


def observe_secrets(
    kube: KubeApi, namespace: str, names: Iterable[str], label_selector: str
) -> dict[str, dict[str, str]]:
    """The named Secrets that match `label_selector`, by name, with their data (base64, as the
    API serves it). Never a get by name: RBAC cannot limit reads by label, so each Secret is
    listed with the label selector and a metadata.name field selector, and the API server
    itself leaves out a Secret without the label; its data never reaches the operator."""
    found: dict[str, dict[str, str]] = {}
    for name in names:
        listing = kube.request(
            "GET",
            secrets_path(namespace),
            query={"labelSelector": label_selector, "fieldSelector": f"metadata.name={name}"},
        )
        for item in listing.get("items") or []:
            if (item.get("metadata") or {}).get("name") == name:
                found[name] = dict(item.get("data") or {})
    return found
