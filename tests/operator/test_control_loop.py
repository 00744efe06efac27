"""The control loop and the app's pods when the spec or a node gets in their way: in this
process with the chart's RBAC (in_process.py) and the embedded Kafka, no kubelet, no Spark."""

from typing import Any

from devstack.kafka.front import KafkaFront
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


def test_an_evicted_pod_is_deleted_and_created_again(
    platform: Platform, kafka_front: KafkaFront
) -> None:
    source = app_with_topics(kafka_front)
    platform.apply(source)
    controller = platform.controller(source)
    controller.poll()
    [pod] = platform.pods()
    name = pod["metadata"]["name"]

    # What a kubelet reports when the state volume outgrows its sizeLimit.
    evicted = 'Usage of EmptyDir volume "state" exceeds the limit "10Gi". '
    platform.set_pod_status(name, {"phase": "Failed", "reason": "Evicted", "message": evicted})
    controller.poll()

    [warning] = [event for event in platform.events if event[1] == "InstanceFailed"]
    assert warning[0] == "Warning"
    assert f"pod {name} has failed for good (Evicted: {evicted})" in warning[2]
    assert platform.pods() == []
    controller.poll()
    [again] = platform.pods()
    assert again["metadata"]["name"] == name
    assert again["metadata"]["uid"] != pod["metadata"]["uid"]
