"""The instance's /metrics, /readyz and /healthz endpoints."""

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from smoothscale.runtime.metrics import InstanceMetrics, MetricsServer, start_http_server
from smoothscale.tasks import TaskRole


@pytest.fixture
def metrics() -> InstanceMetrics:
    return InstanceMetrics()


@pytest.fixture
def server(metrics: InstanceMetrics) -> Iterator[MetricsServer]:
    running = start_http_server(0, metrics, host="127.0.0.1")
    yield running
    running.stop()


def get(server: MetricsServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_metrics_endpoint_serves_the_instance_counters(
    metrics: InstanceMetrics, server: MetricsServer
) -> None:
    metrics.count_processed(3, 120)
    metrics.count_processed(3, 30)
    metrics.count_dead_letters(["malformed-json", "malformed-json", "missing-field"])
    metrics.observe_batch(0.4)
    metrics.count_restored(5, 1000)
    metrics.set_restore_rate(5, 25000.0)
    metrics.set_lag(5, TaskRole.WARMUP, 4000)

    status, body = get(server, "/metrics")

    assert status == 200
    assert 'smoothscale_records_processed_total{task="3"} 150.0' in body
    assert 'smoothscale_dead_letters_total{reason="malformed-json"} 2.0' in body
    assert 'smoothscale_dead_letters_total{reason="missing-field"} 1.0' in body
    assert "smoothscale_batch_duration_seconds_count 1.0" in body
    assert 'smoothscale_batch_duration_seconds_bucket{le="0.5"} 1.0' in body
    assert 'smoothscale_restore_records_total{task="5"} 1000.0' in body
    assert 'smoothscale_restore_rate_records_per_second{task="5"} 25000.0' in body
    assert 'smoothscale_task_lag{role="warmup",task="5"} 4000.0' in body


def test_readiness_answers_503_until_the_instance_is_ready_then_200(
    metrics: InstanceMetrics, server: MetricsServer
) -> None:
    assert get(server, "/readyz")[0] == 503
    assert get(server, "/healthz")[0] == 200

    metrics.set_ready(True)

    assert get(server, "/readyz")[0] == 200
    assert "smoothscale_ready 1.0" in get(server, "/metrics")[1]

    metrics.set_ready(False)

    assert get(server, "/readyz")[0] == 503


def test_a_task_changing_role_reports_lag_only_in_its_new_role(metrics: InstanceMetrics) -> None:
    metrics.set_lag(5, TaskRole.WARMUP, 4000)
    metrics.set_lag(5, TaskRole.ACTIVE, 12)

    body = metrics.exposition().decode()

    assert 'smoothscale_task_lag{role="active",task="5"} 12.0' in body
    assert 'role="warmup"' not in body


def test_forgetting_a_task_removes_its_series(metrics: InstanceMetrics) -> None:
    metrics.count_processed(3, 10)
    metrics.count_processed(4, 10)
    metrics.set_lag(3, TaskRole.ACTIVE, 7)
    metrics.set_restore_rate(3, 5.0)

    metrics.forget_task(3)

    body = metrics.exposition().decode()
    assert 'task="3"' not in body
    assert 'smoothscale_records_processed_total{task="4"} 10.0' in body


def test_two_instances_in_one_process_keep_separate_metrics() -> None:
    first, second = InstanceMetrics(), InstanceMetrics()

    first.count_processed(1, 5)

    assert b'task="1"' not in second.exposition()


def test_an_unknown_path_is_404_and_names_the_endpoints(server: MetricsServer) -> None:
    status, body = get(server, "/nope")

    assert status == 404
    assert "/metrics" in body


def test_stopping_the_server_frees_its_port(metrics: InstanceMetrics) -> None:
    running = start_http_server(0, metrics, host="127.0.0.1")
    port = running.port
    running.stop()

    again = start_http_server(port, metrics, host="127.0.0.1")
    try:
        assert get(again, "/healthz") == (200, "ok\n")
    finally:
        again.stop()
