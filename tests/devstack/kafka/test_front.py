"""The Kafka front answers real Kafka clients like a cluster with topic administration,
auto.create.topics.enable=false and a log cleaner that runs when a test says so."""

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from devstack.kafka import front as front_module
from devstack.kafka.front import KafkaFront, KafkaFrontError
from devstack.kafka.protocol import frame


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def admin(front: KafkaFront) -> AdminClient:
    return AdminClient({"bootstrap.servers": front.bootstrap_servers})


def create(front: KafkaFront, *topics: NewTopic, validate_only: bool = False) -> dict[str, object]:
    """Each topic's creation result: None, or the KafkaError it failed with."""
    results: dict[str, object] = {}
    client = admin(front)  # the futures fail if their client is garbage-collected first
    futures = client.create_topics(list(topics), validate_only=validate_only)
    for name, future in futures.items():
        try:
            results[name] = future.result(10)
        except KafkaException as error:
            results[name] = error.args[0].code()
    return results


def topic_configs(front: KafkaFront, topic: str) -> dict[str, str]:
    client = admin(front)
    (future,) = client.describe_configs([ConfigResource("topic", topic)]).values()
    return {name: entry.value for name, entry in future.result(10).items()}


def partition_counts(front: KafkaFront) -> dict[str, int]:
    metadata = admin(front).list_topics(timeout=10)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def consume(
    front: KafkaFront,
    topic: str,
    partition: int,
    end_offset: int,
    start: int = 0,
    check_crcs: bool = False,
    isolation_level: str = "read_committed",
) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record a fresh reader sees in [start, end_offset): (offset, key, value).

    `check_crcs` only without transactions: the mock writes commit markers with CRC 0.
    `isolation_level` is librdkafka's default unless told.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": front.bootstrap_servers,
            "group.id": unique("reader"),
            "check.crcs": check_crcs,
            "isolation.level": isolation_level,
        }
    )
    consumer.assign([TopicPartition(topic, partition, start)])
    records = []
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            message: Message | None = consumer.poll(0.2)
            if message is not None and message.error() is None:
                records.append((message.offset(), message.key(), message.value()))
            (position,) = consumer.position([TopicPartition(topic, partition)])
            if position.offset >= end_offset:
                return records
        raise AssertionError(f"reader stuck at {records[-1:]} before offset {end_offset}")
    finally:
        consumer.close()


