"""Source, decode and a pipeline together in a real streaming query, as the instance runs them.

The driver side here is a minimal stand-in for the worker's foreachBatch: decode, dead letters,
aggregate, then apply per key with an in-memory state. It checks that the PySpark pieces fit.
"""

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from examples.pipelines import running_count, tumbling_window
from pyspark.sql import DataFrame, SparkSession

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime.decode import REASON_HEADER, decode, send_dead_letters
from smoothscale.runtime.pipeline import Pipeline
from smoothscale.runtime.source import write_plan

from .conftest import CollectingStream, produce, unique

pytestmark = pytest.mark.spark


class MiniDriver:
    """Applies each micro-batch to per-(partition, key) state the way the runtime does."""

    def __init__(self, pipeline: Pipeline, producer: Producer, dead_letter_topic: str) -> None:
        self.pipeline = pipeline
        self.producer = producer
        self.dead_letter_topic = dead_letter_topic
        self.state: dict[tuple[int, str], Any] = {}
        self.outputs: list[tuple[str, Any]] = []
        self.dead_letters = 0

    def on_batch(self, batch: DataFrame) -> None:
        batch.persist()
        try:
            good, bad = decode(batch, self.pipeline)
            self.dead_letters += send_dead_letters(
                bad.collect(), self.producer, self.dead_letter_topic
            )
            for update in self.pipeline.aggregate(good).collect():
                slot = (update["partition"], update["key"])
                new, outputs = self.pipeline.apply(
                    update["key"], self.state.get(slot), update["update"]
                )
                self.state[slot] = new
                self.outputs.extend(outputs)
        finally:
            batch.unpersist()
        assert self.producer.flush(10) == 0


@pytest.fixture
def dead_letter_topic(embedded_kafka: EmbeddedKafka) -> str:
    name = unique("dead-letters")
    embedded_kafka.create_topic(name, 1)
    return name


@pytest.fixture
def producer(embedded_kafka: EmbeddedKafka) -> Iterator[Producer]:
    client = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "log_level": 3})
    yield client
    client.close()


def run(
    spark: SparkSession,
    kafka: EmbeddedKafka,
    topic: str,
    partitions: int,
    driver: MiniDriver,
    tmp_path: Path,
) -> None:
    write_plan(tmp_path / "plan.json", {(topic, p): 0 for p in range(partitions)}, version=1)
    stream = CollectingStream(
        spark,
        kafka,
        [topic],
        tmp_path / "plan.json",
        tmp_path / "checkpoint",
        {"max.records.per.partition": "40"},
        on_batch=driver.on_batch,
    )
    try:
        stream.drain()
    finally:
        stream.stop()


def test_running_count_over_the_stream_counts_every_good_record_once_and_dead_letters_the_rest(
    spark: SparkSession,
    embedded_kafka: EmbeddedKafka,
    producer: Producer,
    dead_letter_topic: str,
    tmp_path: Path,
) -> None:
    topic = unique("clicks")
    embedded_kafka.create_topic(topic, 2)
    users = ["alice", "bob", "carol", "dave", "erin"]
    records = []
    for i in range(100):
        user = users[i % len(users) if i % 3 else 0]
        partition = users.index(user) % 2
        records.append((partition, user.encode(), json.dumps({"user": user}).encode()))
    records += [(0, b"alice", b"{oops"), (1, b"bob", b'{"name": "bob"}'), (1, b"bob", None)]
    produce(embedded_kafka, topic, records)
    expected = Counter(json.loads(value)["user"] for _, _, value in records[:100])
    driver = MiniDriver(running_count.pipeline(), producer, dead_letter_topic)

    run(spark, embedded_kafka, topic, 2, driver, tmp_path)

    assert {key: count for (_, key), count in driver.state.items()} == dict(expected)
    final_outputs = dict(driver.outputs)
    assert final_outputs == dict(expected), "the last output of each user is its total"
    assert driver.dead_letters == 3
    consumer = Consumer(
        {"bootstrap.servers": embedded_kafka.bootstrap_servers, "group.id": unique("reader")}
    )
    try:
        consumer.assign([TopicPartition(dead_letter_topic, 0, 0)])
        reasons = sorted(
            dict(message.headers() or [])[REASON_HEADER].decode()
            for message in consumer.consume(10, timeout=5)
            if message.error() is None
        )
    finally:
        consumer.close()
    assert reasons == ["malformed-json", "missing-field", "null-value"]


def test_tumbling_window_over_the_stream_sums_each_window(
    spark: SparkSession,
    embedded_kafka: EmbeddedKafka,
    producer: Producer,
    dead_letter_topic: str,
    tmp_path: Path,
) -> None:
    topic = unique("payments")
    embedded_kafka.create_topic(topic, 1)
    minute = 60_000
    events = [("alice", amount, 10 * minute + amount * 1000) for amount in range(1, 90)]
    events.append(("alice", 1000, 10 * minute + 5))  # late: after later windows, still counted
    produce(
        embedded_kafka,
        topic,
        [
            (0, user.encode(), json.dumps({"user": user, "amount": amount, "ts": ts}).encode())
            for user, amount, ts in events
        ],
    )
    expected: dict[str, dict[str, int]] = {}
    for user, amount, ts in events:
        window = expected.setdefault(
            tumbling_window.window_key(user, ts // minute * minute), {"sum": 0, "count": 0}
        )
        window["sum"] += amount
        window["count"] += 1
    driver = MiniDriver(tumbling_window.pipeline(), producer, dead_letter_topic)

    run(spark, embedded_kafka, topic, 1, driver, tmp_path)

    assert {key: state for (_, key), state in driver.state.items()} == expected
    assert len(expected) == 2
    assert driver.dead_letters == 0
