"""What a user can ask of a running app, and what keeps running when something needs a person:
its input lag (status, per task, metric), how each scaling ended, a topic problem that does not
freeze the app. The operator's real control loop and real instances, in this process."""

from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from devstack.kafka.front import KafkaFront
from smoothscale.api.models import API_VERSION, PLURAL
from smoothscale.kafka import names
from smoothscale.kafka.progress import ProgressReader
from smoothscale.kubeapi import MERGE_PATCH
from smoothscale.operator.reconcile import AppController
from tests.operator.in_process import APPS, Platform, create_topics, streaming_app
from tests.operator.protocol import InProcessPods, active_holders, produce

TASKS = 2
FAST = {"lagPollInterval": "100ms", "probingInterval": "1s"}


def app_path(source: dict[str, Any]) -> str:
    return f"/apis/{API_VERSION}/namespaces/{APPS}/{PLURAL}/{source['metadata']['name']}"


def status(platform: Platform, source: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = platform.admin.request("GET", app_path(source))["status"]
    return found


def scale(platform: Platform, source: dict[str, Any], replicas: int) -> None:
    platform.admin.request(
        "PATCH", app_path(source), body={"spec": {"replicas": replicas}}, content_type=MERGE_PATCH
    )


def run(controller: AppController, pods: InProcessPods, until: Any, polls: int = 80) -> None:
    for _ in range(polls):
        controller.poll()
        if until():
            return
        pods.sync()
        pods.feed()
    raise AssertionError(f"not within {polls} polls: {until.__doc__}")


def test_the_input_lag_is_in_the_status_per_task_and_as_a_metric(
    platform: Platform, kafka_front: KafkaFront, tmp_path: Path
) -> None:
    source = streaming_app(kafka_front.bootstrap_servers, replicas=1, scaling=FAST)
    create_topics(kafka_front.bootstrap_servers, source, partitions=TASKS)
    topic = source["spec"]["kafka"]["inputTopics"][0]
    platform.apply(source)
    pods = InProcessPods(platform, tmp_path / "pods")
    controller = platform.controller(source)
    try:

        def caught_up() -> bool:
            """every task active and caught up"""
            return status(platform, source).get("inputLag") == 0

        run(controller, pods, caught_up)
        # 40 records a task arrive; the instance reads 50 a batch per task, so one batch
        # takes them all: before it, the status shows them waiting.
        users = [f"user-{i}" for i in range(80)]
        produce(kafka_front.bootstrap_servers, topic, users, TASKS)
        controller.poll()
        behind = status(platform, source)
        series = controller.metrics.registry.get_sample_value(
            "smoothscale_app_input_lag_records",
            {"namespace": APPS, "name": source["metadata"]["name"]},
        )
        pods.feed()
        controller.poll()
        after = status(platform, source)
    finally:
        pods.close()

    per_task = {task["task"]: task["inputLag"] for task in behind["tasks"]}
    assert sum(per_task.values()) == behind["inputLag"] == 80 == series
    assert all(lag > 0 for lag in per_task.values())
    assert after["inputLag"] == 0
    assert after["inputLagSeconds"] == 0
    assert behind["inputLagSeconds"] is not None


def test_a_scaling_superseded_by_the_next_says_so_and_the_next_ends_with_scaled(
    platform: Platform, kafka_front: KafkaFront, tmp_path: Path
) -> None:
    source = streaming_app(kafka_front.bootstrap_servers, replicas=1, scaling=FAST)
    create_topics(kafka_front.bootstrap_servers, source, partitions=3)
    platform.apply(source)
    pods = InProcessPods(platform, tmp_path / "pods")
    controller = platform.controller(source)
    try:

        def settled() -> bool:
            """settled"""
            conditions = status(platform, source).get("conditions") or []
            progressing = next((c for c in conditions if c["type"] == "Progressing"), {})
            return progressing.get("status") == "False"

        run(controller, pods, settled)
        scale(platform, source, 3)
        controller.poll()
        controller.poll()
        scale(platform, source, 2)
        run(controller, pods, lambda: any(e[1] == "Scaled" for e in platform.events))
    finally:
        pods.close()

    reasons = [(reason, message) for _kind, reason, message in platform.events]
    [superseded] = [message for reason, message in reasons if reason == "ScalingSuperseded"]
    assert "scaling from 1 to 3 instances superseded" in superseded
    assert superseded.endswith("by scaling to 2")
    [scaled] = [message for reason, message in reasons if reason == "Scaled"]
    assert scaled.startswith("scaled from 3 to 2 instances")


def test_a_topic_problem_does_not_stop_a_failover(
    platform: Platform, kafka_front: KafkaFront, tmp_path: Path
) -> None:
    """A changelog reconfigured so that retention would delete state is a problem for a
    person (Degraded), not a reason to leave a task without an owner: an instance lost
    meanwhile still has its tasks failed over."""
    source = streaming_app(kafka_front.bootstrap_servers, replicas=2, scaling=FAST)
    create_topics(kafka_front.bootstrap_servers, source, partitions=TASKS)
    name = source["metadata"]["name"]
    app_id = f"{APPS}.{name}"
    platform.apply(source)
    pods = InProcessPods(platform, tmp_path / "pods")
    controller = platform.controller(source)
    reader = ProgressReader(
        kafka_front.bootstrap_servers,
        app_id,
        {"counts": names.changelog_topic(app_id, "counts")},
    )
    try:

        def spread() -> bool:
            """each instance active on one task"""
            return len(set(active_holders(reader, pods, TASKS).values())) == 2

        run(controller, pods, spread)
        admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
        changelog = ConfigResource("TOPIC", names.changelog_topic(app_id, "counts"))
        changelog.add_incremental_config(
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)
        )
        admin.incremental_alter_configs([changelog])[changelog].result(10)
        controller.poll()
        assert platform.degraded(source)["reason"] == "ChangelogRetention"
        lost = f"{name}-1"
        pods.kill(lost)
        platform.admin.request("DELETE", f"/api/v1/namespaces/{APPS}/pods/{lost}")

        def every_task_active() -> bool:
            """every task active on a live instance"""
            holders = active_holders(reader, pods, TASKS)
            return set(holders) == set(range(TASKS)) and lost not in holders.values()

        run(controller, pods, every_task_active)
        degraded = platform.degraded(source)
    finally:
        pods.close()
        reader.close()

    assert degraded["reason"] == "ChangelogRetention"