def produce(front: KafkaFront, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": front.bootstrap_servers, "linger.ms": 0})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
        producer.flush(10)


def test_clients_only_ever_see_the_fronts_addresses(kafka_front: KafkaFront) -> None:
    metadata = admin(kafka_front).list_topics(timeout=10)
    advertised = {f"{broker.host}:{broker.port}" for broker in metadata.brokers.values()}
    assert advertised == set(kafka_front.bootstrap_servers.split(","))
    assert metadata.controller_id in metadata.brokers


def test_create_topics_creates_with_partitions_and_remembers_configs(
    kafka_front: KafkaFront,
) -> None:
    compacted, plain = unique("compacted"), unique("plain")
    results = create(
        kafka_front,
        NewTopic(compacted, 3, -1, config={"cleanup.policy": "compact"}),
        NewTopic(plain, 2, 3),
    )
    assert results == {compacted: None, plain: None}
    counts = partition_counts(kafka_front)
    assert (counts[compacted], counts[plain]) == (3, 2)
    assert topic_configs(kafka_front, compacted)["cleanup.policy"] == "compact"
    defaults = topic_configs(kafka_front, plain)
    assert defaults["cleanup.policy"] == "delete"
    assert defaults["retention.ms"] == "604800000"


def test_create_topics_refuses_what_kafka_refuses(kafka_front: KafkaFront) -> None:
    existing = unique("existing")
    assert create(kafka_front, NewTopic(existing, 1, 1)) == {existing: None}
    results = create(
        kafka_front,
        NewTopic(existing, 1, 1),
        NewTopic("no spaces allowed", 1, 1),
        NewTopic(unique("too-replicated"), 1, 4),
        NewTopic(unique("bad-config"), 1, 1, config={"cleanup.policy": "shred"}),
    )
    assert sorted(results.values(), key=str) == sorted(
        [
            KafkaError.TOPIC_ALREADY_EXISTS,
            KafkaError.TOPIC_EXCEPTION,
            KafkaError.INVALID_REPLICATION_FACTOR,
            KafkaError.INVALID_CONFIG,
        ],
        key=str,
    )


def test_validate_only_creates_nothing(kafka_front: KafkaFront) -> None:
    name = unique("validated")
    assert create(kafka_front, NewTopic(name, 2, 1), validate_only=True) == {name: None}
    assert name not in partition_counts(kafka_front)


def test_delete_topics_deletes_a_topic_and_what_the_front_kept_about_it(
    kafka_front: KafkaFront,
) -> None:
    name = unique("doomed")
    create(kafka_front, NewTopic(name, 2, config={"cleanup.policy": "compact"}))
    produce(kafka_front, name, [(b"k", b"v")])
    client = admin(kafka_front)
    client.delete_topics([name], operation_timeout=10)[name].result(10)
    assert name not in client.list_topics(timeout=10).topics
    with pytest.raises(KafkaException) as missing:
        client.delete_topics([name], operation_timeout=10)[name].result(10)
    assert missing.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    create(kafka_front, NewTopic(name, 1))  # the same name again: a new, empty topic
    assert partition_counts(kafka_front)[name] == 1
    assert topic_configs(kafka_front, name).get("cleanup.policy") == "delete", "configs forgotten"


def test_topics_created_on_the_broker_describe_kafkas_defaults(kafka_front: KafkaFront) -> None:
    name = unique("direct")
    kafka_front.kafka.create_topic(name, 2)
    assert topic_configs(kafka_front, name)["cleanup.policy"] == "delete"


def test_incremental_alter_configs_changes_what_describe_configs_says(
    kafka_front: KafkaFront,
) -> None:
    name = unique("altered")
    kafka_front.kafka.create_topic(name, 1)
    client = admin(kafka_front)
    compact = ConfigResource(
        "topic",
        name,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    (future,) = client.incremental_alter_configs([compact]).values()
    future.result(10)
    assert topic_configs(kafka_front, name)["cleanup.policy"] == "compact"
    bad = ConfigResource(
        "topic",
        name,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    (refused,) = client.incremental_alter_configs([bad]).values()
    with pytest.raises(KafkaException, match=r"cleanup\.policy"):
        refused.result(10)
    assert topic_configs(kafka_front, name)["cleanup.policy"] == "compact"


def test_an_unknown_topic_is_not_auto_created(kafka_front: KafkaFront) -> None:
    name = unique("unknown")
    metadata = admin(kafka_front).list_topics(topic=name, timeout=10)
    assert metadata.topics[name].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    producer = Producer(
        {"bootstrap.servers": kafka_front.bootstrap_servers, "message.timeout.ms": 2000}
    )
    failures: list[KafkaError] = []
    producer.produce(name, b"x", on_delivery=lambda error, _message: failures.append(error))
    producer.flush(10)
    assert len(failures) == 1
    assert failures[0] is not None
    assert name not in partition_counts(kafka_front)


def test_a_transactional_producer_and_a_subscribed_group_work_through_the_front(
    kafka_front: KafkaFront,
) -> None:
    topic = unique("transactional")
    assert create(kafka_front, NewTopic(topic, 2, 1)) == {topic: None}
    producer = Producer(
        {"bootstrap.servers": kafka_front.bootstrap_servers, "transactional.id": unique("tx")}
    )
    producer.init_transactions(10)
    producer.begin_transaction()
    for index in range(10):
        producer.produce(topic, key=b"%d" % index, value=b"v")
    producer.commit_transaction(10)
    group = unique("group")
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_front.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    keys = set()
    deadline = time.monotonic() + 20
    while len(keys) < 10 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            keys.add(message.key())
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], 10)
    consumer.close()
    assert keys == {b"%d" % index for index in range(10)}
    assert all(partition.offset > 0 for partition in committed)
    client = admin(kafka_front)
    ends = client.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()}, request_timeout=10)
    (end,) = ends.values()
    # The group read to the end; its position may stop before the final commit marker.
    assert end.result(10).offset in {committed[0].offset, committed[0].offset + 1}


def transactional(front: KafkaFront, transactional_id: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": front.bootstrap_servers, "transactional.id": transactional_id}
    )
    producer.init_transactions(10)
    return producer


def fenced_error(action: Callable[[], object]) -> KafkaError | None:
    """The error `action` raised, None when it did not raise."""
    try:
        action()
    except KafkaException as error:
        found: KafkaError = error.args[0]
        return found
    return None


