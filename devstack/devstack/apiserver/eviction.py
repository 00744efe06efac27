"""The eviction subresource, `POST /api/v1/namespaces/NS/pods/NAME/eviction`, as the API
server's EvictionREST does it (pkg/registry/core/pod/storage/eviction.go, Kubernetes 1.33).

An Eviction (policy/v1, or policy/v1beta1) asks to delete a pod unless that would break its
PodDisruptionBudget:
- a pod that is Pending, Succeeded, Failed or already being deleted is deleted at once;
- a pod selected by more than one budget cannot be evicted (500);
- an unready pod is deleted without touching the budget when the budget allows it
  (unhealthyPodEvictionPolicy AlwaysAllow, or the default IfHealthyBudget while currentHealthy
  >= desiredHealthy > 0);
- otherwise the budget's status decides: a status older than its spec is 429 with Retry-After
  10 ("still being processed"), no disruption allowed is 429 ("Cannot evict pod as it would
  violate the pod's disruption budget.", the budget named in details.causes); else
  disruptionsAllowed goes down by one and the pod is noted in status.disruptedPods, so that a
  second eviction before the disruption controller recounts is refused.
The pod then gets the DisruptionTarget condition (EvictionByEvictionAPI) and is deleted with
the Eviction's deleteOptions (its grace period, else terminationGracePeriodSeconds), and the
answer is a 201 Success Status.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from devstack.apiserver.errors import ApiError, JsonObject, bad_request
from devstack.apiserver.registry import ResourceType
from devstack.apiserver.store import Store
from devstack.disruption import (
    MAX_DISRUPTED_PODS,
    is_ready,
    pod_labels,
    selector_is_empty,
    selector_matches,
    with_disruption_allowed_condition,
)
from devstack.podstatus import timestamp

EVICTION_VERSIONS = ("policy/v1", "policy/v1beta1")
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"

DeletePod = Callable[[JsonObject, bool], None]
"""Deletes the pod as a DELETE with these DeleteOptions would (dry run or not)."""


def success() -> JsonObject:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def delete_options(eviction: JsonObject, name: str, dry_run_query: bool) -> tuple[JsonObject, bool]:
    """The Eviction's deleteOptions and whether it is a dry run; 400 for a body that is not an
    Eviction of this pod."""
    if eviction.get("kind") != "Eviction" or eviction.get("apiVersion") not in EVICTION_VERSIONS:
        raise bad_request(
            f"the body must be a policy/v1 Eviction, not {eviction.get('apiVersion')}, "
            f"Kind={eviction.get('kind')}"
        )
    if (eviction.get("metadata") or {}).get("name") != name:
        raise bad_request("name in URL does not match name in Eviction object")
    options: JsonObject = dict(eviction.get("deleteOptions") or {})
    dry_run = dry_run_query or "All" in (options.get("dryRun") or [])
    return options, dry_run


def _too_many_requests(message: str, retry_after_seconds: int = 0) -> ApiError:
    return ApiError(
        429,
        "TooManyRequests",
        VIOLATION,
        {"causes": [{"reason": DISRUPTION_BUDGET_CAUSE, "message": message}]},
        retry_after_seconds=retry_after_seconds,
    )


def _forbidden(budget: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'poddisruptionbudget.policy "{budget}" is forbidden: {why}',
        {"name": budget, "group": "policy", "kind": "poddisruptionbudget"},
    )


class Evictions:
    """Evicts pods against the budgets in `store`."""

    def __init__(self, store: Store, pods: ResourceType, budgets: ResourceType) -> None:
        self._store = store
        self._pods = pods
        self._budgets = budgets

    def evict(
        self, namespace: str, name: str, options: JsonObject, dry_run: bool, delete: DeletePod
    ) -> JsonObject:
        """Evict the pod or raise why not; returns the Status to answer with."""
        pod = self._store.get(self._pods, namespace, name)
        phase = (pod.get("status") or {}).get("phase")
        running = phase not in ("Pending", "Succeeded", "Failed")
        if running and "deletionTimestamp" not in pod["metadata"]:
            # Otherwise no budget is asked: the pod disrupts nothing, or is going already.
            budgets = self._budgets_of(pod)
            if len(budgets) > 1:
                raise ApiError(
                    500,
                    "",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            if budgets and not self._unready_pod_may_go(pod, budgets[0]):
                self._check_and_decrement(budgets[0], name, dry_run)
        if not dry_run:
            self._mark_disruption_target(pod)
        delete(options, dry_run)
        return success()

    def _budgets_of(self, pod: JsonObject) -> list[JsonObject]:
        """The budgets of the pod's namespace whose selector selects it; an empty selector
        selects nothing here."""
        labels = pod_labels(pod)
        return [
            budget
            for budget in self._store.list(self._budgets, pod["metadata"]["namespace"])
            if not selector_is_empty((budget.get("spec") or {}).get("selector"))
            and selector_matches(budget["spec"]["selector"], labels)
        ]

    @staticmethod
    def _unready_pod_may_go(pod: JsonObject, budget: JsonObject) -> bool:
        """An unready pod does not count as healthy: deleting it disrupts nothing when the
        budget says so."""
        if is_ready(pod):
            return False
        if (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return True
        status = budget.get("status") or {}
        desired = int(status.get("desiredHealthy", 0))
        return int(status.get("currentHealthy", 0)) >= desired > 0

    def _check_and_decrement(self, budget: JsonObject, pod_name: str, dry_run: bool) -> None:
        meta, status = budget["metadata"], dict(budget.get("status") or {})
        budget_name = meta["name"]
        if int(status.get("observedGeneration", 0)) < int(meta.get("generation", 1)):
            raise _too_many_requests(
                f"The disruption budget {budget_name} is still being processed by the server.",
                retry_after_seconds=10,
            )
        allowed = int(status.get("disruptionsAllowed", 0))
        disrupted: dict[str, str] = dict(status.get("disruptedPods") or {})
        if allowed < 0:
            raise _forbidden(budget_name, "pdb disruptions allowed is negative")
        if len(disrupted) > MAX_DISRUPTED_PODS:
            raise _forbidden(
                budget_name,
                "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
            )
        if allowed == 0:
            raise _too_many_requests(
                f"The disruption budget {budget_name} needs {status.get('desiredHealthy', 0)} "
                f"healthy pods and has {status.get('currentHealthy', 0)} currently"
            )
        if dry_run:
            return
        now = datetime.now(UTC)
        status["disruptionsAllowed"] = allowed - 1
        status["disruptedPods"] = {**disrupted, pod_name: timestamp(now)}
        if allowed == 1:
            status = with_disruption_allowed_condition(status, now)
        self._store.update(self._budgets, {**budget, "status": status})

    def _mark_disruption_target(self, pod: JsonObject) -> None:
        status = pod.setdefault("status", {})
        conditions = [
            c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"
        ]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
                "lastProbeTime": None,
                "lastTransitionTime": timestamp(datetime.now(UTC)),
            }
        )
        status["conditions"] = conditions
        self._store.update(self._pods, pod)
