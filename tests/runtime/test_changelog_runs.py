"""The restore's C reader (`_changelog.runs`) reads every record as `parse_record` does.

parse_record defines the format; runs() reads the same records faster, in runs, and leaves
anything it does not read the same way to parse_record. These tests hand both the same
messages: the records smoothscale writes, and ones no writer should (foreign keys, odd
headers, errors), and compare.
"""

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from smoothscale.runtime._changelog import runs
from smoothscale.runtime.changelog import (
    KIND_CODES,
    SLOW,
    ChangelogRecord,
    changes,
    closer,
    marker,
    parse_record,
    run_of,
    runs_of,
    tombstone,
)
from smoothscale.runtime.writer import Writer

# B's nonce is as long as any: 63 random bits (Writer.next_after), 19 digits.
A, B = Writer(1, 0, 7), Writer(2, 1, 2**63 - 1)


@dataclass
class Message:
    """What runs() reads of a confluent-kafka Message: its methods."""

    key_: Any
    value_: Any
    headers_: Any
    offset_: Any = 0
    partition_: Any = 0
    topic_: Any = "changelog"
    error_: Any = None

    def key(self) -> Any:
        return self.key_

    def value(self) -> Any:
        return self.value_

    def headers(self) -> Any:
        return self.headers_

    def offset(self) -> Any:
        return self.offset_

    def partition(self) -> Any:
        return self.partition_

    def topic(self) -> Any:
        return self.topic_

    def error(self) -> Any:
        return self.error_


def message(record: ChangelogRecord, offset: int, partition: int = 0) -> Message:
    return Message(record.key, record.value, record.headers(), offset, partition)


def read(messages: list[Message]) -> list[tuple[Any, ...]]:
    """Per message, in order: (topic, partition, offset, record) read by runs(), or
    (topic, partition, "slow", message) for a message it left to parse_record."""
    found: list[tuple[Any, ...]] = []
    for item in runs(messages):
        topic, partition, kind = item[0], item[1], item[2]
        if kind == SLOW:
            found.append((topic, partition, "slow", item[3]))
            continue
        run = run_of(item)
        for offset, key, value, supersedes, state_key in zip(*run[3:], strict=True):
            record = ChangelogRecord(run.kind, run.writer, key, value, run.batch, supersedes)
            assert state_key == (record.state_key() if key.startswith(b"d:") else None)
            found.append((topic, partition, offset, record))
    return found


def test_the_records_smoothscale_writes_are_read_in_runs() -> None:
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
    messages = [message(record, offset) for offset, record in enumerate(written)]
    items = runs(messages)
    assert [item[2] for item in items] == [
        KIND_CODES.index(kind)
        for kind in (
            "marker",
            "data",
            "delete",
            "data",
            "close",
            "tombstone",
            "marker",
            "data",
            "tombstone",
            "marker",
        )
    ]
    assert read(messages) == [
        ("changelog", 0, offset, record) for offset, record in enumerate(written)
    ]
    assert [run_of(item) for item in items] == runs_of(list(enumerate(written)))


def test_a_run_ends_where_the_partition_changes() -> None:
    records = changes(A, 3, {"alice": 1, "bob": 2, "carol": 3}, [None, None, None])
    messages = [message(records[0], 10, 0), message(records[1], 20, 1), message(records[2], 11, 0)]
    assert [(item[1], item[5]) for item in runs(messages)] == [(0, [10]), (1, [20]), (0, [11])]


def test_errors_and_records_of_no_topic_are_left_to_the_caller() -> None:
    record = changes(A, 3, {"alice": 1}, [None])[0]
    failed = Message(None, None, None, error_="an error")
    no_partition = Message(record.key, record.value, None, partition_=None)
    assert [item[2:4] for item in runs([failed, no_partition])] == [
        (SLOW, failed),
        (SLOW, no_partition),
    ]


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
    st.text(max_size=5),
)
VALUES = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=4), st.text(max_size=3))
HEADER_VALUES = st.one_of(
    st.sampled_from([b"1.0.7", b"2.1.3", b"-1.0.7", b"1.0", b"x", b"d:alice@1.0.7.2"]),
    st.binary(max_size=6),
    st.none(),
    st.text(max_size=6),
)
HEADER_NAMES = st.sampled_from(
    ["smoothscale.writer", "smoothscale.supersedes", "smoothscale.kind", "smoothscale.batch", "x"]
)
HEADERS = st.one_of(
    st.none(),
    st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4),
    st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=2),
    st.lists(st.tuples(st.binary(max_size=3), HEADER_VALUES), min_size=1, max_size=1),
    st.lists(st.tuples(HEADER_NAMES), min_size=1, max_size=1),
)
MESSAGES = st.lists(
    st.builds(
        Message,
        key_=KEYS,
        value_=VALUES,
        headers_=HEADERS,
        offset_=st.one_of(st.integers(0, 10**12), st.none()),
        partition_=st.sampled_from([0, 1, 1000, None]),
        topic_=st.sampled_from(["changelog", "other", None]),
    ),
    max_size=12,
)


@settings(max_examples=500, deadline=None)
@given(MESSAGES)
def test_every_record_read_in_runs_is_the_one_parse_record_reads(messages: list[Message]) -> None:
    found = read(messages)
    assert len(found) == len(messages)
    for sent, (topic, partition, offset, record) in zip(messages, found, strict=True):
        assert (topic, partition) == (sent.topic_, sent.partition_)
        if offset == "slow":
            assert record is sent
            continue
        assert offset == sent.offset_
        assert record == parse_record(sent.key_, sent.value_, sent.headers_)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_a_record_parse_record_refuses_is_never_read_in_runs(messages: list[Message]) -> None:
    for sent, (_topic, _partition, offset, _record) in zip(messages, read(messages), strict=True):
        try:
            parse_record(sent.key_, sent.value_, sent.headers_)
        except (ValueError, AttributeError, TypeError):  # ChangelogFormatError, or odd input
            assert offset == "slow"