def test_a_newer_producer_of_a_transactional_id_fences_the_older_ones_produce(
    kafka_front: KafkaFront,
) -> None:
    topic, transactional_id = unique("fenced"), unique("tx")
    assert create(kafka_front, NewTopic(topic, 1, 1)) == {topic: None}
    zombie = transactional(kafka_front, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, key=b"zombie", value=b"before")
    zombie.flush(10)
    owner = transactional(kafka_front, transactional_id)
    other = transactional(kafka_front, unique("tx"))  # another id: not fenced
    zombie.produce(topic, key=b"zombie", value=b"after")

    error = fenced_error(lambda: (zombie.flush(10), zombie.commit_transaction(10)))
    assert error is not None
    assert error.fatal()
    assert error.code() == KafkaError._FENCED
    for producer, value in ((owner, b"owner"), (other, b"other")):
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=value)
        producer.commit_transaction(10)
    values = [value for _offset, _key, value in consume(kafka_front, topic, 0, 5)]
    # Nothing the zombie sent after the fence reached the broker (what it sent before is in its
    # aborted transaction: test_a_fenced_producers_open_transaction_is_aborted_...).
    assert b"after" not in values
    assert values[-2:] == [b"owner", b"other"]


def test_a_fenced_producers_commit_is_refused(kafka_front: KafkaFront) -> None:
    topic, transactional_id = unique("fenced"), unique("tx")
    assert create(kafka_front, NewTopic(topic, 1, 1)) == {topic: None}
    zombie = transactional(kafka_front, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, key=b"zombie", value=b"v")
    zombie.flush(10)
    transactional(kafka_front, transactional_id)

    error = fenced_error(lambda: zombie.commit_transaction(10))
    assert error is not None
    assert error.fatal()
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)


def end_offset(front: KafkaFront, topic: str) -> int:
    """The high watermark of partition 0 of `topic`."""
    consumer = Consumer({"bootstrap.servers": front.bootstrap_servers, "group.id": unique("w")})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high)
    finally:
        consumer.close()


def values_read(front: KafkaFront, topic: str, isolation_level: str) -> list[bytes | None]:
    """The values a fresh reader of `isolation_level` reads from partition 0, to its end."""
    records = consume(front, topic, 0, end_offset(front, topic), isolation_level=isolation_level)
    return [value for _offset, _key, value in records]


def test_a_transaction_its_producer_aborts_is_hidden_from_read_committed_readers_only(
    kafka_front: KafkaFront,
) -> None:
    topic = unique("aborted")
    assert create(kafka_front, NewTopic(topic, 1, 1)) == {topic: None}
    producer = transactional(kafka_front, unique("tx"))
    producer.begin_transaction()
    for value in (b"a0", b"a1", b"a2"):
        producer.produce(topic, key=b"k", value=value, partition=0)
        producer.flush(10)  # on the broker before the abort, else abort_transaction purges it
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"committed", partition=0)
    producer.commit_transaction(10)

    assert values_read(kafka_front, topic, "read_committed") == [b"committed"]
    assert values_read(kafka_front, topic, "read_uncommitted") == [
        b"a0",
        b"a1",
        b"a2",
        b"committed",
    ]


def test_a_fenced_producers_open_transaction_is_aborted_and_its_committed_ones_stay(
    kafka_front: KafkaFront,
) -> None:
    topic, transactional_id = unique("fenced"), unique("tx")
    assert create(kafka_front, NewTopic(topic, 1, 1)) == {topic: None}
    zombie = transactional(kafka_front, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, key=b"k", value=b"zombie-committed", partition=0)
    zombie.commit_transaction(10)
    zombie.begin_transaction()
    zombie.produce(topic, key=b"k", value=b"zombie-open", partition=0)
    zombie.flush(10)

    owner = transactional(kafka_front, transactional_id)
    assert values_read(kafka_front, topic, "read_committed") == [b"zombie-committed"]
    owner.begin_transaction()
    owner.produce(topic, key=b"k", value=b"owner", partition=0)
    owner.commit_transaction(10)

    assert values_read(kafka_front, topic, "read_committed") == [b"zombie-committed", b"owner"]
    assert values_read(kafka_front, topic, "read_uncommitted") == [
        b"zombie-committed",
        b"zombie-open",
        b"owner",
    ]


