"""The embedded Kafka (librdkafka's mock cluster) behaves as the rest of the suite relies on."""

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from devstack.kafka.embedded import EmbeddedKafka, EmbeddedKafkaError

PRODUCE_API = 0
FAST_RECONNECT = {"reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 100}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def consumer(kafka: EmbeddedKafka, **config: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": unique("group"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **config,
        }
    )


def consume_values(
    kafka: EmbeddedKafka, topic: str, partitions: int, **config: object
) -> list[bytes]:
    """Every value currently readable in `topic` (reads until an end-of-partition on all)."""
    reader = consumer(kafka, **{"enable.partition.eof": True, **config})
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 10
        while len(at_end) < partitions and time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            elif error is None:
                value = message.value()
                assert value is not None
                values.append(value)
                at_end.discard(message.partition())
        return values
    finally:
        reader.close()


@pytest.fixture
def producer(embedded_kafka: EmbeddedKafka) -> Producer:
    return Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})


def test_bootstrap_servers_are_loopback_tcp_one_per_broker() -> None:
    with EmbeddedKafka(brokers=2) as kafka:
        hosts = kafka.bootstrap_servers.split(",")
        assert len(hosts) == 2
        assert all(host.startswith("127.0.0.1:") for host in hosts)


def test_topic_has_the_partition_count_it_was_created_with(
    embedded_kafka: EmbeddedKafka, producer: Producer
) -> None:
    topic = unique("input")
    embedded_kafka.create_topic(topic, partitions=5)
    for partition in range(5):
        for _ in range(partition + 1):
            producer.produce(topic, b"x", partition=partition)
    assert producer.flush(10) == 0

    reader = consumer(embedded_kafka)
    try:
        metadata = reader.list_topics(topic, timeout=5)
        assert len(metadata.topics[topic].partitions) == 5
        watermarks = [
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=5) for p in range(5)
        ]
    finally:
        reader.close()
    assert watermarks == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]


def test_creating_an_existing_topic_is_refused(embedded_kafka: EmbeddedKafka) -> None:
    topic = unique("twice")
    embedded_kafka.create_topic(topic, partitions=2)
    with pytest.raises(EmbeddedKafkaError, match="already exists"):
        embedded_kafka.create_topic(topic, partitions=2)


def test_produced_records_are_consumed_in_order_per_partition(
    embedded_kafka: EmbeddedKafka, producer: Producer
) -> None:
    topic = unique("ordered")
    embedded_kafka.create_topic(topic, partitions=1)
    for i in range(100):
        producer.produce(topic, str(i).encode(), partition=0)
    assert producer.flush(10) == 0
    assert consume_values(embedded_kafka, topic, 1) == [str(i).encode() for i in range(100)]


def transactional_producer(kafka: EmbeddedKafka) -> Producer:
    writer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": unique("tx")}
    )
    writer.init_transactions(10)
    return writer


def test_committed_transactions_reach_read_committed_readers(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic = unique("transactional")
    embedded_kafka.create_topic(topic, partitions=2)
    writer = transactional_producer(embedded_kafka)
    for value, partition in ((b"first", 0), (b"second", 1)):
        writer.begin_transaction()
        writer.produce(topic, value, partition=partition)
        writer.commit_transaction(10)

    values = consume_values(embedded_kafka, topic, 2, **{"isolation.level": "read_committed"})
    assert sorted(values) == [b"first", b"second"]


def test_mock_limit_aborted_records_that_reached_the_broker_stay_visible(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """A limit of librdkafka's mock (documented in docs/local-control-plane.md): real Kafka hides
    these from read_committed readers. Only records the producer still held are dropped, because
    abort_transaction purges its queue. If this test fails, the mock got better: update the docs."""
    topic = unique("aborted")
    embedded_kafka.create_topic(topic, partitions=1)
    writer = transactional_producer(embedded_kafka)
    writer.begin_transaction()
    writer.produce(topic, b"sent-then-aborted", partition=0)
    assert writer.flush(10) == 0
    writer.abort_transaction(10)
    writer.begin_transaction()
    writer.produce(topic, b"queued-then-aborted", partition=0)
    writer.abort_transaction(10)
    writer.begin_transaction()
    writer.produce(topic, b"committed", partition=0)
    writer.commit_transaction(10)

    values = consume_values(embedded_kafka, topic, 1, **{"isolation.level": "read_committed"})
    assert values == [b"sent-then-aborted", b"committed"]


def test_committed_offsets_keep_their_metadata(embedded_kafka: EmbeddedKafka) -> None:
    topic = unique("reports")
    embedded_kafka.create_topic(topic, partitions=3)
    group = unique("instance")
    metadata = '{"role": "warmup", "epoch": 3, "generation": 7}'
    writer = consumer(embedded_kafka, **{"group.id": group})
    try:
        writer.commit(
            offsets=[TopicPartition(topic, 2, 1234, metadata=metadata)], asynchronous=False
        )
    finally:
        writer.close()

    reader = consumer(embedded_kafka, **{"group.id": group})
    try:
        committed = reader.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    finally:
        reader.close()
    by_partition = {tp.partition: tp for tp in committed}
    assert by_partition[2].offset == 1234
    assert by_partition[2].metadata == metadata
    assert by_partition[0].offset < 0  # never committed


def test_injected_request_errors_fail_exactly_the_next_requests(
    kafka_cluster: EmbeddedKafka,
) -> None:
    topic = unique("faulty")
    kafka_cluster.create_topic(topic, partitions=1)
    writer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "retries": 0})
    # Connect first, so the pushed error meets a Produce request and not a retry of metadata.
    writer.list_topics(topic, timeout=5)
    kafka_cluster.push_request_errors(PRODUCE_API, [KafkaError.NOT_ENOUGH_REPLICAS])

    outcomes: list[int | None] = []

    def record(error: KafkaError | None, message: object) -> None:
        outcomes.append(None if error is None else error.code())

    writer.produce(topic, b"first", partition=0, on_delivery=record)
    assert writer.flush(10) == 0
    writer.produce(topic, b"second", partition=0, on_delivery=record)
    assert writer.flush(10) == 0
    assert outcomes == [KafkaError.NOT_ENOUGH_REPLICAS, None]


