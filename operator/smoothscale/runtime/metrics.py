"""The instance's Prometheus metrics and its health endpoints.

`InstanceMetrics` holds every metric an instance exports, in its own registry (several instances
can live in one test process without clashing). `start_http_server` serves them:
- /metrics: the Prometheus text format;
- /readyz: 200 once the instance is ready (`set_ready(True)`) and while it is not stalled,
  503 before, after and while stalled: a stalled pod turns not Ready, and that change of the
  pod wakes the operator, which fails its tasks over without waiting for its next poll;
- /healthz: 200 while the process answers and is not stalled (a micro-batch running past the
  stall timeout, or none completed that long while input waits), else 503 with the reason.
"""

import threading
from collections.abc import Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from smoothscale.tasks import TaskId, TaskRole

NAMESPACE = "smoothscale"

BATCH_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds; a steady micro-batch takes well under a second, the first one several."""


class InstanceMetrics:
    """Every metric of one instance, in a registry of its own.

    Per-task series are labelled task="<id>"; `forget_task` removes a task's series once the
    instance no longer holds it, so a scrape shows only what the instance holds.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.records_processed = Counter(
            "records_processed",
            "Input records processed by the instance's streaming query, per task.",
            ["task"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "dead_letters",
            "Input records sent to the dead-letter topic, per reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.late_rows = Counter(
            "late_rows",
            "Input rows a StatefulProcessor pipeline (EventTime) dropped as late, at or below "
            "their task's watermark (Spark's numRowsDroppedByWatermark), per task.",
            ["task"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.batch_duration = Histogram(
            "batch_duration_seconds",
            "Wall time of a micro-batch, from reading its input to committing it.",
            namespace=NAMESPACE,
            buckets=BATCH_DURATION_BUCKETS,
            registry=self.registry,
        )
        self.restore_records = Counter(
            "restore_records",
            "Changelog records applied to local state by the restore loop, per task.",
            ["task"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.bad_assignment_records = Counter(
            "bad_assignment_records",
            "Records of the assignments topic for this instance that did not decode (skipped).",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.stale_stores = Counter(
            "stale_stores",
            "Local task stores found stale on reopening (a higher writer wrote past their "
            "verified offset, or last written longer ago than state_reuse_seconds) and restored "
            "from scratch.",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.restore_rate = Gauge(
            "restore_rate_records_per_second",
            "Recent rate at which the restore loop applies changelog records, per task.",
            ["task"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.task_lag = Gauge(
            "task_lag",
            "Records behind, per task and role: input lag for an active task, changelog lag "
            "for a standby or warm-up.",
            ["task", "role"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self._ready = Gauge(
            "ready",
            "1 when the instance is ready (its readiness endpoint answers 200), else 0.",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self._ready_lock = threading.Lock()
        self._is_ready = False
        self._stalled: str | None = None

    def set_ready(self, ready: bool) -> None:
        """Say whether the instance is ready; /readyz follows at once."""
        with self._ready_lock:
            self._is_ready = ready
            self._ready.set(1 if ready else 0)

    @property
    def ready(self) -> bool:
        with self._ready_lock:
            return self._is_ready

    def set_stalled(self, why: str | None) -> None:
        """Say the instance is stalled, and why (None: it is not); /healthz follows at once."""
        with self._ready_lock:
            self._stalled = why

    @property
    def stalled(self) -> str | None:
        with self._ready_lock:
            return self._stalled

    def count_processed(self, task: TaskId, records: int) -> None:
        self.records_processed.labels(task=str(task)).inc(records)

    def count_dead_letters(self, reasons: Iterable[str]) -> None:
        """Count one dead letter per reason given (repeat a reason for each record)."""
        for reason in reasons:
            self.dead_letters.labels(reason=reason).inc()

    def count_late_rows(self, task: TaskId, rows: int) -> None:
        if rows:
            self.late_rows.labels(task=str(task)).inc(rows)

    def observe_batch(self, seconds: float) -> None:
        self.batch_duration.observe(seconds)

    def count_restored(self, task: TaskId, records: int) -> None:
        self.restore_records.labels(task=str(task)).inc(records)

    def count_stale_store(self) -> None:
        self.stale_stores.inc()

    def count_bad_assignment_record(self) -> None:
        self.bad_assignment_records.inc()

    def set_restore_rate(self, task: TaskId, records_per_second: float) -> None:
        self.restore_rate.labels(task=str(task)).set(records_per_second)

    def set_lag(self, task: TaskId, role: TaskRole, lag: int) -> None:
        """Set the task's lag in `role`, and drop any series of the task in another role."""
        for other in TaskRole:
            if other is not role:
                self._remove(self.task_lag, str(task), other.value)
        self.task_lag.labels(task=str(task), role=role.value).set(lag)

    def forget_task(self, task: TaskId) -> None:
        """Drop every per-task series of `task` (the instance no longer holds it)."""
        label = str(task)
        for metric in (
            self.records_processed,
            self.restore_records,
            self.restore_rate,
            self.late_rows,
        ):
            self._remove(metric, label)
        for role in TaskRole:
            self._remove(self.task_lag, label, role.value)

    @staticmethod
    def _remove(metric: Counter | Gauge, *labels: str) -> None:
        try:
            metric.remove(*labels)
        except KeyError:
            return

    def exposition(self) -> bytes:
        """The current metrics in the Prometheus text format."""
        return generate_latest(self.registry)


class MetricsServer:
    """An HTTP server thread serving /metrics, /readyz and /healthz for one `InstanceMetrics`."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="smoothscale-metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def stop(self) -> None:
        """Stop serving and close the socket; calling it again does nothing."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def start_http_server(port: int, metrics: InstanceMetrics, host: str = "0.0.0.0") -> MetricsServer:
    """Serve `metrics` on `host`:`port` in a background thread; port 0 picks a free port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._answer(HTTPStatus.OK, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path == "/readyz":
                stalled = metrics.stalled
                if stalled is not None:
                    self._answer(HTTPStatus.SERVICE_UNAVAILABLE, f"stalled: {stalled}\n".encode())
                elif metrics.ready:
                    self._answer(HTTPStatus.OK, b"ready\n")
                else:
                    self._answer(HTTPStatus.SERVICE_UNAVAILABLE, b"not ready\n")
            elif path == "/healthz":
                stalled = metrics.stalled
                if stalled is None:
                    self._answer(HTTPStatus.OK, b"ok\n")
                else:
                    self._answer(HTTPStatus.SERVICE_UNAVAILABLE, f"stalled: {stalled}\n".encode())
            else:
                self._answer(
                    HTTPStatus.NOT_FOUND, b"not found: try /metrics, /readyz or /healthz\n"
                )

        def _answer(
            self, status: HTTPStatus, body: bytes, content_type: str = "text/plain"
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Scrapes and probes are frequent; do not log each one."""

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return MetricsServer(server)