def test_read_committed_readers_get_every_committed_and_plain_record_and_reach_the_end(
    kafka_front: KafkaFront,
) -> None:
    """Aborted batches are dropped from the answers, yet a reader's position moves past them,
    also where nothing follows an aborted batch (a fenced producer's: no marker after it)."""
    topic, transactional_id = unique("mixed"), unique("tx")
    assert create(kafka_front, NewTopic(topic, 1, 1)) == {topic: None}
    produce(kafka_front, topic, [(b"k", b"plain")])
    producer = transactional(kafka_front, transactional_id)
    for values, commit in (([b"c0", b"c1"], True), ([b"x0"], False), ([b"c2"], True)):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, key=b"k", value=value, partition=0)
            producer.flush(10)
        if commit:
            producer.commit_transaction(10)
        else:
            producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"x1", partition=0)
    producer.flush(10)
    transactional(kafka_front, transactional_id)  # fences `producer`: the log ends with x1

    end = end_offset(kafka_front, topic)
    records = consume(kafka_front, topic, 0, end)
    assert [value for _offset, _key, value in records] == [b"plain", b"c0", b"c1", b"c2"]
    assert [offset for offset, _key, _value in records] == [0, 1, 2, 6]
    assert consume(kafka_front, topic, 0, end, start=7) == []


def test_the_abort_marker_that_ends_an_answer_carries_a_valid_crc32c(
    kafka_front: KafkaFront,
) -> None:
    topic, transactional_id = unique("marked"), unique("tx")
    kafka_front.kafka.create_topic(topic, 1)
    zombie = transactional(kafka_front, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, key=b"k", value=b"open", partition=0)
    zombie.flush(10)
    transactional(kafka_front, transactional_id)  # no marker of the mock's in the log
    assert consume(kafka_front, topic, 0, 1, check_crcs=True) == []


def test_compaction_leaves_the_newest_record_per_key_at_its_offset(
    kafka_front: KafkaFront,
) -> None:
    topic = unique("changelog")
    assert create(kafka_front, NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})) == {
        topic: None
    }
    produce(
        kafka_front,
        topic,
        [(b"a", b"a0"), (b"b", b"b1"), (b"a", b"a2"), (b"c", b"c3"), (b"b", None), (b"c", b"c5")],
    )
    transactional = Producer(
        {"bootstrap.servers": kafka_front.bootstrap_servers, "transactional.id": unique("tx")}
    )
    transactional.init_transactions(10)
    transactional.begin_transaction()
    transactional.produce(topic, key=b"a", value=b"a6", partition=0)
    transactional.commit_transaction(10)  # offset 6, its commit marker at offset 7
    produce(kafka_front, topic, [(b"d", b"d8")])

    kafka_front.compact(topic, through_offset=6)

    assert consume(kafka_front, topic, 0, 9) == [
        (2, b"a", b"a2"),
        (4, b"b", None),
        (5, b"c", b"c5"),
        (6, b"a", b"a6"),
        (8, b"d", b"d8"),
    ]
    assert consume(kafka_front, topic, 0, 9, start=1) == consume(kafka_front, topic, 0, 9)

    kafka_front.compact(topic, remove_tombstones=True)
    produce(kafka_front, topic, [(b"d", b"d9")])
    assert consume(kafka_front, topic, 0, 10) == [
        (5, b"c", b"c5"),
        (6, b"a", b"a6"),
        (8, b"d", b"d8"),
        (9, b"d", b"d9"),
    ]


def test_compaction_removes_aborted_records_which_supersede_nothing(
    kafka_front: KafkaFront,
) -> None:
    topic = unique("changelog")
    kafka_front.kafka.create_topic(topic, 1)
    producer = transactional(kafka_front, unique("tx"))
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"committed", partition=0)
    producer.commit_transaction(10)  # offset 0, its commit marker at 1
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"aborted", partition=0)
    producer.flush(10)
    producer.abort_transaction(10)  # offset 2, its abort marker at 3

    kafka_front.compact(topic)

    for isolation_level in ("read_committed", "read_uncommitted"):
        assert consume(kafka_front, topic, 0, 4, isolation_level=isolation_level) == [
            (0, b"k", b"committed")
        ]


def test_rewritten_batches_carry_a_valid_crc32c(kafka_front: KafkaFront) -> None:
    topic = unique("checked")
    kafka_front.kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka_front.bootstrap_servers, "linger.ms": 100})
    for index in range(8):
        producer.produce(topic, key=b"%d" % (index % 3), value=b"v%d" % index, partition=0)
    producer.flush(10)  # one batch of 8 records, rewritten to 3
    kafka_front.compact(topic)
    assert consume(kafka_front, topic, 0, 8, check_crcs=True) == [
        (5, b"2", b"v5"),
        (6, b"0", b"v6"),
        (7, b"1", b"v7"),
    ]


