"""The example StatefulProcessors end to end through the worker's micro-batch on real
PySpark (in-process: the worker's `MicroBatch` over the source's rows, two instances over the
embedded Kafka, a hand-over of task 1 in the middle), and the same input through plain
`transformWithStateInPandas` (or `transformWithState` for the Row-based running count; RocksDB
state store, one query) as the reference.

What is compared, record by record, and why it must agree whatever the batches:
- running count: the last count emitted per user (the processor emits a user's total in every
  batch that sees the user, so only the last one is independent of how input was cut into
  batches), which is also the number of records of the user;
- deduplicate: every output record (the first event of each id; the test runs far within the
  one-hour TTL, so no id is forgotten);
- session windows: every closed session (user, start, end, clicks): sessions do not depend on
  the batches, and a last click far later on each partition moves the watermark past every
  other session, which batches without input then close on both sides.
One Spark session for the module."""

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from examples.processors.deduplicate import pipeline as deduplicate
from examples.processors.running_count import pipeline as running_count
from examples.processors.running_count import rows_pipeline as running_count_rows
from examples.processors.session_windows import pipeline as session_windows
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.progress import ProgressReader, ReportedRole
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.instance import Instance
from smoothscale.runtime.processor import PreparedProcessor, ProcessorPipeline, prepare
from smoothscale.runtime.processor.state import TimeMode
from smoothscale.runtime.source import SCHEMA
from smoothscale.runtime.spark import local_session
from smoothscale.runtime.worker import MicroBatch, dead_letter_sender
from smoothscale.tasks import TaskRole
from tests.runtime.instance_helpers import PARTITIONS, STORE, app_config, for_instance, running
from tests.runtime.kafka_helpers import read_committed, wait_for

pytestmark = pytest.mark.spark

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session("test-processor-spark")
    yield session
    session.stop()


def at(seconds: float) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)).isoformat()


def partition_of(key: str) -> int:
    return sum(key.encode()) % PARTITIONS


@dataclasses.dataclass
class Example:
    pipeline: Callable[[], ProcessorPipeline]
    key: str
    values: list[dict[str, Any]]
    compared: Callable[[list[dict[str, Any]]], Any]


def last_count_per_user(rows: list[dict[str, Any]]) -> dict[str, int]:
    last: dict[str, int] = {}
    for row in rows:
        last[row["user"]] = max(row["count"], last.get(row["user"], 0))
    return last


def every_record(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(row.items())) for row in rows)


USERS = ["ann", "bob", "cid", "dee", "eve", "fay"]

EXAMPLES = {
    "running_count": Example(
        running_count, "user", [{"user": USERS[i * 7 % 6]} for i in range(60)], last_count_per_user
    ),
    "running_count_rows": Example(
        running_count_rows,
        "user",
        [{"user": USERS[i * 5 % 6]} for i in range(40)],
        last_count_per_user,
    ),
    "deduplicate": Example(
        deduplicate,
        "id",
        [{"id": f"id-{i * 5 % 13}", "payload": f"p{i}"} for i in range(60)],
        every_record,
    ),
    "session_windows": Example(
        session_windows,
        "user",
        [{"user": USERS[i % 6], "ts": at(i * 4 + (40 if i >= 30 else 0))} for i in range(60)]
        # One last click per partition far later: the watermark passes every other session.
        + [{"user": user, "ts": at(10_000)} for user in ("end-0", "end-1")],
        every_record,
    ),
}


