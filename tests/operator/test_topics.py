"""The operator creates the topics an app owns and reports what is wrong with the ones it uses,
against a cluster that administers topics like a real one (the `kafka_front` fixture)."""

import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)

from devstack.kafka.front import KafkaFront
from smoothscale.api.models import StreamingApp
from smoothscale.operator.topics import TopicCheck, TopicManager
from tests.runtime.kafka_helpers import read_committed

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "streamingapp.yaml"


def make_app(
    front: KafkaFront, inputs: dict[str, int], output: int | None = 1, stores: int = 2
) -> tuple[StreamingApp, str]:
    """An app reading `inputs` (created with those partition counts) and its application id."""
    suffix = uuid.uuid4().hex[:8]
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    app_id = f"app-{suffix}"
    for topic, partitions in inputs.items():
        front.kafka.create_topic(f"{topic}-{suffix}", partitions)
    output_topic = f"out-{suffix}"
    if output is not None:
        front.kafka.create_topic(output_topic, output)
    manifest["spec"]["kafka"] = {
        "bootstrapServers": front.bootstrap_servers,
        "applicationId": app_id,
        "inputTopics": [f"{topic}-{suffix}" for topic in inputs],
        "outputTopic": output_topic,
        "stateStores": [{"name": f"store{index}"} for index in range(stores)],
    }
    return StreamingApp.model_validate(manifest), app_id


def ensure(front: KafkaFront, app: StreamingApp) -> TopicCheck:
    manager = TopicManager({"bootstrap.servers": front.bootstrap_servers})
    try:
        return manager.ensure(app)
    finally:
        manager.close()


def partitions_and_policy(front: KafkaFront, topic: str) -> tuple[int, str]:
    admin = AdminClient({"bootstrap.servers": front.bootstrap_servers})
    partitions = len(admin.list_topics(timeout=10).topics[topic].partitions)
    (future,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return partitions, future.result(10)["cleanup.policy"].value


def reasons(check: TopicCheck) -> list[tuple[str, str | None]]:
    return [(problem.reason, problem.topic) for problem in check.problems]


def test_a_fresh_app_gets_every_topic_it_owns(kafka_front: KafkaFront) -> None:
    app, app_id = make_app(kafka_front, {"in": 6})

    check = ensure(kafka_front, app)

    assert check.ok, check.problems
    assert check.partitions == 6
    owned = {
        f"{app_id}-store0-changelog": (6, "compact"),
        f"{app_id}-store1-changelog": (6, "compact"),
        f"{app_id}-assignments": (1, "compact"),
        f"{app_id}-dead-letters": (6, "delete"),
    }
    assert sorted(check.created) == sorted(owned)
    assert {topic: partitions_and_policy(kafka_front, topic) for topic in owned} == owned


def test_a_second_ensure_creates_nothing(kafka_front: KafkaFront) -> None:
    app, _ = make_app(kafka_front, {"in": 3})
    assert ensure(kafka_front, app).ok
    again = ensure(kafka_front, app)
    assert again.ok
    assert again.created == ()
    assert again.partitions == 3


def test_a_missing_input_topic_is_reported_and_no_changelog_is_guessed(
    kafka_front: KafkaFront,
) -> None:
    app, app_id = make_app(kafka_front, {"in": 4})
    app.spec.kafka.input_topics.append("never-created")
    check = ensure(kafka_front, app)
    assert reasons(check) == [("InputTopicMissing", "never-created")]
    assert "never-created" in check.problems[0].message
    assert check.partitions is None
    assert check.created == (f"{app_id}-assignments",)


def test_inputs_with_different_partition_counts_are_not_co_partitioned(
    kafka_front: KafkaFront,
) -> None:
    app, _ = make_app(kafka_front, {"left": 4, "right": 2})
    check = ensure(kafka_front, app)
    assert [reason for reason, _ in reasons(check)] == ["InputTopicsNotCoPartitioned"]
    assert all(topic in check.problems[0].message for topic in app.spec.kafka.input_topics)


def test_a_missing_output_topic_is_reported(kafka_front: KafkaFront) -> None:
    app, _ = make_app(kafka_front, {"in": 2}, output=None)
    check = ensure(kafka_front, app)
    assert reasons(check) == [("OutputTopicMissing", app.spec.kafka.output_topic)]


def test_a_changelog_with_more_partitions_than_the_input_is_a_problem_not_fixed(
    kafka_front: KafkaFront,
) -> None:
    app, app_id = make_app(kafka_front, {"in": 4}, stores=1)
    changelog = f"{app_id}-store0-changelog"
    kafka_front.kafka.create_topic(changelog, 6)
    check = ensure(kafka_front, app)
    assert ("ChangelogPartitionsMismatch", changelog) in reasons(check)
    assert partitions_and_policy(kafka_front, changelog)[0] == 6


def test_input_partitions_added_grow_the_changelogs_keeping_every_record(
    kafka_front: KafkaFront,
) -> None:
    app, app_id = make_app(kafka_front, {"in": 3}, stores=2)
    assert ensure(kafka_front, app).ok
    changelog = f"{app_id}-store0-changelog"
    producer = Producer({"bootstrap.servers": kafka_front.bootstrap_servers})
    for partition in range(3):
        producer.produce(
            changelog, key=b"k", value=f"state of task {partition}", partition=partition
        )
    producer.flush(10)
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    (grown,) = admin.create_partitions([NewPartitions(app.spec.kafka.input_topics[0], 5)]).values()
    grown.result(10)

    check = ensure(kafka_front, app)

    assert check.ok, check.problems
    assert check.partitions == 5
    assert sorted(check.grown) == [changelog, f"{app_id}-store1-changelog"]
    assert partitions_and_policy(kafka_front, changelog) == (5, "compact")
    records = read_committed(kafka_front.bootstrap_servers, changelog, 5)
    assert sorted((m.partition(), m.value()) for m in records) == [
        (0, b"state of task 0"),
        (1, b"state of task 1"),
        (2, b"state of task 2"),
    ]
    assert ensure(kafka_front, app).grown == ()


def test_an_existing_changelog_that_is_not_compacted_is_a_problem(
    kafka_front: KafkaFront,
) -> None:
    app, app_id = make_app(kafka_front, {"in": 4}, stores=1)
    changelog = f"{app_id}-store0-changelog"
    kafka_front.kafka.create_topic(changelog, 4)
    check = ensure(kafka_front, app)
    assert reasons(check) == [("ChangelogRetention", changelog)]
    assert "cleanup.policy=compact" in check.problems[0].message

    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    fix = ConfigResource(
        "topic",
        changelog,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    (future,) = admin.incremental_alter_configs([fix]).values()
    future.result(10)
    assert ensure(kafka_front, app).ok


def test_an_unreachable_cluster_is_reported_within_the_timeout(kafka_front: KafkaFront) -> None:
    app, _ = make_app(kafka_front, {"in": 1})
    manager = TopicManager({"bootstrap.servers": "127.0.0.1:1"}, timeout=2.0)
    started = time.monotonic()
    check = manager.ensure(app)
    manager.close()
    assert time.monotonic() - started < 5
    assert reasons(check) == [("KafkaUnavailable", None)]
    assert "127.0.0.1:1" in check.problems[0].message
