"""One micro-batch through the worker's foreachBatch function (real PySpark, in-process): the
tumbling-window example's struct updates, dead letters in the task's transaction, rows of
tasks not active here, and a batch delivered twice."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from examples.pipelines.tumbling_window import pipeline as tumbling_window
from pyspark.sql import SparkSession

from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.embedded import EmbeddedKafka
from smoothscale.runtime.instance import Instance
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.source import SCHEMA
from smoothscale.runtime.spark import local_session
from smoothscale.runtime.worker import MicroBatch, dead_letter_sender
from smoothscale.tasks import TaskRole
from tests.runtime.instance_helpers import PARTITIONS, app_config, for_instance
from tests.runtime.kafka_helpers import read_committed, wait_for

pytestmark = pytest.mark.spark

MINUTE = 60_000


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session("test-micro-batch")
    yield session
    session.stop()


Row = tuple[str, int, int, bytes, bytes, datetime]


def record(topic: str, partition: int, offset: int, user: str, amount: int, ts: int) -> Row:
    value = json.dumps({"user": user, "amount": amount, "ts": ts}).encode()
    return (topic, partition, offset, user.encode(), value, datetime.now(UTC))


def test_a_batch_applies_window_updates_once_and_sends_its_dead_letters_in_its_transaction(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path).model_copy(update={"stores": {"windows": None}})
    for topic in config.changelog_topics().values():
        embedded_kafka.create_topic(topic, PARTITIONS)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    # Only task 0 is active here: task 1's rows belong to another instance.
    operator.write(
        "pod-a", Assignment(generation=1, tasks={0: TaskAssignment(role=TaskRole.ACTIVE, epoch=1)})
    )
    operator.close()
    pipeline = tumbling_window()
    metrics = InstanceMetrics()
    worker_config = for_instance(config, "pod-a")
    worker_config.state_dir.mkdir(parents=True)
    instance = Instance(
        worker_config,
        pipeline,
        metrics,
        worker_config.state_dir / "plan.json",
        dead_letter_sender(config.dead_letters()),
    )
    instance.start(first_assignment_timeout=5)
    try:

        def activated() -> bool:
            instance.tick()
            return instance.active_tasks() == {0: 1}

        wait_for(activated, 10, "the activation")
        topic = config.input_topics[0]
        rows = [
            record(topic, 0, 0, "alice", 5, 10 * MINUTE + 1),
            record(topic, 0, 1, "alice", 7, 10 * MINUTE + 2),
            record(topic, 0, 2, "alice", 1, 11 * MINUTE),
            (topic, 0, 3, b"bob", b"{oops", datetime.now(UTC)),
            record(topic, 1, 0, "carol", 100, 10 * MINUTE),
        ]
        batch = spark.createDataFrame(rows, SCHEMA)
        run = MicroBatch(instance, pipeline, metrics)
        run(batch, 0)
        # Spark may deliver a batch again (a retry): rows below the input position are dropped.
        run(batch, 1)
        state = instance.state_snapshot(0)
        exposition = metrics.exposition().decode()
    finally:
        instance.shutdown(timeout=10)

    assert state == {
        f"alice|{10 * MINUTE}": {"sum": 12, "count": 2},
        f"alice|{11 * MINUTE}": {"sum": 1, "count": 1},
    }
    outputs = read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS)
    assert sorted((m.key() or b"").decode() for m in outputs) == sorted(state)
    dead = read_committed(config.bootstrap_servers, config.dead_letters(), PARTITIONS)
    assert [(m.key(), m.value()) for m in dead] == [(b"bob", b"{oops")]
    assert 'smoothscale_dead_letters_total{reason="malformed-json"} 1.0' in exposition
    assert 'smoothscale_records_processed_total{task="0"} 4.0' in exposition