def produce(config: WorkerConfig, key: str, values: list[dict[str, Any]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": config.bootstrap_servers})
    for value in values:
        record_key = str(value[key])
        producer.produce(
            config.input_topics[0],
            key=record_key.encode(),
            value=json.dumps(value).encode(),
            partition=partition_of(record_key),
        )
    producer.flush(10)


def feed(spark: SparkSession, instance: Instance, prepared: PreparedProcessor) -> None:
    """One micro-batch of the worker's foreachBatch over every input record (the rows below each
    task's position are dropped there), then the batches without input that are due."""
    instance.tick()
    config = instance.config
    messages = read_committed(config.bootstrap_servers, config.input_topics[0], PARTITIONS)
    rows = [
        (m.topic(), m.partition(), m.offset(), m.key(), m.value(), datetime.now(UTC))
        for m in messages
    ]
    MicroBatch(instance, prepared, instance.metrics)(spark.createDataFrame(rows, SCHEMA), 0)
    while instance.run_due_without_input():
        pass


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_processor_through_spark_and_a_hand_over_agrees_with_plain_spark(
    name: str, spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    example = EXAMPLES[name]
    config = app_config(embedded_kafka, tmp_path)
    prepared = prepare(dataclasses.replace(example.pipeline(), store=STORE))
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    active = {0: TaskAssignment(role=TaskRole.ACTIVE, epoch=1)}
    operator.write("pod-a", Assignment(generation=1, tasks={**active, 1: active[0]}))
    operator.write("pod-b", Assignment(generation=1))
    half = len(example.values) // 2
    sender = dead_letter_sender(config.dead_letters())
    with (
        running(for_instance(config, "pod-a"), prepared, sender) as a,
        running(for_instance(config, "pod-b"), prepared, sender) as b,
    ):
        wait_for(lambda: bool(a.tick() or a.active_tasks() == {0: 1, 1: 1}), 10, "active")
        produce(config, example.key, example.values[:half])
        feed(spark, a, prepared)
        operator.write(
            "pod-b",
            Assignment(generation=2, tasks={1: TaskAssignment(role=TaskRole.WARMUP, epoch=1)}),
        )
        operator.write("pod-a", Assignment(generation=3, tasks=active))
        wait_for(lambda: bool(a.tick() or a.active_tasks() == {0: 1}), 10, "the release")
        released = reader.reports("pod-a", PARTITIONS)[1]
        assert released.role is ReportedRole.RELEASED
        handed = TaskAssignment(
            role=TaskRole.ACTIVE, epoch=2, restore_until=dict(released.positions)
        )
        operator.write("pod-b", Assignment(generation=4, tasks={1: handed}))
        wait_for(lambda: bool(b.tick() or b.active_tasks() == {1: 2}), 10, "the hand-over")
        produce(config, example.key, example.values[half:])
        feed(spark, a, prepared)
        feed(spark, b, prepared)
    operator.close()
    reader.close()

    smoothscale = [
        json.loads(m.value() or b"")
        for m in read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS)
    ]
    reference = plain_spark(spark, prepared, [example.values[:half], example.values[half:]])
    assert example.compared(smoothscale) == example.compared(reference)
    assert example.compared(smoothscale), "the example emitted something"


def rows_read(query: StreamingQuery) -> int:
    return sum(progress["numInputRows"] for progress in query.recentProgress)


def plain_spark(
    spark: SparkSession, prepared: PreparedProcessor, batches: list[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The outputs of the pipeline's processor run by transformWithStateInPandas in one
    streaming query (RocksDB state), over JSON files, one micro-batch per file."""
    pipeline = prepared.pipeline
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    with tempfile.TemporaryDirectory() as directory:
        source = Path(directory) / "input"
        source.mkdir()
        for number, batch in enumerate(batches):
            lines = "".join(json.dumps(value) + "\n" for value in batch)
            path = source / f"{number}.json"
            path.write_text(lines)
            os.utime(path, (number, number))  # the file source reads files oldest first
        frame = (
            spark.readStream.schema(prepared.value_schema)
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        if pipeline.event_time_column is not None:
            frame = frame.withWatermark(
                pipeline.event_time_column, f"{prepared.watermark_delay_ms} milliseconds"
            )
        table = f"reference_{abs(hash(directory))}"
        grouped = frame.groupBy(*pipeline.grouping_columns)
        transform = (
            grouped.transformWithState
            if prepared.takes_rows
            else grouped.transformWithStateInPandas
        )
        query = (
            transform(
                statefulProcessor=pipeline.processor,
                outputStructType=prepared.output_schema,
                outputMode=pipeline.output_mode,
                timeMode=pipeline.time_mode,
            )
            .writeStream.format("memory")
            .queryName(table)
            .outputMode(pipeline.output_mode.lower())
            .option("checkpointLocation", str(Path(directory) / "checkpoint"))
            .start()
        )
        try:
            if prepared.time_mode is TimeMode.PROCESSING_TIME:
                # Spark runs a batch without data at every trigger in ProcessingTime, so the
                # query is never out of work (processAllAvailable would wait for ever): wait
                # until it has read every row instead.
                total = sum(len(batch) for batch in batches)
                wait_for(lambda: rows_read(query) >= total, 120, "the reference to read all")
            else:
                query.processAllAvailable()
        finally:
            query.stop()
        return [row.asDict() for row in spark.table(table).collect()]
