"""The kopf handlers: thin wiring from Kubernetes events to the per-app control loop.

- a daemon per StreamingApp runs its `AppController` (reconcile.py): a poll every
  spec.scaling.lagPollInterval while anything moves, every probingInterval otherwise;
- any change of the app's spec (metadata.generation: `kubectl scale`, `kubectl apply`, an HPA)
  or of one of its pods (labelled smoothscale.io/app) wakes its loop at once;
- at start-up: kopf keeps its bookkeeping in annotations (the API server prunes unknown status
  fields), and the metrics server starts.

The handlers hold no state of their own beyond the wake-up events of the running loops.
"""

import logging
import threading
from datetime import timedelta
from typing import Any

import kopf

from smoothscale.api.models import GROUP, PLURAL, VERSION
from smoothscale.kubeapi import KubeApi
from smoothscale.operator.metrics import OperatorMetrics
from smoothscale.operator.pods import APP_LABEL
from smoothscale.operator.reconcile import AppController

log = logging.getLogger(__name__)

ERROR_RETRY = timedelta(seconds=5)
"""After an unexpected error, the next poll comes this soon (the error is an Event)."""

PEERING_LIFETIME_SECONDS = 15
"""How long a peer's keepalive counts (kopf refreshes it 5-10 s before it runs out)."""

PEERING_SETTLE_SECONDS = 3.0
"""With peering, how long a control loop waits before its first poll. Replicas that start
together each run alone until they see the others' keepalives (tens of milliseconds here):
a loop that waits this long is cancelled by the pause before it has acted."""

METRICS = OperatorMetrics()
"""The operator process's metrics (served by `smoothscale operator --metrics-port`)."""

_wakeups: dict[tuple[str, str], threading.Event] = {}
"""The wake-up event of every running control loop."""
_generations: dict[tuple[str, str], int] = {}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # kopf's own progress and diff-base go to annotations: the status is the operator's record
    # and its schema has no place for kopf's fields.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="smoothscale.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="smoothscale.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # The CRD is installed before the operator starts (the chart's crds/), and the namespaces
    # are given: no scanning of CRDs and namespaces, which the chart's RBAC does not grant.
    settings.scanning.disabled = True
    # A peer that dies (SIGKILL, a lost node) is taken for dead once its record is this old:
    # kopf's 60 s would leave a hand-over in flight, and its task, without an owner that long.
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS


@kopf.on.event(GROUP, VERSION, PLURAL)
def wake_on_spec_change(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> None:
    """A new metadata.generation is a spec change: its loop polls at once."""
    key = (namespace or "", name)
    generation = int(body.get("metadata", {}).get("generation") or 0)
    if _generations.get(key) == generation:
        return
    _generations[key] = generation
    wakeup = _wakeups.get(key)
    if wakeup is not None:
        wakeup.set()


@kopf.on.event("", "v1", "pods", labels={APP_LABEL: kopf.PRESENT})
def wake_on_pod_change(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    """A pod of an app changed (started, ready, killed, deleted): its loop polls at once, so a
    dead owner's tasks fail over without waiting for the next probing poll."""
    wakeup = _wakeups.get((namespace or "", labels[APP_LABEL]))
    if wakeup is not None:
        wakeup.set()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=60)
def control_loop(
    *,
    stopped: kopf.DaemonStopped,
    namespace: str | None,
    name: str,
    body: kopf.Body,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Run the app's control loop until the app is deleted or the operator stops."""
    if memo.peering and stopped.wait(PEERING_SETTLE_SECONDS):
        return  # paused in favour of a peer: it was never this replica's to run
    logger.info("the control loop starts")
    namespace = namespace or ""
    key = (namespace, name)
    wakeup = _wakeups.setdefault(key, threading.Event())

    def post(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message)

    kube = KubeApi.connect()
    controller = AppController(
        kube,
        namespace,
        name=name,
        events=post,
        metrics=METRICS,
        instance_port=memo.instance_port,
        policy=memo.policy,
    )
    try:
        while not stopped:
            wakeup.clear()
            try:
                interval = controller.poll()
            except Exception as error:
                logger.exception("the control loop of %s/%s failed", namespace, name)
                METRICS.count_error(namespace, name, type(error).__name__)
                post("Warning", "ReconcileFailed", f"{type(error).__name__}: {error}")
                controller.ledger = None  # re-read the memory from Kafka next time
                interval = ERROR_RETRY
            if interval is None:
                return
            _sleep(stopped, wakeup, interval)
    finally:
        controller.close()
        kube.close()
        _wakeups.pop(key, None)
        _generations.pop(key, None)


def _sleep(stopped: kopf.DaemonStopped, wakeup: threading.Event, interval: timedelta) -> None:
    """Wait `interval`, or less when the spec changes or the daemon is stopped."""
    remaining = interval.total_seconds()
    while remaining > 0 and not stopped and not wakeup.is_set():
        step = min(remaining, 0.2)
        wakeup.wait(step)
        remaining -= step


@kopf.on.delete(GROUP, VERSION, PLURAL)
def release_on_delete(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    runtime: timedelta,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Before the app goes (kopf's finalizer holds it): its control loop stops, every task is
    released, then its pods are deleted (`AppController.tear_down`)."""
    key = (namespace or "", name)
    wakeup = _wakeups.get(key)
    if wakeup is not None:
        wakeup.set()  # it sees the deletion and returns
        raise kopf.TemporaryError("waiting for the control loop to stop", delay=1)

    def post(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message)

    kube = KubeApi.connect()
    controller = AppController(
        kube,
        namespace or "",
        name=name,
        events=post,
        metrics=METRICS,
        instance_port=memo.instance_port,
        policy=memo.policy,
    )
    try:
        done = controller.tear_down(waited=runtime)
    finally:
        controller.close()
        kube.close()
    if not done:
        raise kopf.TemporaryError("waiting for the instances to release their tasks", delay=2)
