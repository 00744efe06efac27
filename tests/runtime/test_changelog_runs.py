"""The restore's C reader (`_changelog.read`) folds every record as `parse_record` reads it.

parse_record defines the format; read() folds the same records faster, straight from
librdkafka's messages, into each partition's `Fold`, and leaves anything it does not read the
same way to parse_record (its `slow` callback). These tests produce messages to a broker (the
records smoothscale writes, and ones no writer should: foreign keys, odd headers) and compare
the folds read() makes of them with the folds of what parse_record makes of the same messages
consumed by confluent-kafka's own consume().
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from hypothesis import example, given, settings
from hypothesis import strategies as st

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime._changelog import read
from smoothscale.runtime.changelog import (
    ChangelogFormatError,
    ChangelogRecord,
    Fold,
    add_record,
    changes,
    closer,
    marker,
    parse_record,
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

    def read(self, ranges: dict[int, tuple[int, int]]) -> "Read":
        """What read() folds of the messages in `ranges`, one Fold per partition."""
        consumer = self.reader()
        done = Read({(self.topic, partition): Fold() for partition in ranges})
        try:
            consumer.assign([TopicPartition(self.topic, p, s) for p, (s, _e) in ranges.items()])
            wanted, count = sum(e - s for s, e in ranges.values()), 0
            while count < wanted:
                # a read() returns what was queued: as the restore loop does, the next leaves out
                # the partitions whose task failed
                failed = {partition for partition, _o, folded in done.slow_records if not folded}
                folds = {key: fold for key, fold in done.folds.items() if key[1] not in failed}
                consumed, _counts, errors = read(consumer.handle, wanted, 5.0, folds, done.slow)
                assert errors == []
                count += consumed
            return done
        finally:
            consumer.close()


@dataclass
class Read:
    """Folds read() fed, and the records it left to `slow` (partition, offset, folded)."""

    folds: dict[tuple[str, int], Fold]
    slow_records: list[tuple[int, int, bool]] = field(default_factory=list)

    def slow(self, fold: Fold, _topic: str, partition: int, message: tuple[Any, ...]) -> bool:
        offset, key, value, headers = message
        try:
            add_record(fold, offset, parse_record(key, value, headers))
        except ChangelogFormatError:
            self.slow_records.append((partition, offset, False))
            return False
        self.slow_records.append((partition, offset, True))
        return True

    def fold(self, partition: int) -> Fold:
        return next(fold for (_t, p), fold in self.folds.items() if p == partition)


@pytest.fixture(scope="module")
def log(embedded_kafka: EmbeddedKafka) -> Iterator[Log]:
    log = Log(embedded_kafka)
    yield log
    log.producer.flush(10)


def folded(positioned: list[tuple[int, ChangelogRecord]]) -> Fold:
    fold = Fold()
    for offset, record in positioned:
        add_record(fold, offset, record)
    return fold


def same(fold: Fold, other: Fold) -> None:
    """The two folds stand at the same place and made the same changes."""
    state = ("position", "read_to", "writer", "closed", "pending", "applied", "skipped")
    assert {name: getattr(fold, name) for name in state} == {
        name: getattr(other, name) for name in state
    }
    assert fold.take() == other.take()


def test_the_records_smoothscale_writes_are_read_on_the_fast_path(log: Log) -> None:
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
    done = log.read(ranges)
    assert done.slow_records == []
    start = ranges[0][0]
    expected = folded([(start + offset, record) for offset, record in enumerate(written)])
    assert (expected.applied, expected.pending) == (8, [])
    same(done.fold(0), expected)


def test_each_partition_is_folded_into_its_own_fold(log: Log) -> None:
    written = changes(A, 3, {f"user-{n}": n for n in range(40)}, [None] * 40)
    closers = [closer(A, 3, {"clicks": 40}, None)] * 2
    messages = [sent(record, n % 2) for n, record in enumerate([*written, *closers])]
    done = log.read(log.append(messages))
    for partition in (0, 1):
        start = log.ends[partition] - 21
        mine = [r for n, r in enumerate(written) if n % 2 == partition]
        positioned = list(enumerate([*mine, closers[0]], start))
        assert len(folded(positioned).take()[0]) == 20
        same(done.fold(partition), folded(positioned))


def test_the_last_header_of_a_name_counts(log: Log) -> None:
    """As in parse_record's dict(headers): a tombstone whose last writer header is a writer is
    read, one whose last is not is left to parse_record (which refuses it: the task fails), and
    the last supersedes header is the record superseded."""
    key = b"d:alice@1.0.7.3"
    messages = [
        Sent(
            b"d:alice@1.0.7.4",
            b"1",
            [("smoothscale.supersedes", b"d:a@1.0.7.1"), ("smoothscale.supersedes", key)],
        ),
        sent(closer(A, 4, {}, None)),
        Sent(key, None, [("smoothscale.writer", b"x"), ("smoothscale.writer", b"1.0.7")]),
        Sent(key, None, [("smoothscale.writer", b"1.0.7"), ("smoothscale.writer", b"x")]),
    ]
    ranges = log.append(messages)
    done = log.read(ranges)
    start = ranges[0][0]
    assert done.slow_records == [(0, start + 3, False)]
    _entries, _reclaimed, garbage, _collected, *_ = done.fold(0).take()
    assert garbage == set()  # the last supersedes header, `key`, tombstoned by the third
    tombstone = Sent(key, None, [("smoothscale.writer", b"1.0.7"), ("smoothscale.supersedes", key)])
    again = log.read(log.append([messages[0], messages[1], tombstone]))
    assert again.slow_records == []
    assert again.fold(0).take()[2] == set()  # a tombstone supersedes nothing


def test_a_position_the_broker_does_not_have_is_an_error(log: Log) -> None:
    consumer = log.reader(**{"auto.offset.reset": "error"})
    folds = {(log.topic, 1): Fold()}
    try:
        consumer.assign([TopicPartition(log.topic, 1, log.ends[1] + 1000)])
        errors: list[tuple[Any, ...]] = []
        for _ in range(50):
            errors += read(consumer.handle, 10, 0.2, folds, Read(folds).slow)[2]
            if errors:
                break
        assert [(error[1], error[2]) for error in errors] == [(1, KafkaError._AUTO_OFFSET_RESET)]
    finally:
        consumer.close()


def test_read_takes_the_restores_open_consumer(log: Log) -> None:
    slow = Read({}).slow
    with pytest.raises(TypeError, match="restore's consumer"):
        read(log.consumer(), 10, 0.1, {}, slow)  # type: ignore[arg-type]
    consumer = log.reader()
    consumer.close()
    with pytest.raises(RuntimeError, match="closed"):
        read(consumer.handle, 10, 0.1, {}, slow)


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


def both(log: Log, messages: list[Sent]) -> None:
    """read()'s folds of `messages` are those of parse_record's records of the same messages
    (consumed by confluent-kafka), up to the first record in a partition that parse_record or
    the fold refuses, which read() left to parse_record (and none before it)."""
    ranges = log.append(messages)
    done = log.read(ranges)
    refused: dict[int, int] = {}
    expected = {partition: Fold() for partition in ranges}
    for message in log.consumed(ranges):
        partition, offset = message.partition() or 0, message.offset() or 0
        if partition in refused:
            continue
        try:
            record = parse_record(message.key(), message.value(), message.headers())
            add_record(expected[partition], offset, record)
        except ChangelogFormatError:  # not a record, or out of the fold's range
            refused[partition] = offset
    refused_by_read = sorted((p, o) for p, o, folded in done.slow_records if not folded)
    assert refused_by_read == sorted(refused.items())
    for partition, fold in expected.items():
        same(done.fold(partition), fold)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
# Found by the gate of 2026-11-28: a tombstone of a data-like key without "@" (no state key).
@example([Sent(b"d:alice", None, [("smoothscale.writer", b"1.0.7")])])
def test_read_folds_every_record_as_parse_record_reads_it(log: Log, messages: list[Sent]) -> None:
    both(log, messages)
