"""Partitions added to a topic through the Kafka front (CreatePartitions), as a real broker adds
them: every client the product uses sees one topic whose new partitions start empty at offset
0 and work like the old ones, with the old ones untouched."""

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from devstack.kafka.front import KafkaFront
from tests.runtime.kafka_helpers import read_committed


@pytest.fixture
def topic(kafka_front: KafkaFront) -> str:
    name = f"grown-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    admin.create_topics([NewTopic(name, 2)])[name].result(10)
    return name


def grow(front: KafkaFront, topic: str, count: int, validate_only: bool = False) -> None:
    admin = AdminClient({"bootstrap.servers": front.bootstrap_servers})
    futures = admin.create_partitions([NewPartitions(topic, count)], validate_only=validate_only)
    futures[topic].result(10)


def produce(front: KafkaFront, topic: str, records: dict[int, list[str]]) -> None:
    producer = Producer({"bootstrap.servers": front.bootstrap_servers})
    for partition, values in records.items():
        for value in values:
            producer.produce(topic, value=value, partition=partition)
    assert producer.flush(10) == 0


def by_partition(
    front: KafkaFront, topic: str, partitions: int
) -> dict[int, list[tuple[int, str]]]:
    found: dict[int, list[tuple[int, str]]] = {}
    for message in read_committed(front.bootstrap_servers, topic, partitions):
        value = message.value()
        assert value is not None
        found.setdefault(message.partition() or 0, []).append((message.offset(), value.decode()))
    return found


def partition_count(front: KafkaFront, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": front.bootstrap_servers})
    return len(admin.list_topics(timeout=10).topics[topic].partitions)


def test_a_grown_topic_keeps_its_records_and_its_new_partitions_start_at_zero(
    kafka_front: KafkaFront, topic: str
) -> None:
    produce(kafka_front, topic, {0: ["a0", "a1"], 1: ["b0"]})

    grow(kafka_front, topic, 5)
    produce(kafka_front, topic, {0: ["a2"], 2: ["c0", "c1"], 4: ["e0"]})

    assert partition_count(kafka_front, topic) == 5
    assert by_partition(kafka_front, topic, 5) == {
        0: [(0, "a0"), (1, "a1"), (2, "a2")],
        1: [(0, "b0")],
        2: [(0, "c0"), (1, "c1")],
        4: [(0, "e0")],
    }
    consumer = Consumer({"bootstrap.servers": kafka_front.bootstrap_servers, "group.id": "w"})
    try:
        marks = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(5)
        ]
    finally:
        consumer.close()
    assert marks == [(0, 3), (0, 1), (0, 2), (0, 0), (0, 1)]


def test_a_topic_grows_twice_and_no_extension_shows_as_a_topic(
    kafka_front: KafkaFront, topic: str
) -> None:
    grow(kafka_front, topic, 3)
    grow(kafka_front, topic, 6)
    produce(kafka_front, topic, {p: [f"v{p}"] for p in range(6)})

    assert by_partition(kafka_front, topic, 6) == {p: [(0, f"v{p}")] for p in range(6)}
    listed = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers}).list_topics(
        timeout=10
    )
    assert sorted(listed.topics[topic].partitions) == list(range(6))
    assert not [name for name in listed.topics if name.startswith(f"{topic}+")]


