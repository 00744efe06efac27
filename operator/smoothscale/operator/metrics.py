"""The operator's Prometheus metrics, per StreamingApp, and the HTTP server that exports them.

Every series is labelled with the app's namespace and name. `OperatorMetrics` keeps them in a
registry of its own (tests and several operators in one process do not clash, and nothing of
the process's default registry leaks into the scrape). `forget_app` drops an app's series when
the app is deleted, so a scrape shows only apps that exist. The server is prometheus_client's
own: the operator needs nothing but /metrics on its port (9090, the chart's metrics Service);
its liveness endpoint is kopf's.
"""

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.exposition import generate_latest

from smoothscale.runtime.metrics import NAMESPACE
from smoothscale.tasks import TaskId, TaskRole

METRICS_PORT = 9090
APP_LABELS = ("namespace", "name")
TASK_LABELS = (*APP_LABELS, "task", "instance", "role")

HANDOVER_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds from revoke to active: a micro-batch to finish, a poll, a restore to catch up."""
RECONCILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds of one reconcile: a few API calls and a constant number of Kafka requests."""


@dataclass(frozen=True)
class TaskLag:
    """How far one holder of a task is behind: changelog records for a warm-up or standby."""

    task: TaskId
    instance: str
    role: TaskRole
    lag: int


class OperatorMetrics:
    """Every metric of the operator, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.desired_replicas = self._gauge(
            "desired_replicas", "Instances the app's spec asks for (spec.replicas)."
        )
        self.ready_replicas = self._gauge("ready_replicas", "Instances whose pod is ready.")
        self.active_replicas = self._gauge(
            "active_replicas", "Instances that own at least one active task."
        )
        self.warmup_replicas = self._gauge(
            "warmup_replicas", "Instances restoring at least one warm-up task."
        )
        self.max_lag = self._gauge(
            "max_lag_records",
            "The largest changelog lag of any warm-up or standby task of the app (records).",
        )
        self.input_lag = self._gauge(
            "input_lag_records",
            "Input records the app has not processed yet, summed over its tasks: what an HPA "
            "or KEDA scales on (docs/autoscaling.md).",
        )
        self.input_lag_seconds = self._gauge(
            "input_lag_seconds",
            "The largest, over the app's tasks, age of the newest input record processed while "
            "input waits (0 when none does).",
        )
        self.task_lag = Gauge(
            "task_lag_records",
            "Changelog records a holder of a task is behind, per task, instance and role.",
            TASK_LABELS,
            namespace=NAMESPACE,
            subsystem="app",
            registry=self.registry,
        )
        self.handover_duration = Histogram(
            "handover_duration_seconds",
            "Time from revoking a task at its old owner to its new owner processing it.",
            APP_LABELS,
            namespace=NAMESPACE,
            subsystem="app",
            buckets=HANDOVER_BUCKETS,
            registry=self.registry,
        )
        self.reconcile_duration = Histogram(
            "reconcile_duration_seconds",
            "Wall time of one reconcile of an app (observe, plan, act, record).",
            APP_LABELS,
            namespace=NAMESPACE,
            subsystem="operator",
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "reconcile_errors",
            "Reconciles of an app that ended in an error, by reason (the condition's reason).",
            (*APP_LABELS, "reason"),
            namespace=NAMESPACE,
            subsystem="operator",
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._task_series: dict[tuple[str, str], set[tuple[str, ...]]] = {}
        self._error_reasons: dict[tuple[str, str], set[str]] = {}

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(
            name,
            documentation,
            APP_LABELS,
            namespace=NAMESPACE,
            subsystem="app",
            registry=self.registry,
        )

    def set_replicas(
        self, namespace: str, name: str, *, desired: int, ready: int, active: int, warmup: int
    ) -> None:
        for gauge, value in (
            (self.desired_replicas, desired),
            (self.ready_replicas, ready),
            (self.active_replicas, active),
            (self.warmup_replicas, warmup),
        ):
            gauge.labels(namespace, name).set(value)

    def set_lag(self, namespace: str, name: str, lags: list[TaskLag]) -> None:
        """The app's lag now: each holder's series, and the largest (0 when nothing lags).
        Series of holders no longer in `lags` are dropped."""
        current = {
            (namespace, name, str(lag.task), lag.instance, lag.role.value): lag.lag for lag in lags
        }
        with self._lock:
            previous = self._task_series.get((namespace, name), set())
            for labels in previous - current.keys():
                self.task_lag.remove(*labels)
            self._task_series[(namespace, name)] = set(current)
        for labels, value in current.items():
            self.task_lag.labels(*labels).set(value)
        self.max_lag.labels(namespace, name).set(max(current.values(), default=0))

    def set_input_lag(
        self, namespace: str, name: str, records: int | None, seconds: float | None
    ) -> None:
        """The app's input lag now; a series without a value (not known yet) is dropped."""
        for gauge, value in ((self.input_lag, records), (self.input_lag_seconds, seconds)):
            if value is None:
                _remove(gauge, namespace, name)
            else:
                gauge.labels(namespace, name).set(value)

    def observe_handover(self, namespace: str, name: str, seconds: float) -> None:
        self.handover_duration.labels(namespace, name).observe(seconds)

    def observe_reconcile(self, namespace: str, name: str, seconds: float) -> None:
        self.reconcile_duration.labels(namespace, name).observe(seconds)

    def count_error(self, namespace: str, name: str, reason: str) -> None:
        with self._lock:
            self._error_reasons.setdefault((namespace, name), set()).add(reason)
        self.reconcile_errors.labels(namespace, name, reason).inc()

    def forget_app(self, namespace: str, name: str) -> None:
        """Drop every series of the app (it was deleted)."""
        app = (namespace, name)
        with self._lock:
            task_series = self._task_series.pop(app, set())
            reasons = self._error_reasons.pop(app, set())
        for labels in task_series:
            self.task_lag.remove(*labels)
        for reason in reasons:
            self.reconcile_errors.remove(namespace, name, reason)
        for metric in (
            self.desired_replicas,
            self.ready_replicas,
            self.active_replicas,
            self.warmup_replicas,
            self.max_lag,
            self.input_lag,
            self.input_lag_seconds,
            self.handover_duration,
            self.reconcile_duration,
        ):
            _remove(metric, namespace, name)

    def exposition(self) -> bytes:
        """The current metrics in the Prometheus text format."""
        return generate_latest(self.registry)


def _remove(metric: Gauge | Histogram, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        return


@dataclass
class MetricsServer:
    """The running /metrics server; `stop` closes it."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def serve_metrics(
    metrics: OperatorMetrics, port: int = METRICS_PORT, host: str = "0.0.0.0"
) -> MetricsServer:
    """Serve `metrics` at http://host:port/metrics in a background thread (port 0: any free)."""
    server, thread = start_http_server(port, host, registry=metrics.registry)
    return MetricsServer(server, thread)