def test_a_broker_that_is_down_refuses_clients_until_it_is_up_again() -> None:
    with EmbeddedKafka(brokers=1) as kafka:
        topic = unique("outage")
        kafka.create_topic(topic, partitions=1)
        writer = Producer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "message.timeout.ms": 3000,
                **FAST_RECONNECT,
            }
        )
        writer.list_topics(topic, timeout=5)
        outcomes: list[int | None] = []

        def record(error: KafkaError | None, message: object) -> None:
            outcomes.append(None if error is None else error.code())

        kafka.set_broker_down(1)
        writer.produce(topic, b"lost", partition=0, on_delivery=record)
        writer.flush(10)
        kafka.set_broker_up(1)
        writer.produce(topic, b"delivered", partition=0, on_delivery=record)
        assert writer.flush(10) == 0
        assert outcomes == [KafkaError._MSG_TIMED_OUT, None]


def test_the_cluster_serves_requests_while_its_brokers_are_down() -> None:
    """A request to the mock's thread wakes it through a broker's listener; with every broker
    down none accepts, and the request is still served (on the mock's own timeout)."""
    with EmbeddedKafka(brokers=1) as kafka:
        kafka.set_broker_down(1)
        topic = unique("created-while-down")
        kafka.create_topic(topic, partitions=3)
        with pytest.raises(EmbeddedKafkaError, match="already exists"):
            kafka.create_topic(topic, partitions=3)
        kafka.set_broker_up(1)
        reader = consumer(kafka)
        try:
            metadata = reader.list_topics(topic, timeout=5)
        finally:
            reader.close()
        assert len(metadata.topics[topic].partitions) == 3


def test_round_trip_time_delays_every_response() -> None:
    with EmbeddedKafka(brokers=1) as kafka:
        reader = consumer(kafka)
        try:
            reader.list_topics(timeout=5)
            kafka.set_rtt(1, 600)
            started = time.monotonic()
            reader.list_topics(timeout=5)
            slow = time.monotonic() - started
            kafka.set_rtt(1, 0)
            started = time.monotonic()
            reader.list_topics(timeout=5)
            fast = time.monotonic() - started
        finally:
            reader.close()
    assert slow >= 0.55
    assert fast < 0.4


def test_unknown_broker_is_refused_with_the_valid_range(kafka_cluster: EmbeddedKafka) -> None:
    with pytest.raises(EmbeddedKafkaError, match=r"1\.\.3"):
        kafka_cluster.set_broker_down(4)


def test_close_is_idempotent_and_a_closed_cluster_says_so() -> None:
    kafka = EmbeddedKafka(brokers=1)
    kafka.close()
    kafka.close()
    with pytest.raises(EmbeddedKafkaError, match="closed"):
        kafka.create_topic("late", partitions=1)


def test_a_closed_cluster_no_longer_accepts_connections() -> None:
    kafka = EmbeddedKafka(brokers=1)
    bootstrap = kafka.bootstrap_servers
    kafka.close()
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "gone",
            "socket.connection.setup.timeout.ms": 1000,
        }
    )
    try:
        with pytest.raises(KafkaException):
            reader.list_topics(timeout=1)
    finally:
        reader.close()


def test_mock_limit_a_partition_keeps_only_its_last_megabytes(kafka_cluster: EmbeddedKafka) -> None:
    """The mock drops a partition's oldest records beyond about 5 MB, like retention: local
    runs must keep changelog partitions under it (docs/local-control-plane.md)."""
    kafka_cluster.create_topic("big", 1)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for i in range(60_000):
        producer.produce("big", key=b"k%d" % i, value=b"v" * 100, partition=0)
        if i % 5_000 == 0:
            producer.poll(0)
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": "g"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition("big", 0), timeout=10)
    finally:
        consumer.close()
    assert high == 60_000
    assert 0 < high - low < 60_000, "the oldest records are gone"
