"""The restore's C reader (`_changelog.read`) reads every record as `parse_record` does.

parse_record defines the format; read() consumes the same records faster, in runs, and leaves
anything it does not read the same way to parse_record. These tests produce messages to a
broker (the records smoothscale writes, and ones no writer should: foreign keys, odd headers)
and compare what read() makes of them with what parse_record makes of the same messages
consumed by confluent-kafka's own consume().
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from hypothesis import example, given, settings
from hypothesis import strategies as st

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime._changelog import read
from smoothscale.runtime.changelog import (
    ERROR,
    KIND_CODES,
    SLOW,
    ChangelogRecord,
    changes,
    closer,
    marker,
    parse_record,
    run_of,
    runs_of,
    state_key_of,
    tombstone,
)
from smoothscale.runtime.restore import RestoreConsumer
from smoothscale.runtime.writer import Writer
from tests.runtime.kafka_helpers import unique

# B's nonce is as long as any: 63 random bits (Writer.next_after), 19 digits.
A, B = Writer(1, 0, 7), Writer(2, 1, 2**63 - 1)

Headers = list[tuple[str, bytes | None]] | None


@dataclass
class Sent:
    key: bytes | None
    value: bytes | None
    headers: Headers
    partition: int = 0


def sent(record: ChangelogRecord, partition: int = 0) -> Sent:
    headers = record.headers()
    assert headers is None or all(isinstance(value, bytes | None) for _name, value in headers)
    return Sent(record.key, record.value, cast(Headers, headers), partition)


class Log:
    """A topic of two partitions on the test bed's broker that messages are appended to, and
    consumers of what was appended last."""

    def __init__(self, kafka: EmbeddedKafka) -> None:
        self.topic = unique("changelog")
        kafka.create_topic(self.topic, 2)
        self.servers = kafka.bootstrap_servers
        self.producer = Producer({"bootstrap.servers": self.servers, "linger.ms": 0})
        self.ends = [0, 0]

    def settings(self, **more: str) -> dict[str, str]:
        return {"bootstrap.servers": self.servers, "group.id": "runs", "log_level": "3", **more}

    def consumer(self) -> Consumer:
        return Consumer(self.settings())

    def reader(self, **more: str) -> RestoreConsumer:
        return RestoreConsumer(self.settings(**more))

    def append(self, messages: list[Sent]) -> dict[int, tuple[int, int]]:
        """Per partition, the offsets [start, end) the messages took."""
        for message in messages:
            self.producer.produce(
                self.topic, message.value, message.key, message.partition, headers=message.headers
            )
        assert self.producer.flush(10) == 0
        ranges = {}
        for partition in (0, 1):
            count = sum(1 for message in messages if message.partition == partition)
            ranges[partition] = (self.ends[partition], self.ends[partition] + count)
            self.ends[partition] += count
        return ranges

    def consumed(self, ranges: dict[int, tuple[int, int]]) -> list[Message]:
        """The messages in `ranges`, consumed by confluent-kafka."""
        consumer = self.consumer()
        try:
            consumer.assign([TopicPartition(self.topic, p, s) for p, (s, _e) in ranges.items()])
            wanted, messages = sum(e - s for s, e in ranges.values()), []
            while len(messages) < wanted:
                messages += consumer.consume(wanted, timeout=5)
            return messages
        finally:
            consumer.close()

    def read(self, ranges: dict[int, tuple[int, int]]) -> list[tuple[Any, ...]]:
        """The items read() makes of the messages in `ranges`."""
        consumer = self.reader()
        try:
            consumer.assign([TopicPartition(self.topic, p, s) for p, (s, _e) in ranges.items()])
            wanted, count, items = sum(e - s for s, e in ranges.values()), 0, []
            while count < wanted:
                consumed, more = read(consumer.handle, wanted, 5.0)
                count, items = count + consumed, items + more
            return items
        finally:
            consumer.close()


@pytest.fixture(scope="module")
def log(embedded_kafka: EmbeddedKafka) -> Iterator[Log]:
    log = Log(embedded_kafka)
    yield log
    log.producer.flush(10)


def records(items: list[tuple[Any, ...]]) -> dict[int, list[tuple[Any, ...]]]:
    """Per partition, in order: (offset, record) for a record read(), or (offset, "slow",
    (offset, key, value, headers)) for one it left to parse_record."""
    found: dict[int, list[tuple[Any, ...]]] = {}
    for item in items:
        partition, kind = item[1], item[2]
        assert kind != ERROR, item
        if kind == SLOW:
            found.setdefault(partition, []).append((item[3][0], "slow", item[3]))
            continue
        run = run_of(item)
        for offset, key, value, supersedes, state_key in zip(*run[3:], strict=True):
            record = ChangelogRecord(run.kind, run.writer, key, value, run.batch, supersedes)
            assert state_key == state_key_of(key)
            found.setdefault(partition, []).append((offset, record))
    return found


def test_the_records_smoothscale_writes_are_read_in_runs(log: Log) -> None:
    written = [
        marker(A, "pod-a"),
        *changes(A, 1, {"alice": 1, "bob": None}, [None, b"d:bob@0.0.1.4"]),
        *changes(A, 1, {"al@ice": {"n": 2}}, [b"d:al@ice@0.0.1.4"]),
        closer(A, 1, {"clicks": 3}, b"c@1.0.7.0"),
        tombstone(A, b"d:bob@0.0.1.4"),
        tombstone(A, b"c@1.0.7.0"),
        marker(B, "pod-b"),
        *changes(B, 1, {"alice": 2}, [b"d:alice@1.0.7.1"]),
        tombstone(B, b"d:alice@1.0.7.1"),
        marker(Writer.next_after(3, B), "pod-c"),
    ]
    ranges = log.append([sent(record) for record in written])
    items = log.read(ranges)
    kinds = ["marker", "data", "delete", "data", "close", "tombstone", "marker", "data"]
    assert [item[2] for item in items] == [
        KIND_CODES.index(kind) for kind in (*kinds, "tombstone", "marker")
    ]
    start = ranges[0][0]
    positioned = [(start + offset, record) for offset, record in enumerate(written)]
    assert records(items) == {0: positioned}
    assert [run_of(item) for item in items] == runs_of(positioned)
    assert {item[0] for item in items} == {log.topic}


def test_a_run_ends_where_the_partition_changes(log: Log) -> None:
    written = changes(A, 3, {f"user-{n}": n for n in range(40)}, [None] * 40)
    ranges = log.append([sent(record, n % 2) for n, record in enumerate(written)])
    found = records(log.read(ranges))
    for partition in (0, 1):
        start = ranges[partition][0]
        expected = [record for n, record in enumerate(written) if n % 2 == partition]
        assert found[partition] == [(start + i, r) for i, r in enumerate(expected)]


def test_the_last_header_of_a_name_counts(log: Log) -> None:
    """As in parse_record's dict(headers): a tombstone whose last writer header is not a
    writer is left to parse_record (which refuses it), and the other way round."""
    key = b"d:alice@1.0.7.3"
    messages = [
        Sent(key, None, [("smoothscale.writer", b"x"), ("smoothscale.writer", b"1.0.7")]),
        Sent(key, None, [("smoothscale.writer", b"1.0.7"), ("smoothscale.writer", b"x")]),
        Sent(
            b"d:alice@1.0.7.4",
            b"1",
            [("smoothscale.supersedes", b"d:a@1.0.7.1"), ("smoothscale.supersedes", key)],
        ),
    ]
    found = records(log.read(log.append(messages)))[0]
    assert [entry[1] == "slow" for entry in found] == [False, True, False]
    tombstone = Sent(key, None, [("smoothscale.writer", b"1.0.7"), ("smoothscale.supersedes", key)])
    assert records(log.read(log.append([tombstone])))[0][0][1].supersedes is None
    assert found[0][1].writer == Writer(1, 0, 7)
    assert found[2][1].supersedes == key


def test_a_position_the_broker_does_not_have_is_an_error_item(log: Log) -> None:
    consumer = log.reader(**{"auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(log.topic, 1, log.ends[1] + 1000)])
        items: list[tuple[Any, ...]] = []
        for _ in range(50):
            items += read(consumer.handle, 10, 0.2)[1]
            if items:
                break
        assert [(item[1], item[2], item[3][0]) for item in items] == [
            (1, ERROR, KafkaError._AUTO_OFFSET_RESET)
        ]
    finally:
        consumer.close()


def test_read_takes_the_restores_open_consumer(log: Log) -> None:
    with pytest.raises(TypeError, match="restore's consumer"):
        read(log.consumer(), 10, 0.1)  # type: ignore[arg-type]
    consumer = log.reader()
    consumer.close()
    with pytest.raises(RuntimeError, match="closed"):
        read(consumer.handle, 10, 0.1)


KEYS = st.one_of(
    st.sampled_from(
        [
            b"m@1.0.7",
            b"m@-1.0.7",
            b"m@01.0.7",
            b"c@1.0.7.3",
            b"c@1.0.7.-3",
            b"d:alice@1.0.7.3",
            b"d:al@ice@2.1.3.12",
            b"d:bob@3.2.9223372036854775807.5",
            b"c@1.0.7.999999999999999999",
            b"c@1.0.7.9999999999999999999",
            b"d:@1.0.7.3",
            b"d:alice@1.0.7",
            b"d:alice",
            b"c@1.0.7",
            b"m@1.0.7.3",
            b"x@1.0.7",
            b"cc@1.0.7.3",
            b"d:a@1..7.3",
            b"d:a@1.0.7.3 ",
            b"d:a@+1.0.7.3",
            b"d:a@1_0.0.7.3",
            b"d:a@1.0.7.99999999999999999999",
            b"",
        ]
    ),
    st.binary(max_size=12),
    st.none(),
)
VALUES = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=4))
HEADER_VALUES = st.one_of(
    st.sampled_from([b"1.0.7", b"2.1.3", b"-1.0.7", b"1.0", b"x", b"d:alice@1.0.7.2", b""]),
    st.binary(max_size=6),
    st.none(),
)
HEADER_NAMES = st.sampled_from(
    ["smoothscale.writer", "smoothscale.supersedes", "smoothscale.kind", "smoothscale.batch", "x"]
)
MESSAGES = st.lists(
    st.builds(
        Sent,
        key=KEYS,
        value=VALUES,
        headers=st.none() | st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4),
        partition=st.sampled_from([0, 1]),
    ),
    max_size=12,
)


def both(log: Log, messages: list[Sent]) -> list[tuple[tuple[Any, ...], Message]]:
    """Per message, what read() made of it beside what confluent-kafka consumed."""
    ranges = log.append(messages)
    found = records(log.read(ranges))
    consumed: dict[int, list[Message]] = {}
    for message in log.consumed(ranges):
        consumed.setdefault(message.partition() or 0, []).append(message)
    pairs = []
    for partition, messages_read in consumed.items():
        assert len(found[partition]) == len(messages_read)
        pairs += list(zip(found[partition], messages_read, strict=True))
    assert len(pairs) == len(messages)
    return pairs


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_every_record_read_in_runs_is_the_one_parse_record_reads(
    log: Log, messages: list[Sent]
) -> None:
    for found, message in both(log, messages):
        assert found[0] == message.offset()
        fields = (message.offset(), message.key(), message.value(), message.headers())
        if found[1] == "slow":
            assert found[2] == fields
        else:
            assert found[1] == parse_record(*fields[1:])


@settings(max_examples=200, deadline=None)
@given(MESSAGES)
# Found by the gate of 2026-11-28: a tombstone of a data-like key without "@" (no state key).
@example([Sent(b"d:alice", None, [("smoothscale.writer", b"1.0.7")])])
def test_a_record_parse_record_refuses_is_never_read_in_runs(
    log: Log, messages: list[Sent]
) -> None:
    for found, message in both(log, messages):
        try:
            parse_record(message.key(), message.value(), message.headers())
        except ValueError:  # ChangelogFormatError
            assert found[1] == "slow"
