"""A stand-in for the Spark half of the worker, and the operator's half of the protocol, so the
instance state machine can be tested in-process against the embedded Kafka."""

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from confluent_kafka import KafkaError, Producer, TopicPartition
from examples.pipelines.running_count import pipeline as running_count
from pyspark.sql import Row
from pyspark.sql.types import TimestampType

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from devstack.protocolworker import batch_reader, read_batch
from smoothscale.kafka import names
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.instance import BatchInput, DeadLetterSender, Instance
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.pipeline import Output, Pipeline
from smoothscale.runtime.processor import PreparedProcessor
from tests.runtime.kafka_helpers import read_committed, unique, wait_for

PARTITIONS = 2
STORE = "counts"


def app_config(kafka: EmbeddedKafka | KafkaFront, state_root: Path) -> WorkerConfig:
    """A fresh app (its own topics) with an instance template; override instance_id/state_dir.
    On a KafkaFront, the app's clients go through the front (which fences producers)."""
    app = unique("app")
    config = WorkerConfig(
        app_id=app,
        instance_id="template",
        bootstrap_servers=kafka.bootstrap_servers,
        input_topics=[unique("users")],
        output_topic=unique("totals"),
        stores={STORE: None},
        pipeline="examples.pipelines.running_count:pipeline",
        state_dir=state_root,
        trigger_interval=0.5,
        report_interval=0.2,
        metrics_port=0,
        max_records_per_partition=50,
    )
    cluster = kafka.kafka if isinstance(kafka, KafkaFront) else kafka
    for topic in (*config.input_topics, config.output_topic, *config.changelog_topics().values()):
        cluster.create_topic(topic, PARTITIONS)
    cluster.create_topic(names.assignments_topic(app), 1)
    cluster.create_topic(config.dead_letters(), PARTITIONS)
    return config


def for_instance(config: WorkerConfig, instance_id: str) -> WorkerConfig:
    return config.model_copy(
        update={"instance_id": instance_id, "state_dir": config.state_dir / instance_id}
    )


def produce_users(config: WorkerConfig, users: list[str]) -> None:
    """One record per name, keyed by the name, to the input topic."""
    producer = Producer({"bootstrap.servers": config.bootstrap_servers})
    for user in users:
        partition = user_partition(user)
        producer.produce(
            config.input_topics[0],
            key=user.encode(),
            value=json.dumps({"user": user}).encode(),
            partition=partition,
        )
    producer.flush(10)


def produce_to_partition(config: WorkerConfig, partition: int, records: int, user: str) -> None:
    """`records` records of `user` to `partition` of the input topic, whatever its key hashes to."""
    producer = Producer({"bootstrap.servers": config.bootstrap_servers})
    value = json.dumps({"user": user}).encode()
    for _ in range(records):
        producer.produce(
            config.input_topics[0], key=user.encode(), value=value, partition=partition
        )
    producer.flush(10)


def user_partition(user: str) -> int:
    return sum(user.encode()) % PARTITIONS


def users_batch(n: int, start: int = 0) -> list[str]:
    return [f"user-{(start + i) % 7}" for i in range(n)]


def cycling_count() -> Pipeline:
    """The running count modulo 3, the key deleted whenever it comes back to 0: a pipeline
    that deletes keys all the time (the running count never does)."""

    def apply(user: str, old: int | None, update: int) -> tuple[int | None, list[Output]]:
        total = ((old or 0) + update) % 3
        return (total or None), [(user, total)]

    return dataclasses.replace(running_count(), apply=apply)


def cycling_reference(users: Iterable[str]) -> dict[str, int]:
    """The state `cycling_count` holds after `users`, each applied once."""
    counts = Counter(users)
    return {user: count % 3 for user, count in counts.items() if count % 3}


