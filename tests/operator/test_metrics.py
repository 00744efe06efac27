"""The operator's Prometheus metrics: per-app series, their removal, and the /metrics server."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from smoothscale.operator.metrics import OperatorMetrics, TaskLag, serve_metrics
from smoothscale.tasks import TaskRole


def samples(metrics: OperatorMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = metrics.exposition().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: OperatorMetrics, sample: str, **labels: str) -> float | None:
    return samples(metrics).get((sample, frozenset(labels.items())))


APP = {"namespace": "shop", "name": "counter"}


def test_replica_counts_render_per_app() -> None:
    metrics = OperatorMetrics()
    metrics.set_replicas("shop", "counter", desired=3, ready=2, active=2, warmup=1)
    metrics.set_replicas("shop", "other", desired=1, ready=1, active=1, warmup=0)

    assert value(metrics, "smoothscale_app_desired_replicas", **APP) == 3
    assert value(metrics, "smoothscale_app_ready_replicas", **APP) == 2
    assert value(metrics, "smoothscale_app_active_replicas", **APP) == 2
    assert value(metrics, "smoothscale_app_warmup_replicas", **APP) == 1
    assert value(metrics, "smoothscale_app_desired_replicas", namespace="shop", name="other") == 1


def test_lag_per_task_and_its_maximum_follow_the_holders_of_the_last_poll() -> None:
    metrics = OperatorMetrics()
    metrics.set_lag(
        "shop",
        "counter",
        [
            TaskLag(0, "counter-2", TaskRole.WARMUP, 900),
            TaskLag(1, "counter-2", TaskRole.WARMUP, 40),
        ],
    )
    task_0 = {**APP, "task": "0", "instance": "counter-2", "role": "warmup"}
    assert value(metrics, "smoothscale_app_task_lag_records", **task_0) == 900
    assert value(metrics, "smoothscale_app_max_lag_records", **APP) == 900

    metrics.set_lag("shop", "counter", [TaskLag(1, "counter-2", TaskRole.WARMUP, 10)])

    assert value(metrics, "smoothscale_app_task_lag_records", **task_0) is None
    assert value(metrics, "smoothscale_app_max_lag_records", **APP) == 10
    metrics.set_lag("shop", "counter", [])
    assert value(metrics, "smoothscale_app_max_lag_records", **APP) == 0


def test_handover_and_reconcile_durations_are_histograms_and_errors_count_by_reason() -> None:
    metrics = OperatorMetrics()
    metrics.observe_handover("shop", "counter", 3.2)
    metrics.observe_handover("shop", "counter", 0.7)
    metrics.observe_reconcile("shop", "counter", 0.2)
    metrics.count_error("shop", "counter", "KafkaUnavailable")
    metrics.count_error("shop", "counter", "KafkaUnavailable")
    metrics.count_error("shop", "counter", "TopicMissing")

    assert value(metrics, "smoothscale_app_handover_duration_seconds_count", **APP) == 2
    handover_sum = value(metrics, "smoothscale_app_handover_duration_seconds_sum", **APP)
    assert handover_sum == pytest.approx(3.9)
    assert value(metrics, "smoothscale_app_handover_duration_seconds_bucket", **APP, le="1.0") == 1
    assert value(metrics, "smoothscale_operator_reconcile_duration_seconds_count", **APP) == 1
    errors = "smoothscale_operator_reconcile_errors_total"
    assert value(metrics, errors, **APP, reason="KafkaUnavailable") == 2
    assert value(metrics, errors, **APP, reason="TopicMissing") == 1


def test_a_deleted_app_leaves_no_series_behind() -> None:
    metrics = OperatorMetrics()
    for name in ("counter", "other"):
        metrics.set_replicas("shop", name, desired=2, ready=2, active=2, warmup=0)
        metrics.set_lag("shop", name, [TaskLag(0, f"{name}-1", TaskRole.STANDBY, 5)])
        metrics.observe_handover("shop", name, 1.0)
        metrics.observe_reconcile("shop", name, 0.1)
        metrics.count_error("shop", name, "TopicMissing")

    metrics.forget_app("shop", "counter")
    metrics.forget_app("shop", "never-seen")

    names = [dict(labels).get("name") for _, labels in samples(metrics)]
    assert "counter" not in names
    assert names.count("other") > 10


def test_the_server_serves_the_registry_at_metrics() -> None:
    metrics = OperatorMetrics()
    metrics.set_replicas("shop", "counter", desired=3, ready=3, active=3, warmup=0)
    server = serve_metrics(metrics, port=0, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as got:
            body = got.read().decode()
    finally:
        server.stop()
    assert 'smoothscale_app_desired_replicas{name="counter",namespace="shop"} 3.0' in body
    assert "python_gc" not in body  # the operator's registry, not the process's default one
