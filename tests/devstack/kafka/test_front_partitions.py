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
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

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


def consumer_in_a_new_group(front: KafkaFront, **settings: object) -> Consumer:
    """A consumer of `front` in a group of its own, with `settings` beside."""
    group = f"group-{uuid.uuid4().hex[:8]}"
    return Consumer({"bootstrap.servers": front.bootstrap_servers, "group.id": group, **settings})


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
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    ends = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(5)},
        isolation_level=IsolationLevel.READ_COMMITTED,
    )
    assert {tp.partition: end.result(10).offset for tp, end in ends.items()} == {
        0: 3,
        1: 1,
        2: 2,
        3: 0,
        4: 1,
    }


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
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    (described,) = admin.describe_configs([ConfigResource("topic", f"{topic}+1")]).values()
    with pytest.raises(KafkaException) as unknown:
        described.result(10)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_committed_group_offsets_of_new_partitions_round_trip(
    kafka_front: KafkaFront, topic: str
) -> None:
    grow(kafka_front, topic, 4)
    consumer = consumer_in_a_new_group(kafka_front)
    try:
        offsets = [TopicPartition(topic, p, 10 + p, metadata=f"m{p}") for p in range(4)]
        consumer.commit(offsets=offsets, asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
    finally:
        consumer.close()
    assert [(c.partition, c.offset, c.metadata) for c in committed] == [
        (p, 10 + p, f"m{p}") for p in range(4)
    ]


def test_a_subscribed_group_consumer_gets_the_partitions_added_while_it_runs(
    kafka_front: KafkaFront, topic: str
) -> None:
    produce(kafka_front, topic, {0: ["v0"], 1: ["v1"]})
    consumer = consumer_in_a_new_group(
        kafka_front,
        **{
            "auto.offset.reset": "earliest",
            # It sees the growth at its next metadata refresh (5 minutes by default) and rejoins
            # the group, which the mock completes session.timeout.ms - 1 s later (Kafka: once
            # every member rejoined).
            "topic.metadata.refresh.interval.ms": 1000,
            "session.timeout.ms": 6000,
        },
    )
    try:
        consumer.subscribe([topic])
        before = set(partitions_and_values(consumer, 2))

        grow(kafka_front, topic, 4)
        produce(kafka_front, topic, {p: [f"v{p}"] for p in range(2, 4)})

        after = set(partitions_and_values(consumer, 2))
        assignment = sorted(tp.partition for tp in consumer.assignment())
    finally:
        consumer.close()
    assert before == {(0, "v0"), (1, "v1")}
    assert after == {(2, "v2"), (3, "v3")}
    assert assignment == [0, 1, 2, 3]


def test_offsets_sent_to_a_transaction_for_new_partitions_commit_with_it(
    kafka_front: KafkaFront, topic: str
) -> None:
    """TxnOffsetCommit names the new partitions (the mock refuses a partition it does not have,
    so this fails unless the front maps them). The mock does not store such offsets (see
    ../shared/ENVIRONMENT.md), so only the commit is checked."""
    grow(kafka_front, topic, 4)
    group = f"group-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": kafka_front.bootstrap_servers, "group.id": group})
    producer = Producer(
        {
            "bootstrap.servers": kafka_front.bootstrap_servers,
            "transactional.id": f"txn-{uuid.uuid4().hex[:8]}",
        }
    )
    try:
        producer.init_transactions(10)
        producer.begin_transaction()
        producer.produce(topic, value=b"out", partition=3)
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 2, 7), TopicPartition(topic, 3, 9)],
            consumer.consumer_group_metadata(),
            10,
        )
        producer.commit_transaction(10)
    finally:
        consumer.close()

    assert [value for _, value in by_partition(kafka_front, topic, 4)[3]] == ["out"]


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
    ("count", "message"),
    [
        (2, "Topic already has 2 partition(s)."),
        (1, "The topic {topic} currently has 2 partition(s); 1 would not be an increase."),
    ],
    ids=["same", "fewer"],
)
def test_a_growth_that_does_not_add_partitions_is_refused(
    kafka_front: KafkaFront, topic: str, count: int, message: str
) -> None:
    with pytest.raises(KafkaException) as refused:
        grow(kafka_front, topic, count)
    assert refused.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    assert refused.value.args[0].str() == message.format(topic=topic)
    assert partition_count(kafka_front, topic) == 2


def test_an_unknown_topic_is_refused_and_validate_only_grows_nothing(
    kafka_front: KafkaFront, topic: str
) -> None:
    with pytest.raises(KafkaException) as refused:
        grow(kafka_front, f"missing-{uuid.uuid4().hex[:8]}", 3)
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    grow(kafka_front, topic, 3, validate_only=True)

    assert partition_count(kafka_front, topic) == 2


