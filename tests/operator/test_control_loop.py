"""The control loop and the app's pods when the spec gets in their way: in this process with
the chart's RBAC (in_process.py) and the embedded Kafka, no kubelet, no Spark."""

from typing import Any

from smoothscale.devcluster.kafkafront import KafkaFront
from tests.operator.in_process import Platform, create_topics, streaming_app


def app_with_topics(kafka_front: KafkaFront, **spec: Any) -> dict[str, Any]:
    source = streaming_app(kafka_front.bootstrap_servers, **spec)
    create_topics(kafka_front.bootstrap_servers, source)
    return source


def test_resources_no_instance_can_run_in_are_degraded_before_any_pod_is_created(
    platform: Platform, kafka_front: KafkaFront
) -> None:
    source = app_with_topics(kafka_front, resources={"limits": {"memory": "1Gi"}})
    platform.apply(source)

    platform.controller(source).poll()

    degraded = platform.degraded(source)
    assert degraded["reason"] == "InvalidPodSpec"
    assert "spec.resources.limits.memory (1Gi) is too small" in degraded["message"]
    assert ("Warning", "InvalidPodSpec", degraded["message"]) in platform.events
    assert platform.pods() == []
