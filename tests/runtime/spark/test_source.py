"""The smoothscale Kafka source in real streaming queries against the embedded Kafka."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from pyspark.sql import DataFrame, Row, SparkSession

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from smoothscale.runtime.source import RangeRead, batch_reads, write_plan

from .conftest import CollectingStream, offsets, positions, produce, unique

pytestmark = pytest.mark.spark


@pytest.fixture
def topic(embedded_kafka: EmbeddedKafka) -> str:
    """A 3-partition topic holding 10 records per partition (offsets 0..9)."""
    name = unique("input")
    embedded_kafka.create_topic(name, 3)
    produce(
        embedded_kafka,
        name,
        [(p, f"k{i}".encode(), f"p{p}-{i}".encode()) for p in range(3) for i in range(10)],
    )
    return name


@pytest.fixture
def stream_factory(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> Iterator[object]:
    streams: list[CollectingStream] = []

    def start(topic: str, plan: dict[tuple[str, int], int], **options: str) -> CollectingStream:
        write_plan(tmp_path / "plan.json", plan, version=1)
        stream = CollectingStream(
            spark,
            embedded_kafka,
            [topic],
            tmp_path / "plan.json",
            tmp_path / unique("checkpoint"),
            options,
        )
        streams.append(stream)
        return stream

    yield start
    for stream in streams:
        stream.stop()


def test_reads_exactly_the_planned_partitions_from_their_start_offsets(
    topic: str, stream_factory
) -> None:
    stream = stream_factory(topic, {(topic, 0): 3, (topic, 2): 0})

    rows = stream.drain_rows()

    assert positions(rows) == offsets(0, 3, 10) | offsets(2, 0, 10)
    assert len(rows) == 17, "no record is read twice"
    first = min(rows, key=lambda row: (row["partition"], row["offset"]))
    assert (first["topic"], first["key"], first["value"]) == (topic, b"k3", b"p0-3")


def test_plan_changes_between_batches_without_restarting_the_query(
    topic: str, stream_factory, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    stream = stream_factory(topic, {(topic, 0): 0, (topic, 2): 0})
    stream.drain_rows()
    query_run = stream.query.runId

    write_plan(tmp_path / "plan.json", {(topic, 0): 0, (topic, 1): 5, (topic, 2): 0}, version=2)
    added = stream.drain_rows()

    assert positions(added) == offsets(1, 5, 10), "the added partition starts at its plan offset"

    produce(embedded_kafka, topic, [(p, None, b"more") for p in range(3)])
    write_plan(tmp_path / "plan.json", {(topic, 1): 5, (topic, 2): 0}, version=3)
    after_drop = stream.drain_rows()

    assert positions(after_drop) == {(1, 10), (2, 10)}, "the dropped partition is not read"
    assert stream.query.isActive
    assert stream.query.runId == query_run


def test_partition_whose_plan_start_changed_is_read_again_from_the_new_start(
    topic: str, stream_factory, tmp_path: Path
) -> None:
    stream = stream_factory(topic, {(topic, 0): 0, (topic, 1): 0})
    stream.drain_rows()

    write_plan(tmp_path / "plan.json", {(topic, 0): 0, (topic, 1): 6}, version=2)
    rows = stream.drain_rows()

    assert positions(rows) == offsets(1, 6, 10)


def test_a_dropped_partition_taken_again_starts_from_its_new_plan_offset(
    topic: str, stream_factory, tmp_path: Path
) -> None:
    stream = stream_factory(topic, {(topic, 0): 0})
    stream.drain_rows()
    write_plan(tmp_path / "plan.json", {}, version=2)
    assert stream.drain_rows() == []

    write_plan(tmp_path / "plan.json", {(topic, 0): 7}, version=3)

    assert positions(stream.drain_rows()) == offsets(0, 7, 10)


def test_a_partition_taken_again_at_the_same_start_offset_restarts_when_its_activation_changed(
    topic: str, stream_factory, tmp_path: Path
) -> None:
    # The driver released partition 0 and took it again at the same start offset before the
    # reader saw a plan without it: only the bumped activation number tells the reader.
    stream = stream_factory(topic, {(topic, 0): 2})
    assert positions(stream.drain_rows()) == offsets(0, 2, 10)

    write_plan(tmp_path / "plan.json", {(topic, 0): 2}, version=2, activations={(topic, 0): 1})

    assert positions(stream.drain_rows()) == offsets(0, 2, 10)


def test_batches_hold_at_most_max_records_per_partition(topic: str, stream_factory) -> None:
    stream = stream_factory(
        topic, {(topic, 0): 0, (topic, 1): 0}, **{"max.records.per.partition": "4"}
    )

    batches = stream.drain()

    per_batch = [
        sorted((p, sum(1 for row in batch if row["partition"] == p)) for p in (0, 1))
        for batch in batches
    ]
    assert per_batch == [[(0, 4), (1, 4)], [(0, 4), (1, 4)], [(0, 2), (1, 2)]]


def test_a_range_ending_in_transaction_markers_is_read_without_waiting(
    embedded_kafka: EmbeddedKafka, stream_factory
) -> None:
    topic = unique("transactional")
    embedded_kafka.create_topic(topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": embedded_kafka.bootstrap_servers,
            "transactional.id": unique("writer"),
            "log_level": 3,
        }
    )
    producer.init_transactions(10)
    for transaction in range(3):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, partition=0, value=f"t{transaction}-{i}".encode())
        producer.commit_transaction(10)
    producer.close()
    # 15 records and 3 commit markers: the partition ends on a marker, at offset 18.
    stream = stream_factory(topic, {(topic, 0): 0}, **{"read.timeout.seconds": "30"})

    began = time.monotonic()
    rows = stream.drain_rows()
    elapsed = time.monotonic() - began

    assert [row["value"] for row in rows] == [
        f"t{t}-{i}".encode() for t in range(3) for i in range(5)
    ]
    assert max(row["offset"] for row in rows) == 16
    assert stream.query.lastProgress["sources"][0]["endOffset"] == (
        f'{{"{topic}:0": {{"next": 18, "start": 0, "activation": 0}}}}'
    )
    assert elapsed < 25, f"the batch waited {elapsed:.1f} s for a marker that is never delivered"


def test_each_batch_notes_its_ranges_and_what_it_read_in_them(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """The driver learns each partition's range of the batch, the records in it and the newest
    one's time from the source's notes (source.batch_reads), without a Spark job of its own:
    here a capped partition, one whose range ends in transaction markers, and one not read."""
    plain, transactional = unique("plain"), unique("transactional")
    embedded_kafka.create_topic(plain, 2)
    embedded_kafka.create_topic(transactional, 1)
    produce(embedded_kafka, plain, [(0, None, f"{i}".encode()) for i in range(6)])
    producer = Producer(
        {"bootstrap.servers": embedded_kafka.bootstrap_servers, "transactional.id": unique("w")}
    )
    producer.init_transactions(10)
    for _transaction in range(2):
        producer.begin_transaction()
        for _ in range(2):
            producer.produce(transactional, partition=0, value=b"t")
        producer.commit_transaction(10)
    # 4 records and 2 commit markers: offsets 0..5.
    plan = tmp_path / "plan.json"
    write_plan(plan, {(plain, 0): 1, (plain, 1): 0, (transactional, 0): 0}, version=1)

    def read_and_note(batch: DataFrame) -> tuple[list[Row], object]:
        return batch.collect(), batch_reads(plan)

    stream = CollectingStream(
        spark,
        embedded_kafka,
        [plain, transactional],
        plan,
        tmp_path / "checkpoint",
        {"max.records.per.partition": "3"},
        on_batch=read_and_note,
    )
    try:
        batches = stream.drain()
    finally:
        stream.stop()

    def newest_ms(rows: list[Row], topic: str) -> int:
        return max(round(r["timestamp"].timestamp() * 1000) for r in rows if r["topic"] == topic)

    (first_rows, first), (second_rows, second) = batches
    assert first == {
        (plain, 0): RangeRead(plain, 0, 1, 4, 3, newest_ms(first_rows, plain)),
        (transactional, 0): RangeRead(
            transactional, 0, 0, 3, 2, newest_ms(first_rows, transactional)
        ),
    }, "partition 1 of the plain topic has no records: no range"
    assert second == {
        (plain, 0): RangeRead(plain, 0, 4, 6, 2, newest_ms(second_rows, plain)),
        (transactional, 0): RangeRead(
            transactional, 0, 3, 6, 2, newest_ms(second_rows, transactional)
        ),
    }


def test_a_partition_added_to_the_topic_while_the_query_runs_is_read_once_planned(
    spark: SparkSession, kafka_front: KafkaFront, tmp_path: Path
) -> None:
    """Input partitions added while the app runs (a new task): the query's long-lived clients
    knew fewer partitions, and read the new one from its first record once it is planned."""
    name = unique("input")
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    admin.create_topics([NewTopic(name, 2)])[name].result(10)
    produce(kafka_front, name, [(p, b"k", f"p{p}".encode()) for p in range(2)])
    write_plan(tmp_path / "plan.json", {(name, 0): 0, (name, 1): 0}, version=1)
    stream = CollectingStream(
        spark, kafka_front, [name], tmp_path / "plan.json", tmp_path / "checkpoint"
    )
    try:
        assert positions(stream.drain_rows()) == {(0, 0), (1, 0)}
        query_run = stream.query.runId
        admin.create_partitions([NewPartitions(name, 3)])[name].result(10)
        produce(kafka_front, name, [(2, b"k", f"new-{i}".encode()) for i in range(3)])

        write_plan(tmp_path / "plan.json", {(name, p): 0 for p in range(3)}, version=2)
        rows = stream.drain_rows()
    finally:
        stream.stop()
    assert positions(rows) == offsets(2, 0, 3)
    assert [row["value"] for row in sorted(rows, key=lambda row: row["offset"])] == [
        b"new-0",
        b"new-1",
        b"new-2",
    ]
    assert stream.query.runId == query_run


def test_a_planned_partition_that_does_not_exist_fails_the_query_with_a_clear_error(
    topic: str, stream_factory
) -> None:
    stream = stream_factory(topic, {(topic, 0): 0, (topic, 7): 0})

    with pytest.raises(Exception, match=f"cannot find the end offset of {topic}:7"):
        stream.drain()


def test_a_plan_outside_the_source_topics_fails_the_query_with_a_clear_error(
    topic: str, stream_factory
) -> None:
    stream = stream_factory(topic, {("elsewhere", 0): 0})

    with pytest.raises(Exception, match="outside the source's topics"):
        stream.drain()


def test_a_kafka_outage_pauses_the_query_and_it_reads_on_once_the_brokers_are_back(
    spark: SparkSession, kafka_cluster: EmbeddedKafka, tmp_path: Path
) -> None:
    """Brokers down for longer than a metadata request may take: the micro-batches read
    nothing new meanwhile, the query stays up (no instance restart), and once the brokers are
    back it reads every record exactly once."""
    name = unique("input")
    kafka_cluster.create_topic(name, 3)
    produce(kafka_cluster, name, [(p, b"k", f"before-{p}".encode()) for p in range(3)])
    write_plan(tmp_path / "plan.json", {(name, p): 0 for p in range(3)}, version=1)
    stream = CollectingStream(
        spark, kafka_cluster, [name], tmp_path / "plan.json", tmp_path / "checkpoint"
    )
    try:
        assert len(stream.drain_rows()) == 3
        brokers = range(1, kafka_cluster.brokers + 1)
        for broker in brokers:
            kafka_cluster.set_broker_down(broker)
        time.sleep(25)  # more than the source's 10 s metadata timeout, twice
        assert stream.query.isActive, f"the query failed: {stream.query.exception()}"
        for broker in brokers:
            kafka_cluster.set_broker_up(broker)
        produce(kafka_cluster, name, [(p, b"k", f"after-{p}".encode()) for p in range(3)])
        rows = stream.drain_rows()
        assert sorted(row["value"] for row in rows) == [b"after-0", b"after-1", b"after-2"]
    finally:
        stream.stop()