@contextmanager
def running(
    config: WorkerConfig,
    pipeline: Pipeline | PreparedProcessor | None = None,
    send_dead_letters: DeadLetterSender | None = None,
) -> Iterator[Instance]:
    instance = Instance(
        config,
        pipeline or running_count(),
        InstanceMetrics(),
        config.state_dir / "plan.json",
        send_dead_letters,
    )
    config.state_dir.mkdir(parents=True, exist_ok=True)
    instance.start(first_assignment_timeout=5)
    try:
        yield instance
    finally:
        instance.shutdown(timeout=10)


def ticked(instance: Instance) -> Instance:
    instance.tick()
    return instance


def until_active(instance: Instance, tasks: dict[int, int]) -> None:
    """Wait until the instance has read its assignment and holds exactly `tasks` (task: epoch)
    active: activation happens on a tick after start, not in start."""
    wait_for(lambda: ticked(instance).active_tasks() == tasks, 10, f"tasks {tasks} active")


def feed(instance: Instance, limit: int = 50, tick: bool = True) -> int:
    """Run one micro-batch the way the worker does, without Spark: read the active tasks' input
    from their positions, count per user and partition, commit, and end with the batch's
    `after_batch`. Returns records read. `tick`: the worker's main thread ticks just before
    (False: batches run back to back, as on a busy instance)."""
    if tick:
        instance.tick()
    with instance.batch():
        read = _batch(instance, limit)
        instance.after_batch()
    return read


def _batch(instance: Instance, limit: int) -> int:
    starts = instance.read_from()
    if not starts:
        return 0
    consumer = batch_reader(instance.config, unique("feeder"))
    try:
        batch = read_batch(consumer, starts, limit)
    finally:
        consumer.close()
    instance.commit_batch(batch)
    return sum(batch.counts.values())


def final_totals(config: WorkerConfig) -> dict[str, list[int]]:
    """Every total the app emitted per user, in order, as read_committed readers see them."""
    totals: dict[str, list[int]] = {}
    for message in read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS):
        totals.setdefault((message.key() or b"").decode(), []).append(
            json.loads(message.value() or b"")
        )
    return totals


def feed_rows(instance: Instance, tick: bool = True) -> int:
    """`feed` for a processor pipeline: one micro-batch the way the worker runs one, without
    Spark: the active tasks' input from their positions (to the end a read_committed reader
    sees), each JSON value decoded into the value schema's columns (a TIMESTAMP field from its
    ISO text, as Spark's from_json reads it), committed per task. Returns records read."""
    if tick:
        instance.tick()
    with instance.batch():
        read = _rows_batch(instance)
        instance.after_batch()
    return read


def _rows_batch(instance: Instance) -> int:
    prepared = instance.pipeline
    assert isinstance(prepared, PreparedProcessor)
    starts = instance.read_from()
    if not starts:
        return 0
    consumer = batch_reader(instance.config, unique("feeder"))
    records: dict[int, list[Row]] = {}
    batch = BatchInput()
    try:
        consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])
        open_partitions = set(starts)
        while open_partitions:
            for message in consumer.consume(1000, 1.0):
                where = (message.topic() or "", message.partition() or 0)
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(where)
                    continue
                assert error is None, error
                topic, task = where
                offset = message.offset() or 0
                records.setdefault(task, []).append(
                    Row(
                        topic=topic,
                        partition=task,
                        offset=offset,
                        key=message.key(),
                        value=message.value(),
                    )
                )
                batch.ends.setdefault(task, {})[topic] = offset + 1
                batch.counts[task] = batch.counts.get(task, 0) + 1
    finally:
        consumer.close()
    names = prepared.value_schema.names
    for task, read in records.items():
        values = [{**json.loads(row["value"]), "offset": row["offset"]} for row in read]
        frame = pd.DataFrame(values, columns=[*names, "offset"])
        for field in prepared.value_schema.fields:
            if isinstance(field.dataType, TimestampType):
                frame[field.name] = pd.to_datetime(frame[field.name], utc=True).dt.tz_localize(None)
        batch.rows[task] = frame
    batch.records_at = lambda task, offsets: [r for r in records[task] if r["offset"] in offsets]
    instance.commit_batch(batch)
    return sum(batch.counts.values())
