"""One micro-batch through the worker's foreachBatch function (real PySpark, in-process): the
tumbling-window example's struct updates, dead letters in the task's transaction, rows of
tasks not active here, and a batch delivered twice."""

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from examples.pipelines.running_count import add_count, count_per_user
from examples.pipelines.tumbling_window import pipeline as tumbling_window
from pyspark.sql import SparkSession

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.progress import ProgressReader, ReportedRole, TaskReport
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.instance import BatchInput, Instance
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.pipeline import Output, Pipeline
from smoothscale.runtime.source import (
    SCHEMA,
    KafkaRange,
    RangeRead,
    note_planned,
    note_read,
    read_plan,
)
from smoothscale.runtime.spark import local_session
from smoothscale.runtime.worker import WARM_UP_ROUNDS, KeepWarm, MicroBatch, dead_letter_sender
from smoothscale.tasks import TaskRole
from tests.runtime.instance_helpers import (
    PARTITIONS,
    app_config,
    for_instance,
    produce_to_partition,
)
from tests.runtime.kafka_helpers import read_committed, wait_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
    pipeline = tumbling_window()
    # Only task 0 is active here: task 1's rows belong to another instance.
    with active_instance(config, pipeline) as (instance, metrics, _config):
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


def counting(
    *, raise_in_aggregate: str | None = None, raise_in_apply: str | None = None
) -> Pipeline:
    """The running count, with a user on whom its aggregate (in Spark's Python workers) or its
    apply (on the driver) raises, as a buggy pipeline does on some records."""

    def aggregate(batch: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        def check(user: str) -> bool:
            if user == raise_in_aggregate:
                raise ValueError(f"cannot count {user}")
            return True

        checked = batch.where(F.udf(check, "boolean")(F.col("user")))
        return count_per_user(checked)

    def apply(user: str, old: int | None, update: int) -> tuple[int, list[Output]]:
        if user == raise_in_apply:
            raise KeyError(f"no rule for {user}")
        return add_count(user, old, update)

    return Pipeline(
        store="counts",
        value_schema="user STRING",
        key_column="user",
        aggregate=aggregate,
        apply=apply,
    )


@contextmanager
def active_instance(
    config: WorkerConfig, pipeline: Pipeline
) -> Iterator[tuple[Instance, InstanceMetrics, WorkerConfig]]:
    """An instance "pod-a" of the app `config` with task 0 active, stopped afterwards."""
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write(
        "pod-a", Assignment(generation=1, tasks={0: TaskAssignment(role=TaskRole.ACTIVE, epoch=1)})
    )
    operator.close()
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
        yield instance, metrics, config
    finally:
        instance.shutdown(timeout=10)


def user_record(topic: str, offset: int, user: str, partition: int = 0) -> Row:
    value = json.dumps({"user": user}).encode()
    return (topic, partition, offset, user.encode(), value, datetime.now(UTC))


def headers_of(message: Any) -> dict[str, str]:
    return {name: value.decode() for name, value in message.headers() or []}


def test_records_the_pipelines_aggregate_raises_on_go_to_dead_letters_and_the_rest_commits(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    pipeline = counting(raise_in_aggregate="mallory")
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (
        instance,
        metrics,
        config,
    ):
        topic = config.input_topics[0]
        users = ["alice", "alice", "mallory", "bob", "alice"]
        rows = [user_record(topic, offset, user) for offset, user in enumerate(users)]
        MicroBatch(instance, pipeline, metrics)(spark.createDataFrame(rows, SCHEMA), 0)
        state = instance.state_snapshot(0)
        exposition = metrics.exposition().decode()
        reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
        try:
            reported = reader.reports("pod-a", PARTITIONS)[0]
        finally:
            reader.close()

    assert state == {"alice": 3, "bob": 1}, "every other record counted once"
    assert reported.error is not None, "the operator gets to show it"
    assert "cannot count mallory" in reported.error
    (dead,) = read_committed(config.bootstrap_servers, config.dead_letters(), PARTITIONS)
    assert dead.key() == b"mallory"
    headers = headers_of(dead)
    assert headers["smoothscale.reason"] == "pipeline-error"
    assert headers["smoothscale.origin.offset"] == "2"
    assert "cannot count mallory" in headers["smoothscale.error"]
    assert 'smoothscale_dead_letters_total{reason="pipeline-error"} 1.0' in exposition


def test_records_of_a_key_the_pipelines_apply_raises_on_go_to_dead_letters_its_state_unchanged(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    pipeline = counting(raise_in_apply="mallory")
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (
        instance,
        metrics,
        config,
    ):
        topic = config.input_topics[0]
        users = ["alice", "mallory", "bob", "mallory"]
        rows = [user_record(topic, offset, user) for offset, user in enumerate(users)]
        MicroBatch(instance, pipeline, metrics)(spark.createDataFrame(rows, SCHEMA), 0)
        state = instance.state_snapshot(0)

    assert state == {"alice": 1, "bob": 1}
    dead = read_committed(config.bootstrap_servers, config.dead_letters(), PARTITIONS)
    assert sorted(int(headers_of(m)["smoothscale.origin.offset"]) for m in dead) == [1, 3]
    assert all("no rule for mallory" in headers_of(m)["smoothscale.error"] for m in dead)


def test_a_pipeline_that_raises_on_a_whole_large_batch_fails_it_and_commits_nothing(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Past a few records per batch the error is the pipeline's, not the records': the batch
    fails (the instance restarts, the operator shows why) and nothing is committed or lost."""
    pipeline = counting(raise_in_aggregate="alice")
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (
        instance,
        metrics,
        config,
    ):
        topic = config.input_topics[0]
        rows = [user_record(topic, offset, "alice") for offset in range(200)]
        with pytest.raises(Exception, match="cannot count alice"):
            MicroBatch(instance, pipeline, metrics)(spark.createDataFrame(rows, SCHEMA), 0)
        state = instance.state_snapshot(0)

    assert state == {}
    assert read_committed(config.bootstrap_servers, config.dead_letters(), PARTITIONS) == []


def test_a_batch_with_no_input_commits_nothing(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A batch the source planned with no range (its plan changed, nothing new came): Spark
    runs no task of it, and the job observes no row."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (instance, m, config):
        note_batch(instance, [])
        empty = spark.createDataFrame(spark.sparkContext.emptyRDD(), SCHEMA)
        MicroBatch(instance, pipeline, m)(empty, 0)
        state = instance.state_snapshot(0)
        position = instance.read_from()

    assert state == {}
    assert position == {(config.input_topics[0], 0): 0}


def task_0_report(config: WorkerConfig) -> TaskReport:
    """What pod-a reported last of task 0."""
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    try:
        return reader.reports("pod-a", PARTITIONS)[0]
    finally:
        reader.close()


def task_0_batch(topic: str, read_at: int, end: int, update: tuple[str, int]) -> BatchInput:
    """A batch of task 0 as a micro-batch hands it to the instance: its rows read from `read_at`
    up to `end`, one update."""
    return BatchInput(
        ends={0: {topic: end}}, updates={0: [update]}, read_from={(topic, 0): read_at}
    )


def test_a_batch_leaves_out_a_task_no_longer_where_the_batch_read_it_from(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A batch reads while the one before commits behind it: by its own commit, a task may have
    been taken away and taken again elsewhere in its input. Its rows are then not its state's
    next ones: the batch leaves the task out, and commits the others."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (instance, _m, config):
        topic = config.input_topics[0]
        read_elsewhere = task_0_batch(topic, read_at=7, end=9, update=("alice", 2))
        instance.commit_behind(read_elsewhere, instance.batch_began())
        state = instance.state_snapshot(0)
        position = instance.read_from()

    assert state == {}
    assert position == {(topic, 0): 0}


def test_a_shutdown_right_after_a_batch_commits_the_batch_first(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """The batch's commit runs behind it: the shutdown that follows at once (SIGTERM) still
    finds it committed before it releases the task, at the position after it."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (instance, m, config):
        topic = config.input_topics[0]
        rows = [user_record(topic, offset, "alice") for offset in range(3)]
        MicroBatch(instance, pipeline, m)(spark.createDataFrame(rows, SCHEMA), 0)
    released = task_0_report(config)

    outputs = read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS)
    assert [(m.key(), m.value()) for m in outputs] == [(b"alice", b"3")]
    assert released.role is ReportedRole.RELEASED


def test_a_task_taken_while_a_batch_commits_behind_is_read_by_the_batch_after(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Batches back to back: each reads while the one before commits behind it. A task taken
    meanwhile is not in the positions the next batch read from, but is in those of the one
    after: where the instance says to read from is its own active set, not the last batch's."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (instance, _m, config):
        topic = config.input_topics[0]
        first = task_0_batch(topic, read_at=0, end=1, update=("alice", 1))
        instance.commit_behind(first, instance.batch_began())
        operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
        both = {task: TaskAssignment(role=TaskRole.ACTIVE, epoch=1) for task in (0, 1)}
        operator.write("pod-a", Assignment(generation=2, tasks=both))
        operator.close()
        wait_for(
            lambda: bool(instance.tick() or instance.active_tasks() == {0: 1, 1: 1}),
            10,
            "task 1 taken",
        )
        # Read before task 1 was taken, from where the first batch left task 0.
        second = task_0_batch(topic, read_at=1, end=2, update=("alice", 1))
        instance.commit_behind(second, instance.batch_began())
        after = instance.read_from()  # while the second commits behind
        state = instance.state_snapshot(0)

    assert after == {(topic, 0): 2, (topic, 1): 0}
    assert state == {"alice": 2}


def test_a_task_released_while_a_batch_reads_it_is_released_after_the_batch_commits_it(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """The old owner of a hand-over finishes its micro-batch first: ticks while a batch reads
    leave the release to the batch's end, which commits the task's records and then releases
    it at the position after them (released at once, the records read would be dropped, and
    the task would stand still from the batch before)."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (instance, _m, config):
        topic = config.input_topics[0]
        reading = instance.batch_began()
        operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
        operator.write("pod-a", Assignment(generation=2, tasks={}))
        operator.close()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:  # many ticks, each able to take the assignment
            instance.tick()
            time.sleep(0.05)
        active_while_reading = instance.active_tasks()
        instance.commit_behind(task_0_batch(topic, read_at=0, end=3, update=("alice", 3)), reading)
        active_after = instance.active_tasks()
    released = task_0_report(config)

    outputs = read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS)
    assert active_while_reading == {0: 1}
    assert active_after == {}
    assert [(m.key(), m.value()) for m in outputs] == [(b"alice", b"3")]
    assert released.role is ReportedRole.RELEASED


def test_a_task_released_while_a_stalled_batch_reads_it_is_released_at_once(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A batch reading for longer than the stall timeout is not waited for: the operator has
    failed the stalled instance's tasks over, and the batch, should it end after all, commits
    nothing of the task it was told to let go."""
    config = app_config(embedded_kafka, tmp_path).model_copy(update={"stall_timeout": 0.5})
    pipeline = counting()
    with active_instance(config, pipeline) as (instance, _m, config):
        topic = config.input_topics[0]
        reading = instance.batch_began()
        time.sleep(0.6)
        operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
        operator.write("pod-a", Assignment(generation=2, tasks={}))
        operator.close()
        wait_for(lambda: bool(instance.tick() or not instance.active_tasks()), 10, "the release")
        instance.commit_behind(task_0_batch(topic, read_at=0, end=3, update=("alice", 3)), reading)

    assert read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS) == []


def test_a_commit_that_fails_behind_fails_the_next_batch_and_the_next_tick(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    pipeline = counting(raise_in_apply="mallory")
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (instance, _m, config):
        topic = config.input_topics[0]
        # No way to find the records `apply` raises on: the batch fails.
        failing = task_0_batch(topic, read_at=0, end=1, update=("mallory", 1))
        instance.commit_behind(failing, instance.batch_began())

        with pytest.raises(RuntimeError, match="commit failed") as failed:
            instance.commit_behind(None, instance.batch_began())
        with pytest.raises(RuntimeError, match="commit failed"):
            instance.tick()

    assert "no rule for mallory" in repr(failed.value.__cause__)


def note_batch(instance: Instance, reads: list[RangeRead]) -> None:
    """What the source notes while a real batch is planned and read (source.batch_reads)."""
    planned = [KafkaRange(r.topic, r.partition, r.start, r.end) for r in reads]
    note_planned(str(instance.plan_path), planned)
    for read in reads:
        note_read(str(instance.plan_path), read)


def test_a_task_resumes_after_the_offsets_the_source_read_without_records(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A range that ends in transaction markers (offsets the source reads but that hold no
    record): the task's input position moves past them, and only its records are counted."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (
        instance,
        metrics,
        config,
    ):
        topic = config.input_topics[0]
        rows = [user_record(topic, offset, "alice") for offset in range(3)]
        newest = max(row[5] for row in rows)
        note_batch(instance, [RangeRead(topic, 0, 0, 5, 3, round(newest.timestamp() * 1000))])
        MicroBatch(instance, pipeline, metrics)(spark.createDataFrame(rows, SCHEMA), 0)
        position = instance.read_from()
        state = instance.state_snapshot(0)
        exposition = metrics.exposition().decode()

    assert state == {"alice": 3}
    assert position == {(topic, 0): 5}
    assert 'smoothscale_records_processed_total{task="0"} 3.0' in exposition


def test_a_batch_that_read_a_task_from_below_its_position_applies_and_counts_only_the_rest(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A batch planned before the task was taken again at a later position reads rows the
    task's state already holds: they are dropped, and neither applied nor counted twice."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (
        instance,
        metrics,
        config,
    ):
        topic = config.input_topics[0]
        run = MicroBatch(instance, pipeline, metrics)
        first = [user_record(topic, offset, "alice") for offset in range(2)]
        note_batch(instance, [RangeRead(topic, 0, 0, 2, 2, None)])
        run(spark.createDataFrame(first, SCHEMA), 0)
        again = [
            user_record(topic, offset, "bob" if offset > 1 else "alice") for offset in range(4)
        ]
        note_batch(instance, [RangeRead(topic, 0, 0, 4, 4, None)])
        run(spark.createDataFrame(again, SCHEMA), 1)
        position = instance.read_from()
        state = instance.state_snapshot(0)
        exposition = metrics.exposition().decode()

    assert state == {"alice": 2, "bob": 2}
    assert position == {(topic, 0): 4}
    assert 'smoothscale_records_processed_total{task="0"} 4.0' in exposition


def test_a_new_instance_warms_its_query_on_a_sample_it_does_not_own_and_commits_nothing(
    spark: SparkSession,
    embedded_kafka: EmbeddedKafka,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Instance.warm_up puts recent records of a partition it does not own in the plan; the
    next batch runs the pipeline over them (decode, aggregate), again until a run is no
    faster (a young JVM), and drops the result; the sample then leaves the plan."""
    caplog.set_level(logging.INFO, logger="smoothscale.runtime.worker")
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (
        instance,
        metrics,
        config,
    ):
        topic = config.input_topics[0]
        produce_to_partition(config, 1, 5, "zoe")

        assert instance.warm_up(records=3)
        planned = read_plan(instance.plan_path)
        assert planned.partitions[f"{topic}:1"] == 2, "the last 3 of offsets 0..4"
        assert instance.warm_up_from() == {(topic, 1): 2}
        run = MicroBatch(instance, pipeline, metrics)
        planned_before = [user_record(topic, 0, "amy")]  # a batch planned before the sample
        run(spark.createDataFrame(planned_before, SCHEMA), 0)
        assert not instance.warmed.is_set(), "a batch without the sample warms nothing"
        sample = [user_record(topic, offset, "zoe", partition=1) for offset in range(2, 5)]
        run(spark.createDataFrame(sample, SCHEMA), 1)
        assert instance.warmed.is_set()
        assert instance.warm_up_from() == {}
        runs = [r.getMessage() for r in caplog.records if "warm-up run" in r.getMessage()]
        assert 2 <= len(runs) <= WARM_UP_ROUNDS, runs
        assert all("over 3 sampled records" in message for message in runs), runs
        instance.end_warm_up()
        after = read_plan(instance.plan_path)
        # A later warm-up (an idle instance keeping its Python workers alive) runs once.
        caplog.clear()
        assert instance.warm_up(records=3)
        run(spark.createDataFrame(sample, SCHEMA), 2)
        assert instance.warmed.is_set()
        assert sum("warm-up run" in r.getMessage() for r in caplog.records) == 1
        instance.end_warm_up()
        state = instance.state_snapshot(0)

    assert f"{topic}:1" not in after.partitions
    assert state == {"amy": 1}, "nothing of the sample applied"
    outputs = read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS)
    assert [m.key() for m in outputs] == [b"amy"], "nor emitted"


def test_an_instance_that_reads_nothing_for_a_while_reads_its_warm_up_sample_again(
    spark: SparkSession, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Spark stops Python workers idle for a minute, so an instance that reads no input (a
    warm-up restoring for minutes, an idle stream) puts its warm-up sample back in the plan
    after `idle_seconds`, and takes it out once a batch has run it; an instance that reads
    input does not."""
    pipeline = counting()
    with active_instance(app_config(embedded_kafka, tmp_path), pipeline) as (
        instance,
        metrics,
        config,
    ):
        topic = config.input_topics[0]
        produce_to_partition(config, 1, 5, "zoe")
        run = MicroBatch(instance, pipeline, metrics)
        keep_warm = KeepWarm(instance, idle_seconds=0.5)

        run(spark.createDataFrame([user_record(topic, 0, "amy")], SCHEMA), 0)
        keep_warm.tick()
        while_reading = read_plan(instance.plan_path).partitions
        time.sleep(0.6)
        keep_warm.tick()
        idle = read_plan(instance.plan_path).partitions
        sample = [user_record(topic, offset, "zoe", partition=1) for offset in range(5)]
        run(spark.createDataFrame(sample, SCHEMA), 1)
        keep_warm.tick()
        after_the_sample = read_plan(instance.plan_path).partitions
        state = instance.state_snapshot(0)

    assert while_reading == {f"{topic}:0": 0}
    assert idle == {f"{topic}:0": 0, f"{topic}:1": 0}
    assert after_the_sample == {f"{topic}:0": 0}
    assert state == {"amy": 1}, "nothing of the sample applied"