def test_committed_group_offsets_of_new_partitions_round_trip(
    kafka_front: KafkaFront, topic: str
) -> None:
    grow(kafka_front, topic, 4)
    group = f"group-{uuid.uuid4().hex[:8]}"
    config = {"bootstrap.servers": kafka_front.bootstrap_servers, "group.id": group}
    consumer = Consumer(config)
    try:
        offsets = [TopicPartition(topic, p, 10 + p, metadata=f"m{p}") for p in range(4)]
        consumer.commit(offsets=offsets, asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
    finally:
        consumer.close()
    assert [(c.partition, c.offset, c.metadata) for c in committed] == [
        (p, 10 + p, f"m{p}") for p in range(4)
    ]


def test_a_subscribed_group_consumer_gets_the_new_partitions(
    kafka_front: KafkaFront, topic: str
) -> None:
    grow(kafka_front, topic, 4)
    produce(kafka_front, topic, {p: [f"v{p}"] for p in range(4)})
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_front.bootstrap_servers,
            "group.id": f"group-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    seen: set[tuple[int, str]] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.add((message.partition() or 0, (message.value() or b"").decode()))
    finally:
        consumer.close()
    assert seen == {(p, f"v{p}") for p in range(4)}


def test_transactions_commit_and_abort_on_new_partitions(
    kafka_front: KafkaFront, topic: str
) -> None:
    grow(kafka_front, topic, 4)
    producer = Producer(
        {
            "bootstrap.servers": kafka_front.bootstrap_servers,
            "transactional.id": f"txn-{uuid.uuid4().hex[:8]}",
        }
    )
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"kept", partition=3)
    producer.produce(topic, value=b"kept", partition=0)
    producer.commit_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=3)
    producer.flush(10)  # the records reach the broker: the front must hide them
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"after", partition=3)
    producer.commit_transaction(10)

    found = by_partition(kafka_front, topic, 4)
    assert [value for _, value in found[3]] == ["kept", "after"]
    assert [value for _, value in found[0]] == ["kept"]


def test_compaction_and_deleted_records_apply_to_a_new_partition(
    kafka_front: KafkaFront, topic: str
) -> None:
    grow(kafka_front, topic, 3)
    producer = Producer({"bootstrap.servers": kafka_front.bootstrap_servers})
    for value in ("1", "2", "3"):
        producer.produce(topic, key=b"k", value=value, partition=2)
    producer.produce(topic, key=b"other", value=b"x", partition=2)
    assert producer.flush(10) == 0

    kafka_front.compact(topic, 2)

    assert by_partition(kafka_front, topic, 3)[2] == [(2, "3"), (3, "x")]
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    (deleted,) = admin.delete_records([TopicPartition(topic, 2, 3)]).values()
    assert deleted.result(10).low_watermark == 3
    consumer = Consumer({"bootstrap.servers": kafka_front.bootstrap_servers, "group.id": "w"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 2), timeout=10) == (3, 4)
    finally:
        consumer.close()


def test_deleting_a_grown_topic_deletes_its_extensions(kafka_front: KafkaFront, topic: str) -> None:
    grow(kafka_front, topic, 4)
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    admin.delete_topics([topic])[topic].result(10)

    admin.create_topics([NewTopic(topic, 1)])[topic].result(10)
    grow(kafka_front, topic, 2)  # the first growth of the new topic: its extension is free

    assert partition_count(kafka_front, topic) == 2


@pytest.mark.parametrize(
    ("count", "code"),
    [(2, KafkaError.INVALID_PARTITIONS), (1, KafkaError.INVALID_PARTITIONS)],
    ids=["same", "fewer"],
)
def test_a_growth_that_does_not_add_partitions_is_refused(
    kafka_front: KafkaFront, topic: str, count: int, code: int
) -> None:
    with pytest.raises(KafkaException) as refused:
        grow(kafka_front, topic, count)
    assert refused.value.args[0].code() == code
    assert partition_count(kafka_front, topic) == 2


def test_an_unknown_topic_is_refused_and_validate_only_grows_nothing(
    kafka_front: KafkaFront, topic: str
) -> None:
    with pytest.raises(KafkaException) as refused:
        grow(kafka_front, f"missing-{uuid.uuid4().hex[:8]}", 3)
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    grow(kafka_front, topic, 3, validate_only=True)

    assert partition_count(kafka_front, topic) == 2


def records_from(consumer: Consumer, count: int, timeout: float = 30) -> Iterator[str]:
    deadline = time.monotonic() + timeout
    found = 0
    while found < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            found += 1
            yield (message.value() or b"").decode()


def test_a_long_lived_consumer_reads_a_partition_added_after_it_started(
    kafka_front: KafkaFront, topic: str
) -> None:
    """A consumer that fetched the topic's metadata before the growth, then assign()s a new
    partition (as an instance does when it is given a new task)."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_front.bootstrap_servers,
            "group.id": f"group-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        consumer.poll(1)
        grow(kafka_front, topic, 3)
        produce(kafka_front, topic, {2: ["new"]})

        consumer.incremental_assign([TopicPartition(topic, 2, OFFSET_BEGINNING)])

        assert list(records_from(consumer, 1)) == ["new"]
    finally:
        consumer.close()
