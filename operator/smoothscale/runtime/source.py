"""A Kafka source for Spark Structured Streaming that reads exactly the partitions it is told to.

The pip PySpark has no Kafka connector, so this is a Python data source (pyspark.sql.datasource)
over confluent-kafka; docs/decisions/0001-kafka-source-as-python-data-source.md says why.

    spark.readStream.format("smoothscale-kafka")
        .option("bootstrap.servers", "...").option("topics", "orders,payments")
        .option("plan.path", "/state/plan.json").load()

Rows: topic STRING, partition INT, offset LONG, key BINARY, value BINARY, timestamp TIMESTAMP.

Which partitions, from where: the plan. Spark runs the stream reader's planning methods in a
Python worker process of its own, not in the driver's interpreter, so the driver tells the
reader what to read through a JSON file it replaces atomically (`write_plan`):

    {"partitions": {"orders:3": 1200, "payments:3": 57}, "version": 8,
     "activations": {"orders:3": 2, "payments:3": 2}}

Before each micro-batch the reader reads the plan again (docs/runtime-source.md):
- a partition newly in the plan is read from the plan's start offset;
- a partition no longer in the plan is not read any more;
- a partition still in the plan goes on from where the previous micro-batch ended, unless its
  start offset or its activation number (optional, 0 when absent; the driver bumps it each time
  it takes the task) changed since the reader last saw it: then it is read from the plan's
  start offset. The activation number makes a release followed by a re-activation at the same
  start offset visible even when the reader never saw the plan without the partition.
So the set of partitions changes between micro-batches without restarting the query. Each batch
reads every planned partition up to its end offset when the batch was planned, at most
`max.records.per.partition` offsets of it, with isolation.level=read_committed.

What each micro-batch read: planning a batch notes its ranges in `<plan.path>.reads/batch.json`,
and reading a range to its end notes its record count and newest timestamp beside it, so the
driver learns each task's input range without a Spark job of its own (`batch_reads`).

Spark's offsets for this source are, per "topic:partition", the next offset to read and the
plan's start offset and activation the reader last saw:
{"orders:3": {"next": 1300, "start": 1200, "activation": 2}}. The
runtime gives every run of the query a fresh checkpoint: input positions live in each task's
state, and the plan, written from that state, is the only source of start offsets.
"""

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)

if TYPE_CHECKING:
    import confluent_kafka
    import confluent_kafka.admin
    import pyarrow
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.datasource import ReadLimit
    from pyspark.sql.types import StructType

SOURCE_NAME = "smoothscale-kafka"
SCHEMA = "topic STRING, partition INT, offset LONG, key BINARY, value BINARY, timestamp TIMESTAMP"

BOOTSTRAP_SERVERS_OPTION = "bootstrap.servers"
TOPICS_OPTION = "topics"
PLAN_PATH_OPTION = "plan.path"
MAX_RECORDS_OPTION = "max.records.per.partition"
READ_TIMEOUT_OPTION = "read.timeout.seconds"
BATCH_INTERVAL_OPTION = "batch.interval.seconds"
KAFKA_OPTION_PREFIX = "kafka."

DEFAULT_READ_TIMEOUT_SECONDS = 60.0
"""How long reading a partition may make no progress before the batch fails (broker down)."""
ARROW_CHUNK_RECORDS = 8192
"""Records per Arrow record batch handed to Spark."""
_POLL_SECONDS = 0.2
_METADATA_TIMEOUT_SECONDS = 10.0

log = logging.getLogger(__name__)


class SourceError(RuntimeError):
    """The source cannot do what it was asked; the message says what to fix."""


TopicPartitionName = str
"""A partition as it appears in plans and offsets: "topic:partition"."""


def partition_name(topic: str, partition: int) -> TopicPartitionName:
    return f"{topic}:{partition}"


def parse_partition_name(name: TopicPartitionName) -> tuple[str, int]:
    topic, separator, number = name.rpartition(":")
    if not separator or not topic or not number.isdigit():
        raise SourceError(
            f"{name!r} does not name a Kafka partition: write it as 'topic:partition', "
            "e.g. 'orders:3'"
        )
    return topic, int(number)


@dataclass(frozen=True)
class Plan:
    """What the driver wants read: start offset per partition, and the plan's version."""

    partitions: Mapping[TopicPartitionName, int]
    version: int
    activations: Mapping[TopicPartitionName, int]
    """How many times the driver has taken each partition; absent means 0."""

    def activation(self, name: TopicPartitionName) -> int:
        return self.activations.get(name, 0)


