"""The scheduler of the local control plane: kube-scheduler's part that a few nodes need.
`smoothscale dev scheduler` runs it as an ordinary client of the API, beside the kubelets.

Each pod without a node (and for the default scheduler: no `schedulerName`, or
"default-scheduler") is bound through `pods/binding` to a node that fits it, kube-scheduler's
filters in its order:
- NodeUnschedulable: not cordoned (`spec.unschedulable`), unless the pod tolerates the
  `node.kubernetes.io/unschedulable:NoSchedule` taint;
- TaintToleration: every NoSchedule and NoExecute taint tolerated; a node that is not Ready
  counts as tainted `node.kubernetes.io/not-ready:NoSchedule` (what Kubernetes' node lifecycle
  controller adds);
- NodeAffinity: the node's labels match the pod's `nodeSelector`.
Of the nodes that fit, the one running the fewest pods gets it (ties: by name). A pod that fits
nowhere stays Pending with PodScheduled False (reason Unschedulable) and a FailedScheduling
Warning event, both with kube-scheduler's message ("0/3 nodes are available: 1 node(s) were
unschedulable, 2 node(s) didn't match Pod's node affinity/selector. preemption: ..."); it is
tried again whenever a node or pod changes.
"""

import logging
import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from devstack.controllers import InformerLoop
from devstack.disruption import is_ready
from devstack.podstatus import timestamp
from smoothscale.kubeapi import MERGE_PATCH, JsonObject, KubeApi, KubeApiError

logger = logging.getLogger("devstack.scheduler")

SCHEDULER_NAME = "default-scheduler"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE = "node(s) were unschedulable"
SELECTOR_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
NO_NODES = "no nodes available to schedule pods"
_FINISHED = ("Succeeded", "Failed")


def tolerates(tolerations: Iterable[JsonObject], taint: JsonObject) -> bool:
    """Whether some toleration tolerates the taint (Kubernetes' ToleratesTaint)."""
    for toleration in tolerations:
        effect, key = toleration.get("effect"), toleration.get("key")
        if effect and effect != taint.get("effect"):
            continue
        if key and key != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" or (
            operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def _taints(node: JsonObject) -> list[JsonObject]:
    taints = list((node.get("spec") or {}).get("taints") or [])
    if not is_ready(node):
        taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
    return taints


def unfit_reason(pod: JsonObject, node: JsonObject) -> str | None:
    """Why the pod cannot go to this node (the first filter that fails), or None if it can."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    cordoned = (node.get("spec") or {}).get("unschedulable")
    unschedulable_taint = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    if cordoned and not tolerates(tolerations, unschedulable_taint):
        return UNSCHEDULABLE
    for taint in _taints(node):
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return SELECTOR_MISMATCH
    return None


@dataclass(frozen=True)
class Placement:
    """Where a pod goes: `node`, or None with kube-scheduler's `message` saying why nowhere."""

    node: str | None
    message: str = ""


def place(pod: JsonObject, nodes: list[JsonObject], pods: Iterable[JsonObject]) -> Placement:
    """The node for `pod` among `nodes`: one that fits, with the fewest of `pods` on it."""
    if not nodes:
        return Placement(None, NO_NODES)
    load = Counter(
        (p.get("spec") or {}).get("nodeName")
        for p in pods
        if (p.get("status") or {}).get("phase") not in _FINISHED
    )
    reasons: Counter[str] = Counter()
    fitting = []
    for node in nodes:
        reason = unfit_reason(pod, node)
        if reason is None:
            fitting.append(node["metadata"]["name"])
        else:
            reasons[reason] += 1
    if fitting:
        return Placement(min(fitting, key=lambda name: (load[name], name)))
    total = len(nodes)
    histogram = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
    return Placement(
        None,
        f"0/{total} nodes are available: {histogram}. preemption: 0/{total} nodes are "
        f"available: {total} Preemption is not helpful for scheduling.",
    )


def _wants_scheduling(pod: JsonObject) -> bool:
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    return (
        not spec.get("nodeName")
        and "deletionTimestamp" not in meta
        and (spec.get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
        and (pod.get("status") or {}).get("phase") not in _FINISHED
    )


def _pod_path(pod: JsonObject, subresource: str = "") -> str:
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    return f"{path}/{subresource}" if subresource else path


class Scheduler(InformerLoop):
    """Binds pending pods; a pass runs after any change of pods or nodes (at most every 0.1 s)
    and every `resync_seconds`."""

    def __init__(self, api: KubeApi, resync_seconds: float = 5.0) -> None:
        super().__init__(api, "scheduler", resync_seconds)
        self.pods = self._informer("/api/v1/pods")
        self.nodes = self._informer("/api/v1/nodes")

    def sync_all(self) -> None:
        self.schedule_pending()

    def schedule_pending(self) -> None:
        nodes = sorted(self.nodes.objects(), key=lambda node: str(node["metadata"]["name"]))
        pending = [pod for pod in self.pods.objects() if _wants_scheduling(pod)]
        for pod in sorted(pending, key=lambda p: str(p["metadata"].get("creationTimestamp"))):
            placement = place(pod, nodes, self.pods.objects())
            try:
                if placement.node is not None:
                    self._bind(pod, placement.node)
                else:
                    self._record_unschedulable(pod, placement.message)
            except KubeApiError as error:
                if error.status not in (404, 409):  # gone, or bound by someone else
                    logger.warning("pod %s: %s", pod["metadata"]["name"], error)

    def _bind(self, pod: JsonObject, node: str) -> None:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.api.request("POST", _pod_path(pod, "binding"), body=binding)
        logger.info("bound pod %s/%s to node %s", meta["namespace"], meta["name"], node)
        # Count it on its node at once (kube-scheduler "assumes" it) until the watch says so.
        self.pods.remember({**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}})

    def _record_unschedulable(self, pod: JsonObject, message: str) -> None:
        """PodScheduled False and a FailedScheduling event, once per distinct message."""
        conditions = (pod.get("status") or {}).get("conditions") or []
        current = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if current is not None and (current.get("status"), current.get("message")) == (
            "False",
            message,
        ):
            return
        now = timestamp(datetime.now(UTC))
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": now,
        }
        others = [c for c in conditions if c.get("type") != "PodScheduled"]
        answer = self.api.request(
            "PATCH",
            _pod_path(pod, "status"),
            body={"status": {"conditions": [condition, *others]}},
            content_type=MERGE_PATCH,
        )
        self.pods.remember(answer)
        meta = pod["metadata"]
        logger.info("pod %s/%s is unschedulable: %s", meta["namespace"], meta["name"], message)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": "FailedScheduling",
            "message": message,
            "type": "Warning",
            "source": {"component": SCHEDULER_NAME},
            "reportingComponent": SCHEDULER_NAME,
            "reportingInstance": SCHEDULER_NAME,
            "action": "Scheduling",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)
