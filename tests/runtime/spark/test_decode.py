"""Decoding records, and sending the bad ones to the dead-letter topic."""

import datetime

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from examples.pipelines import running_count, tumbling_window
from pyspark.sql import DataFrame, Row, SparkSession

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime.decode import decode, send_dead_letters
from smoothscale.runtime.pipeline import Pipeline, PipelineError
from smoothscale.runtime.source import SCHEMA

from .conftest import unique

WHEN = datetime.datetime(2026, 11, 22, 9, 0, tzinfo=datetime.UTC)


def records(spark: SparkSession, values: list[tuple[bytes | None, bytes | None]]) -> DataFrame:
    """A batch as the source delivers it: one row per (key, value), at offsets 0, 1, ..."""
    rows = [("orders", 2, offset, key, value, WHEN) for offset, (key, value) in enumerate(values)]
    return spark.createDataFrame(rows, SCHEMA)


def windows() -> Pipeline:
    return tumbling_window.pipeline()


@pytest.mark.spark
def test_good_records_come_through_parsed_with_their_origin(spark: SparkSession) -> None:
    batch = records(
        spark,
        [
            (b"alice", b'{"user": "alice", "amount": 5, "ts": 60000}'),
            (b"bob", b'{"ts": 120001, "amount": -2, "user": "bob", "ignored": [1]}'),
        ],
    )

    good, bad = decode(batch, windows())

    assert bad.count() == 0
    assert good.columns == ["partition", "offset", "timestamp", "key", "user", "amount", "ts"]
    assert [tuple(row) for row in good.orderBy("offset").collect()] == [
        (2, 0, WHEN.replace(tzinfo=None), "alice", "alice", 5, 60000),
        (2, 1, WHEN.replace(tzinfo=None), "bob", "bob", -2, 120001),
    ]


@pytest.mark.spark
def test_fields_are_found_by_any_name_json_allows(spark: SparkSession) -> None:
    """Field names with spaces, quotes, backslashes and backticks, as a value schema spells
    them in Spark DDL."""
    pipeline = Pipeline(
        store="s",
        value_schema="`the user's name` STRING, `a\\b` LONG, `x``y` STRING",
        key_column="the user's name",
        aggregate=lambda batch: batch,
        apply=lambda key, old, update: (old, []),
    )
    batch = records(
        spark,
        [
            (b"k", b'{"the user\'s name": "alice", "a\\\\b": 3, "x`y": "z"}'),
            (b"k", b'{"the user\'s name": "bob", "x`y": "z"}'),
        ],
    )

    good, bad = decode(batch, pipeline)

    assert [tuple(row)[4:] for row in good.collect()] == [("alice", 3, "z")]
    assert [row["reason"] for row in bad.collect()] == ["missing-field"]


BAD_VALUES = [
    (None, "null-value"),
    (b"\xff\xfe{}", "invalid-utf8"),
    (b"not json", "malformed-json"),
    (b"", "malformed-json"),
    (b'{"user": "a", "amount": 5', "malformed-json"),
    (b"[1, 2]", "not-an-object"),
    (b"42", "not-an-object"),
    (b'{"user": "a", "amount": "five", "ts": 1}', "wrong-type"),
    (b'{"user": "a", "amount": 1.5, "ts": 1}', "wrong-type"),
    (b'{"user": "a", "ts": 1}', "missing-field"),
    (b'{"user": "a", "amount": null, "ts": 1}', "missing-field"),
]


@pytest.mark.spark
def test_bad_records_go_to_the_bad_rows_with_their_reason(spark: SparkSession) -> None:
    good_value = b'{"user": "ok", "amount": 1, "ts": 1}'
    values = [good_value, *(value for value, _ in BAD_VALUES), good_value]
    batch = records(spark, [(b"k", value) for value in values])

    good, bad = decode(batch, windows())

    assert sorted(row["offset"] for row in good.collect()) == [0, len(values) - 1]
    assert sorted(tuple(row) for row in bad.collect()) == [
        ("orders", 2, offset, b"k", value, reason)
        for offset, (value, reason) in enumerate(BAD_VALUES, start=1)
    ]


@pytest.mark.spark
def test_a_pipeline_keyed_by_the_record_key_refuses_records_without_a_usable_key(
    spark: SparkSession,
) -> None:
    by_record_key = Pipeline(
        store="counts",
        value_schema="amount LONG",
        key_column="key",
        aggregate=running_count.count_per_user,
        apply=running_count.add_count,
    )
    batch = records(
        spark, [(b"alice", b'{"amount": 1}'), (None, b'{"amount": 1}'), (b"\xff", b'{"amount": 1}')]
    )

    good, bad = decode(batch, by_record_key)

    assert [row["key"] for row in good.collect()] == ["alice"]
    assert sorted((row["offset"], row["reason"]) for row in bad.collect()) == [
        (1, "missing-key"),
        (2, "invalid-utf8"),
    ]


@pytest.mark.spark
@pytest.mark.parametrize(
    ("value_schema", "key_column", "message"),
    [
        ("user STRING, amount", "user", "not valid Spark DDL"),
        ("user STRING, offset LONG", "user", "names offset"),
        ("user STRING", "account", "key column 'account' is neither"),
    ],
)
def test_a_value_schema_the_runtime_cannot_use_is_refused_with_the_fix(
    spark: SparkSession, value_schema: str, key_column: str, message: str
) -> None:
    pipeline = Pipeline(
        store="counts",
        value_schema=value_schema,
        key_column=key_column,
        aggregate=running_count.count_per_user,
        apply=running_count.add_count,
    )

    with pytest.raises(PipelineError, match=message):
        decode(records(spark, []), pipeline)


def test_dead_letters_carry_the_record_with_its_reason_and_origin_in_headers(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic = unique("dead-letters")
    embedded_kafka.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers, "log_level": 3})
    bad = [
        Row(
            topic="orders",
            partition=2,
            offset=7,
            key=b"k",
            value=b"not json",
            reason="malformed-json",
        ),
        Row(topic="orders", partition=0, offset=9, key=None, value=None, reason="null-value"),
    ]

    sent = send_dead_letters(bad, producer, topic)
    assert producer.flush(10) == 0
    producer.close()

    assert sent == 2
    consumer = Consumer(
        {"bootstrap.servers": embedded_kafka.bootstrap_servers, "group.id": unique("reader")}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = [m for m in consumer.consume(10, timeout=5) if m.error() is None]
    finally:
        consumer.close()
    assert [(m.key(), m.value(), dict(m.headers() or [])) for m in messages] == [
        (
            b"k",
            b"not json",
            {
                "smoothscale.reason": b"malformed-json",
                "smoothscale.origin.topic": b"orders",
                "smoothscale.origin.partition": b"2",
                "smoothscale.origin.offset": b"7",
            },
        ),
        (
            None,
            None,
            {
                "smoothscale.reason": b"null-value",
                "smoothscale.origin.topic": b"orders",
                "smoothscale.origin.partition": b"0",
                "smoothscale.origin.offset": b"9",
            },
        ),
    ]