def write_plan(
    path: str | Path,
    starts: Mapping[tuple[str, int], int],
    version: int,
    activations: Mapping[tuple[str, int], int] | None = None,
) -> None:
    """Replace the plan at `path` atomically (temp file + rename in the same directory).

    `activations` (optional) numbers each partition's activations: bump a partition's number
    every time it is taken again, so the reader restarts it from its start offset.
    """
    target = Path(path)
    document = {
        "partitions": {
            partition_name(topic, partition): offset
            for (topic, partition), offset in sorted(starts.items())
        },
        "version": version,
        "activations": {
            partition_name(topic, partition): number
            for (topic, partition), number in sorted((activations or {}).items())
        },
    }
    _replace(target, json.dumps(document), sync=True)


def _replace(target: Path, text: str, sync: bool) -> None:
    """Write `text` to `target` atomically: a temp file in the same directory, renamed over it
    (`sync`: flushed to disk first, for a file that must survive a crash of the machine)."""
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
            if sync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_plan(path: str | Path) -> Plan:
    """Read and check the plan at `path`."""
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError as error:
        raise SourceError(
            f"no partition plan at {path}: the driver writes it (write_plan) before it starts "
            "the query, even when it has no partition to read yet"
        ) from error
    except (OSError, ValueError) as error:
        raise SourceError(f"cannot read the partition plan {path}: {error}") from error
    if not isinstance(document, dict):
        document = {}
    partitions = document.get("partitions")
    version = document.get("version")
    activations = document.get("activations", {})
    if (
        not isinstance(partitions, dict)
        or not isinstance(version, int)
        or not isinstance(activations, dict)
    ):
        raise SourceError(
            f"partition plan {path} must be a JSON object "
            '{"partitions": {"topic:partition": startOffset, ...}, "version": n, '
            '"activations": {"topic:partition": n, ...}} (activations optional)'
        )
    for what, numbers in (("start offset", partitions), ("activation", activations)):
        for name, number in numbers.items():
            parse_partition_name(name)
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise SourceError(
                    f"partition plan {path}: {what} of {name} must be a non-negative integer, "
                    f"got {number!r}"
                )
    return Plan(partitions=partitions, version=version, activations=activations)


_READS_SUFFIX = ".reads"
"""The directory beside the plan (`<plan.path>.reads`) where the source notes what each
micro-batch read."""
_BATCH_FILE = "batch.json"


@dataclass(frozen=True)
class RangeRead:
    """One partition's range of the micro-batch in flight, offsets [start, end), and what the
    source read in it: `records` (None: not read to its end yet; a transaction's control records
    and an aborted transaction's records take offsets but are not read) and the newest
    record's timestamp in milliseconds (None: no record carries one)."""

    topic: str
    partition: int
    start: int
    end: int
    records: int | None = None
    newest_ms: int | None = None


def _reads_directory(plan_path: str | Path) -> Path:
    return Path(f"{plan_path}{_READS_SUFFIX}")


def batch_reads(plan_path: str | Path) -> dict[tuple[str, int], RangeRead] | None:
    """The ranges of the micro-batch planned last, by (topic, partition), with what the source
    has read of them. Call it from `foreachBatch` after a Spark job read the whole batch: every
    range then has its `records`. None when the source has noted no batch (the rows did not
    come from this source)."""
    directory = _reads_directory(plan_path)
    try:
        planned = json.loads((directory / _BATCH_FILE).read_text())
    except (OSError, ValueError):
        return None
    reads = {}
    for topic, partition, start, end in planned:
        read = RangeRead(topic, partition, start, end)
        try:
            records, newest_ms = json.loads((directory / _read_file(read)).read_text())
            read = RangeRead(topic, partition, start, end, records, newest_ms)
        except (OSError, ValueError):
            pass
        reads[(topic, partition)] = read
    return reads


def _read_file(read: RangeRead) -> str:
    return f"{read.topic}:{read.partition}:{read.start}-{read.end}.json"


