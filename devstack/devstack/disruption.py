"""PodDisruptionBudget arithmetic, shared by the API server's eviction subresource
(`devstack.apiserver.eviction`) and the disruption controller (`devstack.controllers`), as
Kubernetes shares k8s.io/component-helpers/apps/poddisruptionbudget between them.

A budget selects pods by its label selector; a pod is healthy when it is Ready, not being
deleted and not recently evicted (in status.disruptedPods, for at most two minutes, until the
controller sees its delete); disruptionsAllowed is how many healthy pods may go now.
"""

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from devstack.podstatus import timestamp

JsonObject = dict[str, Any]

DISRUPTION_ALLOWED = "DisruptionAllowed"
DISRUPTED_POD_TIMEOUT = timedelta(minutes=2)
"""How long an evicted pod stays in status.disruptedPods without being deleted (DeletionTimeout
of the disruption controller): after that it counts again."""
MAX_DISRUPTED_PODS = 2000
"""Evictions the API server approves that the controller has not seen yet, at most."""


def parse_timestamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def selector_is_empty(selector: JsonObject | None) -> bool:
    """No requirements at all (None, {} or empty lists)."""
    return not selector or not (selector.get("matchLabels") or selector.get("matchExpressions"))


def selector_matches(selector: JsonObject, labels: Mapping[str, str]) -> bool:
    """Whether labels satisfy a metav1.LabelSelector (matchLabels and matchExpressions with In,
    NotIn, Exists, DoesNotExist); an empty selector matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key", ""), expression.get("operator")
        values = set(expression.get("values") or [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def pod_labels(pod: JsonObject) -> dict[str, str]:
    labels: dict[str, str] = pod.get("metadata", {}).get("labels") or {}
    return labels


def is_ready(obj: JsonObject) -> bool:
    """Its Ready condition is True (a pod's, or a node's)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def recently_disrupted(disrupted_pods: Mapping[str, str], name: str, now: datetime) -> bool:
    """Evicted less than DISRUPTED_POD_TIMEOUT ago (and so not healthy any more)."""
    since = disrupted_pods.get(name)
    return since is not None and parse_timestamp(since) + DISRUPTED_POD_TIMEOUT > now


def count_healthy(
    pods: Iterable[JsonObject], disrupted_pods: Mapping[str, str], now: datetime
) -> int:
    """Ready pods that are neither being deleted nor recently evicted."""
    return sum(
        1
        for pod in pods
        if "deletionTimestamp" not in pod["metadata"]
        and not recently_disrupted(disrupted_pods, pod["metadata"]["name"], now)
        and is_ready(pod)
    )


def with_disruption_allowed_condition(
    status: JsonObject, now: datetime, failure: str | None = None
) -> JsonObject:
    """The status with its DisruptionAllowed condition set: True (SufficientPods) when
    disruptionsAllowed > 0, else False (InsufficientPods, or SyncFailed with the `failure`
    message); lastTransitionTime moves only on a flip."""
    allowed = failure is None and int(status.get("disruptionsAllowed", 0)) > 0
    condition_status = "True" if allowed else "False"
    reason = "SufficientPods" if allowed else "InsufficientPods"
    conditions = [dict(c) for c in status.get("conditions") or []]
    old = next((c for c in conditions if c.get("type") == DISRUPTION_ALLOWED), None)
    since = timestamp(now)
    if old is not None and old.get("status") == condition_status:
        since = old.get("lastTransitionTime", since)
    condition: JsonObject = {
        "type": DISRUPTION_ALLOWED,
        "status": condition_status,
        "reason": "SyncFailed" if failure is not None else reason,
        "message": failure or "",
        "observedGeneration": status.get("observedGeneration", 0),
        "lastTransitionTime": since,
    }
    others = [c for c in conditions if c.get("type") != DISRUPTION_ALLOWED]
    return {**status, "conditions": [*others, condition]}