def test_a_group_resumes_from_its_committed_offset_on_a_compacted_partition(
    kafka_front: KafkaFront,
) -> None:
    topic = unique("resumed")
    kafka_front.kafka.create_topic(topic, 1)
    produce(kafka_front, topic, [(b"k", b"%d" % index) for index in range(6)])
    kafka_front.compact(topic)
    group = unique("group")
    settings = {"bootstrap.servers": kafka_front.bootstrap_servers, "group.id": group}
    consumer = Consumer(settings)
    consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    consumer.close()
    resumed = Consumer(settings)
    resumed.subscribe([topic])
    deadline = time.monotonic() + 20
    seen = []
    while not seen and time.monotonic() < deadline:
        message = resumed.poll(0.2)
        if message is not None and message.error() is None:
            seen.append((message.offset(), message.value()))
    resumed.close()
    assert seen == [(5, b"5")]


def test_compacting_an_unknown_topic_says_so(kafka_front: KafkaFront) -> None:
    with pytest.raises(KafkaFrontError, match="does not exist"):
        kafka_front.compact(unique("missing"))


def delete_records(front: KafkaFront, topic: str, offset: int) -> int | KafkaError:
    """DeleteRecords below `offset` of partition 0: the new log start, or the error."""
    client = admin(front)
    (future,) = client.delete_records([TopicPartition(topic, 0, offset)]).values()
    try:
        low_watermark: int = future.result(10).low_watermark
    except KafkaException as error:
        failure: KafkaError = error.args[0]
        return failure
    return low_watermark


def first_read(front: KafkaFront, topic: str, start: int, reset: str) -> int | KafkaError:
    """Where a reader assigned at `start` gets its first record, or the error it gets."""
    settings = {"group.id": unique("reader"), "auto.offset.reset": reset}
    consumer = Consumer({"bootstrap.servers": front.bootstrap_servers, **settings})
    consumer.assign([TopicPartition(topic, 0, start)])
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error: KafkaError | None = message.error()
            if error is not None:
                return error
            offset: int = message.offset()
            return offset
        raise AssertionError(f"no record and no error from offset {start}")
    finally:
        consumer.close()


def test_deleted_records_move_the_log_start_like_retention(kafka_front: KafkaFront) -> None:
    topic = unique("retained")
    kafka_front.kafka.create_topic(topic, 1)
    produce(kafka_front, topic, [(b"k", b"%d" % index) for index in range(10)])

    assert delete_records(kafka_front, topic, 4) == 4
    assert delete_records(kafka_front, topic, 2) == 4, "the log start never moves back"
    consumer = Consumer({"bootstrap.servers": kafka_front.bootstrap_servers, "group.id": "w"})
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (4, 10)
    client = admin(kafka_front)
    (earliest,) = client.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()}).values()
    assert earliest.result(10).offset == 4
    consumer.close()

    out_of_range = first_read(kafka_front, topic, 1, reset="error")
    assert isinstance(out_of_range, KafkaError)
    assert out_of_range.code() == KafkaError._AUTO_OFFSET_RESET
    assert first_read(kafka_front, topic, 1, reset="earliest") == 4
    assert first_read(kafka_front, topic, 6, reset="error") == 6

    assert delete_records(kafka_front, topic, -1) == 10
    beyond = delete_records(kafka_front, topic, 11)
    assert isinstance(beyond, KafkaError)
    assert beyond.code() == KafkaError.OFFSET_OUT_OF_RANGE


def test_the_front_asks_a_broker_again_when_it_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request the front makes of its own (Metadata, ListOffsets, Fetch) that a broker never
    answers is asked again on a new connection, instead of holding back every later response
    to the client waiting for it (seen in CI: a DescribeConfigs unanswered for 60 s)."""
    monkeypatch.setattr(front_module, "_CALL_SECONDS", 0.2)
    connections: list[asyncio.StreamWriter] = []

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        size = int.from_bytes(await reader.readexactly(4), "big")
        request = await reader.readexactly(size)
        if len(connections) == 1:
            await asyncio.sleep(10)  # the first request is never answered
        writer.write(frame(request[4:8] + b"answer"))  # correlation id, body
        await writer.drain()

    async def scenario() -> bytes:
        server = await asyncio.start_server(broker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await front_module._call(front_module._Address("127.0.0.1", port), 3, 4, b"")

    assert asyncio.run(scenario()) == b"answer"
    assert len(connections) == 2