def records_from(consumer: Consumer, count: int, timeout: float = 30) -> Iterator[Message]:
    """The next `count` records `consumer` polls (fewer if `timeout` seconds pass first)."""
    deadline = time.monotonic() + timeout
    found = 0
    while found < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            found += 1
            yield message


def partitions_and_values(consumer: Consumer, count: int) -> Iterator[tuple[int, str]]:
    for message in records_from(consumer, count):
        yield message.partition() or 0, (message.value() or b"").decode()


def test_a_long_lived_consumer_reads_a_partition_added_after_it_started(
    kafka_front: KafkaFront, topic: str
) -> None:
    """A consumer that fetched the topic's metadata before the growth, then assign()s a new
    partition (as an instance does when it is given a new task)."""
    consumer = consumer_in_a_new_group(kafka_front, **{"enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        consumer.poll(1)
        grow(kafka_front, topic, 3)
        produce(kafka_front, topic, {2: ["new"]})

        consumer.incremental_assign([TopicPartition(topic, 2, OFFSET_BEGINNING)])

        assert list(partitions_and_values(consumer, 1)) == [(2, "new")]
    finally:
        consumer.close()


def test_a_seek_with_a_leader_epoch_on_a_new_partition_is_validated(
    kafka_front: KafkaFront, topic: str
) -> None:
    """A seek to a position that carries its leader epoch makes librdkafka validate it with
    OffsetForLeaderEpoch before it fetches again (the mock refuses a partition it does not have,
    so the consumer never reads again unless the front maps the request)."""
    grow(kafka_front, topic, 3)
    produce(kafka_front, topic, {2: [f"v{n}" for n in range(4)]})
    consumer = consumer_in_a_new_group(kafka_front, **{"enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 2, OFFSET_BEGINNING)])
        read = list(records_from(consumer, 4))
        epoch = read[1].leader_epoch()
        assert epoch is not None, "without an epoch librdkafka does not validate a seek"

        consumer.seek(TopicPartition(topic, 2, 1, leader_epoch=epoch))

        again = [(m.offset(), (m.value() or b"").decode()) for m in records_from(consumer, 3)]
    finally:
        consumer.close()
    assert again == [(1, "v1"), (2, "v2"), (3, "v3")]


def test_a_producer_writing_while_the_topic_grows_loses_nothing_and_reaches_the_new_partitions(
    kafka_front: KafkaFront, topic: str
) -> None:
    """One producer, keyless records spread over the partitions it knows: the old partitions
    keep every record in order, and after its next metadata refresh it writes to the new
    partitions too, from offset 0."""
    producer = Producer(
        {
            "bootstrap.servers": kafka_front.bootstrap_servers,
            "topic.metadata.refresh.interval.ms": 1000,
            "linger.ms": 5,
        }
    )
    delivered: dict[int, list[tuple[int, int]]] = {}

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        assert error is None, error
        sequence = int((message.value() or b"").decode())
        delivered.setdefault(message.partition() or 0, []).append((message.offset(), sequence))

    def write(count: int, start: int) -> None:
        for sequence in range(start, start + count):
            producer.produce(topic, value=str(sequence).encode(), on_delivery=on_delivery)
            producer.poll(0.002)

    write(200, 0)
    grow(kafka_front, topic, 4)
    sequence = 200
    deadline = time.monotonic() + 30
    while not {2, 3} <= set(delivered) and time.monotonic() < deadline:
        write(100, sequence)
        sequence += 100
    assert producer.flush(10) == 0

    stored = by_partition(kafka_front, topic, 4)
    assert sorted(stored) == [0, 1, 2, 3]
    for partition, records in stored.items():
        offsets = [offset for offset, _ in records]
        sequences = [int(value) for _, value in records]
        assert offsets == list(range(len(records))), f"partition {partition} has gaps"
        assert sequences == sorted(sequences), f"partition {partition} is out of order"
        assert records == [(o, str(s)) for o, s in sorted(delivered[partition])]
    assert sorted(int(value) for records in stored.values() for _, value in records) == list(
        range(sequence)
    )


def test_two_growths_at_once_apply_one_after_the_other(kafka_front: KafkaFront, topic: str) -> None:
    """As Kafka's controller: the second growth to the same count finds it reached already."""
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    first = admin.create_partitions([NewPartitions(topic, 4)])[topic]
    second = admin.create_partitions([NewPartitions(topic, 4)])[topic]

    outcomes = []
    for growth in (first, second):
        try:
            growth.result(10)
            outcomes.append("grown")
        except KafkaException as error:
            outcomes.append(error.args[0].str())

    assert sorted(outcomes) == ["Topic already has 4 partition(s).", "grown"]
    assert partition_count(kafka_front, topic) == 4