def note_planned(plan_path: str, ranges: "Sequence[KafkaRange]") -> None:
    """Note the ranges of the batch being planned, and forget what earlier batches read."""
    directory = _reads_directory(plan_path)
    directory.mkdir(exist_ok=True)
    planned = [RangeRead(r.topic, r.partition, r.start, r.end) for r in ranges]
    keep = {_BATCH_FILE, *(_read_file(read) for read in planned)}
    for path in directory.iterdir():
        if path.name not in keep:
            path.unlink(missing_ok=True)
    document = [[r.topic, r.partition, r.start, r.end] for r in planned]
    _replace(directory / _BATCH_FILE, json.dumps(document), sync=False)


def note_read(plan_path: str, read: RangeRead) -> None:
    """Note what reading a whole range found (the same for every read of it: Kafka's records at
    those offsets do not change)."""
    directory = _reads_directory(plan_path)
    directory.mkdir(exist_ok=True)
    _replace(directory / _read_file(read), json.dumps([read.records, read.newest_ms]), sync=False)


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, checked once when the query starts."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    plan_path: str
    max_records_per_partition: int | None
    read_timeout_seconds: float
    batch_interval_seconds: float | None
    """The least time between two micro-batches that read data, except for a partition new in
    the plan (see KafkaStreamReader.latestOffset); None: every trigger may plan one."""
    kafka_config: Mapping[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "SourceOptions":
        missing = [
            name
            for name in (BOOTSTRAP_SERVERS_OPTION, TOPICS_OPTION, PLAN_PATH_OPTION)
            if not options.get(name)
        ]
        if missing:
            raise SourceError(
                f"the {SOURCE_NAME} source needs the option(s) {', '.join(missing)}: "
                f'.option("{missing[0]}", ...) on spark.readStream'
            )
        topics = tuple(topic.strip() for topic in options[TOPICS_OPTION].split(",") if topic)
        return cls(
            bootstrap_servers=options[BOOTSTRAP_SERVERS_OPTION],
            topics=topics,
            plan_path=options[PLAN_PATH_OPTION],
            max_records_per_partition=_positive_int(options, MAX_RECORDS_OPTION),
            read_timeout_seconds=_positive_float(options, READ_TIMEOUT_OPTION)
            or DEFAULT_READ_TIMEOUT_SECONDS,
            batch_interval_seconds=_positive_float(options, BATCH_INTERVAL_OPTION),
            kafka_config={
                name[len(KAFKA_OPTION_PREFIX) :]: value
                for name, value in options.items()
                if name.startswith(KAFKA_OPTION_PREFIX)
            },
        )

    def admin_config(self) -> dict[str, Any]:
        """Settings of the client that asks for end offsets: passthrough, then ours."""
        return {**self.kafka_config, "bootstrap.servers": self.bootstrap_servers}

    def consumer_config(self) -> dict[str, Any]:
        """Settings of every consumer the source makes: passthrough first, ours on top."""
        return {
            **self.kafka_config,
            "bootstrap.servers": self.bootstrap_servers,
            # assign() never joins the group; librdkafka still wants a group id.
            "group.id": "smoothscale-source",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            # A start offset outside the log is a lost input: fail, never skip silently.
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
        }


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise SourceError(f"option {name} must be a positive integer, got {raw!r}")
    return int(raw)


def _positive_float(options: Mapping[str, str], name: str) -> float | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise SourceError(f"option {name} must be a positive number of seconds, got {raw!r}")
    return value


class KafkaRange(InputPartition):
    """Offsets [start, end) of one Kafka partition: what one Spark task of a micro-batch reads."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class KafkaStreamReader(DataSourceStreamReader):
    """Plans micro-batches from the partition plan; reads each range with its own consumer."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: confluent_kafka.admin.AdminClient | None = None
        self._planned_at: float | None = None
        """When the last micro-batch with something new was planned (monotonic)."""

    def initialOffset(self) -> dict[str, Any]:
        """Where a query with a fresh checkpoint starts: every plan start. What an earlier
        query noted it read is forgotten."""
        shutil.rmtree(_reads_directory(self.options.plan_path), ignore_errors=True)
        plan = self._plan()
        return {
            name: {"next": start, "start": start, "activation": plan.activation(name)}
            for name, start in sorted(plan.partitions.items())
        }

    def latestOffset(self, start: dict[str, Any], limit: "ReadLimit") -> dict[str, Any]:  # noqa: ARG002
        """The end of the next micro-batch: for each planned partition, where it stops.

        Spark's read limit is not used: the source's own cap, max.records.per.partition,
        bounds every batch (a bounded batch is what keeps a hand-over short).

        With batch.interval.seconds the source paces the batches itself, and Spark asks it
        as often as its polling delay (the worker's query has a 0 s trigger): a batch that
        reads something new is planned at most once per interval (`start` returned as it is
        tells Spark there is nothing new yet), except when a partition is new in the plan or
        restarted from its plan start (a task just taken over, a warm-up sample). That one is
        planned at once, with everything else: a task handed over waits for no trigger.
        """
        plan = self._plan()
        names = sorted(plan.partitions)
        seen = {
            name: {"start": plan.partitions[name], "activation": plan.activation(name)}
            for name in names
        }
        if self._paced() and all(_continues(name, seen[name], start) for name in names):
            return start
        ends = self._end_offsets(names)
        cap = self.options.max_records_per_partition
        latest: dict[str, Any] = {}
        for name in names:
            begin = _range_start(name, seen[name], start)
            end = max(begin, ends.get(name, begin))
            if cap is not None:
                end = min(end, begin + cap)
            latest[name] = {"next": end, **seen[name]}
        if latest != start:
            self._planned_at = time.monotonic()
        return latest

    def _paced(self) -> bool:
        """Whether the batch interval since the last batch planned has not run out yet."""
        interval = self.options.batch_interval_seconds
        return (
            interval is not None
            and self._planned_at is not None
            and time.monotonic() - self._planned_at < interval
        )

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[KafkaRange]:
        ranges = []
        for name, position in sorted(end.items()):
            begin = _range_start(name, position, start)
            if position["next"] > begin:
                topic, partition = parse_partition_name(name)
                ranges.append(KafkaRange(topic, partition, begin, position["next"]))
        note_planned(self.options.plan_path, ranges)
        return ranges

    def read(self, partition: InputPartition) -> Iterator["pyarrow.RecordBatch"]:
        if not isinstance(partition, KafkaRange):
            raise SourceError(f"the {SOURCE_NAME} source cannot read {partition!r}")
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: input positions are committed with each task's state, not here."""

    def stop(self) -> None:
        self._admin = None

    def _plan(self) -> Plan:
        plan = read_plan(self.options.plan_path)
        unknown = sorted(
            name
            for name in plan.partitions
            if parse_partition_name(name)[0] not in self.options.topics
        )
        if unknown:
            raise SourceError(
                f"partition plan {self.options.plan_path} names {', '.join(unknown)}, outside "
                f"the source's topics ({', '.join(self.options.topics)})"
            )
        return plan

    def _end_offsets(self, names: Sequence[TopicPartitionName]) -> dict[TopicPartitionName, int]:
        """Each partition's last stable offset now: the end of what read_committed can read.

        One ListOffsets request per broker, whatever the number of partitions. A partition
        whose broker does not answer (down, unreachable, timed out) is left out: the batch
        reads nothing new from it, and the query keeps running until the broker is back,
        instead of failing and restarting the instance for an outage that heals by itself.
        A partition that does not exist fails the query with an error that says so.
        """
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.admin._listoffsets import OffsetSpec  # its public re-export is untyped

        if not names:
            return {}
        if self._admin is None:
            self._admin = AdminClient(self.options.admin_config())
        latest: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # untyped upstream
        requests = {TopicPartition(*parse_partition_name(name)): latest for name in names}
        futures = self._admin.list_offsets(
            requests,
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=_METADATA_TIMEOUT_SECONDS,
        )
        ends = {}
        for topic_partition, future in futures.items():
            name = partition_name(topic_partition.topic, topic_partition.partition)
            try:
                ends[name] = future.result().offset
            except KafkaException as error:
                if self._exists(topic_partition):
                    log.warning(
                        "no end offset for %s from %s (%s): nothing new from it in this "
                        "micro-batch",
                        name,
                        self.options.bootstrap_servers,
                        error.args[0],
                    )
                    continue
                raise SourceError(
                    f"cannot find the end offset of {name} on {self.options.bootstrap_servers}: "
                    f"the partition does not exist ({error.args[0]})"
                ) from error
        return ends

    def _exists(self, topic_partition: "confluent_kafka.TopicPartition") -> bool:
        """Whether the cluster's metadata has this partition; True when the cluster does not
        answer (then it is unavailable for now, not missing)."""
        from confluent_kafka import KafkaError, KafkaException

        assert self._admin is not None
        try:
            metadata = self._admin.list_topics(
                topic_partition.topic, timeout=_METADATA_TIMEOUT_SECONDS
            )
        except KafkaException:
            return True
        topic = metadata.topics.get(topic_partition.topic)
        if topic is None:
            return False
        if topic.error is not None:
            return bool(topic.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART)
        return topic_partition.partition in topic.partitions


def _continues(
    name: TopicPartitionName, seen: Mapping[str, Any], previous: Mapping[str, Any]
) -> bool:
    """Whether a partition goes on from where the previous batch ended (`previous`, its end
    offsets): it was planned with the same plan start offset and activation as now (`seen`).
    Otherwise it is new to the reader or restarted, and read from the plan's start."""
    before = previous.get(name)
    return (
        isinstance(before, dict)
        and before.get("start") == seen["start"]
        and before.get("activation", 0) == seen.get("activation", 0)
    )


def _range_start(
    name: TopicPartitionName, seen: Mapping[str, Any], previous: Mapping[str, Any]
) -> int:
    """Where a partition's next range begins (see _continues)."""
    if _continues(name, seen, previous):
        return int(previous[name]["next"])
    return int(seen["start"])


def read_range(options: SourceOptions, kafka_range: KafkaRange) -> Iterator["pyarrow.RecordBatch"]:
    """The records of `kafka_range`, as Arrow record batches of the source's schema.

    The range is done when the consumer's position reaches its end: a transaction's control
    records (and an aborted transaction's records, under read_committed) occupy offsets but are
    never delivered, so waiting for a record at end - 1 could wait forever.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    topic, partition, end = kafka_range.topic, kafka_range.partition, kafka_range.end
    consumer = Consumer(options.consumer_config())
    try:
        consumer.assign([TopicPartition(topic, partition, kafka_range.start)])
        chunk = _Chunk(topic, partition)
        records, newest_ms = 0, -1
        position = kafka_range.start
        stalled_since = time.monotonic()
        while position < end:
            # Ask for no more than the range can hold, so a short range does not wait for more.
            wanted = min(ARROW_CHUNK_RECORDS, end - position)
            for message in consumer.consume(wanted, timeout=_POLL_SECONDS):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                offset = message.offset()
                if offset is not None and offset < end:
                    timestamp_ms = message.timestamp()[1]
                    chunk.add(offset, message.key(), message.value(), timestamp_ms)
                    records += 1
                    newest_ms = max(newest_ms, timestamp_ms)
            if len(chunk) >= ARROW_CHUNK_RECORDS:
                yield chunk.take()
            (current,) = consumer.position([TopicPartition(topic, partition)])
            if current.offset > position:
                position = current.offset
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > options.read_timeout_seconds:
                raise SourceError(
                    f"reading {topic}:{partition} offsets {kafka_range.start}..{end}: no "
                    f"progress for {options.read_timeout_seconds:g} s at offset {position}; is "
                    f"the broker reachable ({options.bootstrap_servers})?"
                )
        read = RangeRead(
            topic, partition, kafka_range.start, end, records, newest_ms if newest_ms >= 0 else None
        )
        note_read(options.plan_path, read)
        if len(chunk):
            yield chunk.take()
    finally:
        consumer.close()


class _Chunk:
    """Column buffers for the next Arrow record batch of one partition."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, key: Any, value: Any, timestamp_ms: int) -> None:
        self.offsets.append(offset)
        self.keys.append(key)
        self.values.append(value)
        self.timestamps.append(timestamp_ms * 1000)

    def take(self) -> "pyarrow.RecordBatch":
        import pyarrow as pa

        count = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.topic] * count, pa.string()),
                pa.array([self.partition] * count, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
            ],
            schema=_arrow_schema(),
        )
        self._reset()
        return batch


def _arrow_schema() -> "pyarrow.Schema":
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()),
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )


class KafkaDataSource(DataSource):
    """The "smoothscale-kafka" streaming source (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: "StructType") -> DataSourceStreamReader:  # noqa: ARG002
        """The reader; `schema` is always SCHEMA (the source has no user-given schema)."""
        return KafkaStreamReader(SourceOptions.parse(self.options))


def register_source(spark: "SparkSession") -> None:
    """Make `spark.readStream.format("smoothscale-kafka")` available in this session."""
    spark.dataSource.register(KafkaDataSource)
