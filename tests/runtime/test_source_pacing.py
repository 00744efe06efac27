"""The source paces micro-batches itself, except for a partition a task was just taken over on.

The worker's query polls the source often (a 0 s trigger, Spark's polling delay); the source
plans a batch with anything new at most once per `batch.interval.seconds`, so that the user's
trigger interval still sets the pace, but a partition new in the plan is planned at once.
"""

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime.source import KafkaStreamReader, SourceError, SourceOptions, write_plan
from tests.runtime.kafka_helpers import unique

INTERVAL = 5.0
"""Long enough that the calls meant to fall within it do, on a loaded machine."""


def produce(kafka: EmbeddedKafka, topic: str, partition: int, records: int) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    for i in range(records):
        producer.produce(topic, partition=partition, value=f"{i}".encode())
    assert producer.flush(10) == 0
    producer.close()


def reader(kafka: EmbeddedKafka, topic: str, plan: Path, **options: str) -> KafkaStreamReader:
    return KafkaStreamReader(
        SourceOptions.parse(
            {"bootstrap.servers": kafka.bootstrap_servers, "topics": topic, "plan.path": str(plan)}
            | options
        )
    )


def planned_topic(kafka: EmbeddedKafka, tmp_path: Path, partitions: int) -> tuple[str, Path]:
    """A new topic, and a plan file holding its partition 0 from offset 0."""
    topic = unique("paced")
    kafka.create_topic(topic, partitions)
    plan = tmp_path / "plan.json"
    write_plan(plan, {(topic, 0): 0}, version=1)
    return topic, plan


def nexts(offsets: dict[str, Any]) -> dict[str, int]:
    return {name: position["next"] for name, position in offsets.items()}


def test_new_input_waits_for_the_interval_but_a_partition_taken_over_is_planned_at_once(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    topic, plan = planned_topic(embedded_kafka, tmp_path, 2)
    produce(embedded_kafka, topic, 0, 5)
    produce(embedded_kafka, topic, 1, 3)
    source = reader(embedded_kafka, topic, plan, **{"batch.interval.seconds": str(INTERVAL)})

    first = source.latestOffset(source.initialOffset(), None)
    planned_at = time.monotonic()
    produce(embedded_kafka, topic, 0, 2)
    too_soon = source.latestOffset(first, None)
    write_plan(plan, {(topic, 0): 0, (topic, 1): 0}, version=2)
    taken_over = source.latestOffset(first, None)
    taken_over_in = time.monotonic() - planned_at
    produce(embedded_kafka, topic, 1, 1)
    paced_again = source.latestOffset(taken_over, None)
    time.sleep(INTERVAL)
    after_the_interval = source.latestOffset(taken_over, None)

    assert nexts(first) == {f"{topic}:0": 5}
    assert too_soon == first, "nothing new for Spark within the interval"
    assert taken_over_in < INTERVAL
    assert nexts(taken_over) == {f"{topic}:0": 7, f"{topic}:1": 3}
    assert paced_again == taken_over
    assert nexts(after_the_interval) == {f"{topic}:0": 7, f"{topic}:1": 4}


def test_without_an_interval_every_call_plans_what_is_new(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    topic, plan = planned_topic(embedded_kafka, tmp_path, 1)
    produce(embedded_kafka, topic, 0, 5)
    source = reader(embedded_kafka, topic, plan)

    first = source.latestOffset(source.initialOffset(), None)
    produce(embedded_kafka, topic, 0, 2)
    second = source.latestOffset(first, None)

    assert nexts(first) == {f"{topic}:0": 5}
    assert nexts(second) == {f"{topic}:0": 7}


def test_a_bad_interval_is_refused_with_the_option_named(tmp_path: Path) -> None:
    options = {"bootstrap.servers": "b:9092", "topics": "t", "plan.path": str(tmp_path)}

    with pytest.raises(SourceError, match=r"batch\.interval\.seconds must be a positive number"):
        SourceOptions.parse(options | {"batch.interval.seconds": "soon"})
