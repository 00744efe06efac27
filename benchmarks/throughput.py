"""Throughput against plain Spark, and restore against a raw consumer:
`.venv/bin/python benchmarks/throughput.py`.

Not a test: numbers depend on the machine and its load. One run, one embedded broker, the same
input, one JVM at a time:

1. smoothscale: one `smoothscale worker` process (the pod's command) owning every task of a
   running count (examples/pipelines/running_count.py) works through the input: per task and
   micro-batch one Kafka transaction with the changelog, the input position and the outputs.
2. plain Spark: what users run instead, the same running count as a plain PySpark Structured
   Streaming query with Spark's own state (the RocksDB state store provider, its checkpoint on
   local disk): `groupBy(user).count()` in update mode, each micro-batch's new totals written to
   Kafka by a producer in foreachBatch (at least once). It reads the same topic through the same
   source (the pip PySpark has no Kafka connector).
   Both read at most --batch records per partition per micro-batch and trigger as soon as the
   last batch is done. Throughput counts the records of every micro-batch after the first (the
   first pays for starting Spark's Python workers) over the time from the end of the first to
   the end of the last. Both outputs are checked: each user's last total equals its records.
   --rounds pairs of 1 and 2, each pair in the other order than the last, each query in a
   process and JVM of its own, into topics and state of its own round: the ratio is the median
   of the pairs' ratios (one pair moved by a tenth within minutes on a shared host).
3. restore: the changelog smoothscale wrote in its first round, read to its end by a raw
   confluent-kafka consumer (read_committed, every partition), and restored into fresh local
   stores by a warm-up's restore loop (the instance's `RestoreLoop`; the stores opened first
   and timed apart, as the consumer is created first): --repeat runs each, in turn, their
   medians.

`--processor` runs the same comparison for a StatefulProcessor pipeline instead (issue 21): the
running count as a processor (examples/processors/running_count.py) in the worker, against
the same processor in plain Spark's `transformWithStateInPandas` (RocksDB state), and writes
throughput-processor.json and throughput-processor-table.md.

Writes throughput.json and throughput-table.md (docs/benchmarks/ by default) and prints the
table; docs/benchmarks/throughput.md holds the latest results.
"""

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from confluent_kafka import Consumer, Producer, TopicPartition
from restoring import restore_seconds

from devstack.kafka.embedded import EmbeddedKafka
from devstack.stack import free_port
from smoothscale.kafka import names
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import QUEUE_BACKOFF_MS
from smoothscale.runtime.source import write_plan
from smoothscale.runtime.spark import QUERY_START_ATTEMPTS, local_session, started_too_late
from smoothscale.tasks import TaskRole

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

ROOT = Path(__file__).resolve().parents[1]
APP = "throughput"
INPUT, OUTPUT, PLAIN_OUTPUT = "throughput-input", "throughput-output", "plain-spark-output"
STORE = "counts"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
POLL_SECONDS = 0.1
RAW_WAIT_SECONDS = 0.01
RAW_CHUNK = 250
"""Messages the raw consumer takes a consume: its fastest. Each is a confluent-kafka Message,
and the garbage collector's work on the ones a consume holds grows with the chunk: 923,165
records/s at 250 against 558,671 at 10,000 (medians of 7), 975,000 against 819,000 at 2,000
(medians of 4). The restore reads its own chunk (READ_CHUNK), which suits it."""
T = TypeVar("T")
BATCHES_METRIC = "smoothscale_batch_duration_seconds_count"
PROCESSED_METRIC = "smoothscale_records_processed_total{"


def produce_input(
    bootstrap_servers: str, records: int, users: int, partitions: int
) -> Counter[str]:
    """`records` running-count inputs, keyed by user, a user's records all in one partition;
    returns how many each user got."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "log_level": 3})
    counts: Counter[str] = Counter()
    for i in range(records):
        number = (i * 7919) % users
        user = f"user-{number:06d}"
        counts[user] += 1
        while True:
            try:
                producer.produce(
                    INPUT,
                    key=user.encode(),
                    value=json.dumps({"user": user}).encode(),
                    partition=number % partitions,
                )
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(60):
        raise RuntimeError("the input was not delivered within 60 s")
    return counts


def last_totals(bootstrap_servers: str, topic: str, partitions: int) -> dict[str, int]:
    """Each key's last total in `topic`, as a read_committed reader sees it: the value itself
    (a running count's) or its `count` (the running-count processor's output row)."""
    consumer = _consumer(bootstrap_servers)
    totals: dict[str, int] = {}
    try:
        for message in _read_to_end(consumer, topic, partitions):
            value = json.loads(message.value() or b"0")
            total = value["count"] if isinstance(value, dict) else value
            totals[(message.key() or b"").decode()] = total
    finally:
        consumer.close()
    return totals


def counted(users: "DataFrame") -> "DataFrame":
    """The plain running count: Spark's own aggregation."""
    return users.groupBy("user").count()


def counted_by_processor(users: "DataFrame") -> "DataFrame":
    """The plain running count as the StatefulProcessor smoothscale runs with --processor."""
    from examples.processors.running_count import OUTPUT_SCHEMA, RunningCount

    return users.groupBy("user").transformWithStateInPandas(
        statefulProcessor=RunningCount(),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Update",
        timeMode="None",
    )


def _consumer(bootstrap_servers: str) -> Consumer:
    """A read_committed consumer. Its fetcher waits as briefly as the restore's once its local
    queue is full (`fetch.queue.backoff.ms`, docs/benchmarks/throughput.md): at librdkafka's
    default of a second, about half the raw reads of the changelog stopped for 0.8-0.9 s just
    before its end, and measured that wait rather than the reading."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "throughput-benchmark",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.queue.backoff.ms": QUEUE_BACKOFF_MS,
            "log_level": 3,
        }
    )


def _ends(consumer: Consumer, topic: str, partitions: int) -> dict[int, int]:
    """Per partition of `topic`, its end now."""
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(partitions)
    }


def _consumed(
    consumer: Consumer, topic: str, ends: dict[int, int], count: int, wait: float
) -> Iterator[list[Any]]:
    """Each consume's records of `topic` from its start to `ends`, up to `count` a consume, each
    consume waiting up to `wait` seconds for its `count` (so the last one waits that long for
    records that never come)."""
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    while True:
        yield [m for m in consumer.consume(count, timeout=wait) if m.error() is None]
        positions = consumer.position([TopicPartition(topic, p) for p in ends])
        if all(tp.offset >= ends[tp.partition] for tp in positions):
            return


def _read_to_end(consumer: Consumer, topic: str, partitions: int) -> list[Any]:
    """Every record of `topic`, reading up to 10,000 at a time, each read waiting up to 0.5 s."""
    ends = _ends(consumer, topic, partitions)
    return [m for read in _consumed(consumer, topic, ends, 10_000, 0.5) for m in read]


def rate_after_first(batches: list[tuple[float, int]]) -> dict[str, float]:
    """From (end time, records) per micro-batch with input: the records of every batch after
    the first over the time from the end of the first to the end of the last."""
    if len(batches) < 2:
        raise RuntimeError(
            f"{len(batches)} micro-batch(es) with input: too few to measure; "
            "give more --records or a smaller --batch"
        )
    (first_end, _), rest = batches[0], batches[1:]
    records = sum(count for _end, count in rest)
    seconds = rest[-1][0] - first_end
    return {
        "records_per_second": round(records / seconds),
        "records_measured": records,
        "seconds_measured": round(seconds, 2),
        "micro_batches": len(batches),
    }


def run_smoothscale(config: WorkerConfig, workdir: Path, records: int) -> list[tuple[float, int]]:
    """Run the worker until it has processed every record; (end time, records) per micro-batch,
    from its metrics endpoint polled every POLL_SECONDS (batches that end between two polls
    count as one)."""
    path = workdir / "worker.json"
    path.write_text(config.model_dump_json())
    log = (workdir / "worker.log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "smoothscale.cli", "worker", "--config", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    batches: list[tuple[float, int]] = []
    seen_batches = seen_records = 0
    try:
        deadline = time.monotonic() + 900
        while seen_records < records:
            if worker.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / "worker.log").read_text(errors="replace").splitlines()[-40:]
                raise RuntimeError(
                    f"the worker stopped (exit code {worker.returncode}) or stalled; the end of "
                    "its log (its directory goes with the run):\n" + "\n".join(tail)
                )
            done, processed = _scrape(config.metrics_port)
            if done > seen_batches and processed > seen_records:
                batches.append((time.monotonic(), processed - seen_records))
                seen_batches, seen_records = done, processed
            time.sleep(POLL_SECONDS)
        # As the operator drains a pod before deleting it: revoked, it releases its tasks at
        # once and stops on SIGTERM without waiting for hand-overs (half its shutdown_timeout,
        # 12.5 s, which a run of the gate's smoke size spent idle, a quarter of its time).
        operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
        operator.write(config.instance_id, Assignment(generation=2))
        operator.close()
    finally:
        worker.terminate()
        worker.wait(60)
        log.close()
    return batches


def _scrape(port: int) -> tuple[int, int]:
    """(micro-batches done, records processed) from the worker's metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0, 0
    found = Counter[str]()
    for line in text.splitlines():
        for metric in (BATCHES_METRIC, PROCESSED_METRIC):
            if line.startswith(metric):
                found[metric] += int(float(line.rsplit(" ", 1)[1]))
    return found[BATCHES_METRIC], found[PROCESSED_METRIC]


def run_plain_spark(
    bootstrap_servers: str,
    workdir: Path,
    partitions: int,
    batch: int,
    *,
    count: Callable[["DataFrame"], "DataFrame"],
    output: str,
) -> list[tuple[float, int]]:
    """The plain query (`count` of the users, a user and count column per row) over every
    partition until it has read all input, its totals written to `output`; (end time, records)
    per micro-batch with input, from Spark's own progress reports. Run in a process of its own
    (`in_own_process`): a second session in the same process would find the last one's JVM
    warm, which no worker does."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    spark = local_session("plain-spark")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5, "log_level": 3})

    def write_totals(totals: DataFrame, _batch_id: int) -> None:
        for row in totals.collect():
            producer.produce(output, key=row["user"].encode(), value=str(row["count"]))
        if producer.flush(60):
            raise RuntimeError("the totals were not delivered within 60 s")

    plan = workdir / "plain-plan.json"
    write_plan(plan, {(INPUT, p): 0 for p in range(partitions)}, version=1)

    def start(attempt: int) -> "StreamingQuery":
        users = (
            spark.readStream.format("smoothscale-kafka")
            .option("bootstrap.servers", bootstrap_servers)
            .option("topics", INPUT)
            .option("plan.path", str(plan))
            .option("max.records.per.partition", str(batch))
            .load()
            .select(F.from_json(F.col("value").cast("string"), "user STRING").user.alias("user"))
        )
        return (
            count(users)
            .writeStream.outputMode("update")
            .foreachBatch(write_totals)
            .option("checkpointLocation", str(workdir / f"plain-checkpoint-{attempt}"))
            .trigger(processingTime="0 seconds")
            .start()
        )

    try:
        # Started again, as the worker starts its own, when its reader connected back too late.
        for attempt in range(1, QUERY_START_ATTEMPTS + 1):
            query = start(attempt)
            try:
                query.processAllAvailable()
                break
            except Exception:
                if attempt == QUERY_START_ATTEMPTS or not started_too_late(query):
                    raise
                print("plain Spark: its reader connected back too late: started again")
            finally:
                query.stop()
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        spark.stop()
    return [
        (
            datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            + p["durationMs"]["triggerExecution"] / 1000,
            p["numInputRows"],
        )
        for p in progress
    ]


def raw_read_seconds(bootstrap_servers: str, topic: str, partitions: int) -> tuple[int, float]:
    """(records, seconds) for one raw consumer reading every partition of `topic` to its end,
    counting the records and keeping none, RAW_CHUNK at a time.

    Its reads wait at most RAW_WAIT_SECONDS for records, so that it stops when it reaches the
    end rather than after a timeout: with the 0.5 s of the other reads here, a raw read of the
    benchmark's changelog (147,272 records) took 0.15-0.2 s and then waited for one to three
    0.5 s timeouts at the end, and the raw rate counted that wait. Until the seventh session of
    2026-11-27 it also kept every message it read (the garbage collector then walked them all,
    again and again): 349,018 against 442,861 records/s counting only (medians of 7)."""
    consumer = _consumer(bootstrap_servers)
    try:
        ends = _ends(consumer, topic, partitions)
        began = time.perf_counter()
        read = sum(
            len(chunk) for chunk in _consumed(consumer, topic, ends, RAW_CHUNK, RAW_WAIT_SECONDS)
        )
        return read, time.perf_counter() - began
    finally:
        consumer.close()


def in_own_process(function: Callable[..., T], *arguments: Any, **keywords: Any) -> T:
    """`function(*arguments, **keywords)` in a fresh Python process (spawned: nothing of this
    one's JVM or threads goes with it)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *arguments, **keywords).result()


class Round(NamedTuple):
    """One pair of runs over the same input, into topics and state of the round's own."""

    number: int
    kafka: EmbeddedKafka
    workdir: Path
    args: argparse.Namespace
    pipeline: str
    count: Callable[["DataFrame"], "DataFrame"]
    expected: Counter[str]

    def smoothscale(self) -> tuple[dict[str, Any], WorkerConfig]:
        """The worker through the input as a new app of its own; its rate and its config."""
        args, bootstrap_servers = self.args, self.kafka.bootstrap_servers
        app = f"{APP}-{self.number}"
        workdir = self.workdir / f"smoothscale-{self.number}"
        workdir.mkdir()
        config = WorkerConfig(
            app_id=app,
            instance_id=f"{app}-0",
            bootstrap_servers=bootstrap_servers,
            input_topics=[INPUT],
            output_topic=f"{OUTPUT}-{self.number}",
            stores={STORE: None},
            pipeline=self.pipeline,
            trigger_interval=0,
            state_dir=workdir / "state",
            metrics_port=free_port(),
            max_records_per_partition=args.batch,
        )
        for topic in (
            config.output_topic,
            config.dead_letters(),
            *config.changelog_topics().values(),
        ):
            self.kafka.create_topic(topic, args.partitions)
        self.kafka.create_topic(names.assignments_topic(app), 1)
        operator = AssignmentWriter(bootstrap_servers, app)
        active = TaskAssignment(role=TaskRole.ACTIVE, epoch=1)
        operator.write(
            config.instance_id,
            Assignment(generation=1, tasks=dict.fromkeys(range(args.partitions), active)),
        )
        operator.close()
        print(f"round {self.number}, smoothscale worker: processing the input", flush=True)
        rate = rate_after_first(run_smoothscale(config, workdir, args.records))
        totals = last_totals(bootstrap_servers, config.output_topic, args.partitions)
        return {**rate, "exact": totals == self.expected}, config

    def plain_spark(self) -> dict[str, Any]:
        """The plain query through the input, in a process of its own; its rate."""
        args, bootstrap_servers = self.args, self.kafka.bootstrap_servers
        output = f"{PLAIN_OUTPUT}-{self.number}"
        workdir = self.workdir / f"plain-{self.number}"
        workdir.mkdir()
        self.kafka.create_topic(output, args.partitions)
        print(f"round {self.number}, plain Spark: processing the same input", flush=True)
        batches = in_own_process(
            run_plain_spark,
            bootstrap_servers,
            workdir,
            args.partitions,
            args.batch,
            count=self.count,
            output=output,
        )
        totals = last_totals(bootstrap_servers, output, args.partitions)
        return {**rate_after_first(batches), "exact": totals == self.expected}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One query's runs: the median rate, the fewest batches and records measured, all exact."""
    return {
        "records_per_second": round(statistics.median(r["records_per_second"] for r in runs)),
        "records_measured": min(r["records_measured"] for r in runs),
        "micro_batches": min(r["micro_batches"] for r in runs),
        "exact": all(r["exact"] for r in runs),
    }


def _rate(run: dict[str, Any]) -> str:
    return (
        f"{run['records_per_second']:,} ({run['micro_batches']} batches, "
        f"{run['seconds_measured']} s)"
    )


def markdown(results: dict[str, Any]) -> str:
    smoothscale, plain = results["smoothscale"], results["plain_spark"]
    restore = results["restore"]
    rows = [
        "| round (first) | smoothscale records/s | plain Spark (RocksDB state) records/s | ratio |",
        "| --- | --- | --- | --- |",
        *(
            f"| {n} ({r['first']}) | {_rate(r['smoothscale'])} | {_rate(r['plain_spark'])} "
            f"| {r['ratio']} |"
            for n, r in enumerate(results["rounds"], 1)
        ),
        f"| median | {smoothscale['records_per_second']:,} | {plain['records_per_second']:,} "
        f"| **{results['throughput_ratio']}** |",
        "",
        f"smoothscale / plain Spark, the median of the rounds' ratios: "
        f"**{results['throughput_ratio']}** (goal at least {results['throughput_goal']}). "
        f"Every user's last total right: smoothscale {smoothscale['exact']}, plain Spark "
        f"{plain['exact']} (every round).",
        "",
        f"| changelog of {restore['changelog_records']:,} records | records/s |",
        "| --- | --- |",
        f"| raw confluent-kafka consumer | {restore['raw_records_per_second']:,} |",
        f"| warm-up restore loop | {restore['restore_records_per_second']:,} |",
        "",
        f"The restore took {restore['restore_seconds']} s; opening its "
        f"{results['settings']['partitions (tasks)']} fresh stores before it, "
        f"{restore['stores_open_seconds']} s (not in the rate).",
        "",
        f"restore / raw: **{results['restore_ratio']}** (goal at least 0.8).",
        "",
        "Settings: " + ", ".join(f"{k} {v}" for k, v in results["settings"].items()) + ".",
        "",
    ]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=240_000)
    parser.add_argument("--users", type=int, default=24_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch", type=int, default=5_000, help="records/partition/batch")
    parser.add_argument("--rounds", type=int, default=5, help="pairs of throughput runs")
    parser.add_argument("--repeat", type=int, default=3, help="restore measurements, each way")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument(
        "--processor",
        action="store_true",
        help="the running count as a StatefulProcessor, against transformWithStateInPandas",
    )
    args = parser.parse_args()
    pipeline, count, goal, name = (
        ("examples.processors.running_count:pipeline", counted_by_processor, 0.8, "-processor")
        if args.processor
        else ("examples.pipelines.running_count:pipeline", counted, 0.9, "")
    )

    settings = {
        "input records": f"{args.records:,}",
        "users": f"{args.users:,}",
        "partitions (tasks)": args.partitions,
        "records per partition per micro-batch": f"{args.batch:,}",
        "trigger": "as soon as the last batch is done",
        "pipeline": pipeline,
        "Spark": "local[2], 2 shuffle partitions",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    with EmbeddedKafka(brokers=1) as kafka, tempfile.TemporaryDirectory() as tmp:
        kafka.create_topic(INPUT, args.partitions)
        expected = produce_input(kafka.bootstrap_servers, args.records, args.users, args.partitions)
        rounds: list[dict[str, Any]] = []
        configs: list[WorkerConfig] = []
        for number in range(1, args.rounds + 1):
            pair = Round(number, kafka, Path(tmp), args, pipeline, count, expected)
            first = "smoothscale" if number % 2 else "plain Spark"  # drift falls on both alike
            if first == "plain Spark":
                plain = pair.plain_spark()
            smoothscale, config = pair.smoothscale()
            if first == "smoothscale":
                plain = pair.plain_spark()
            configs.append(config)
            rounds.append(
                {
                    "first": first,
                    "smoothscale": smoothscale,
                    "plain_spark": plain,
                    "ratio": round(
                        smoothscale["records_per_second"] / plain["records_per_second"], 2
                    ),
                }
            )

        print("restore: the changelog smoothscale wrote in its first round", flush=True)
        config = configs[0]
        changelog = config.changelog_topics()[STORE]
        raw, restores = [], []
        for _ in range(args.repeat):  # in turn: the machine's load falls on both alike
            raw.append(raw_read_seconds(kafka.bootstrap_servers, changelog, args.partitions))
            restores.append(restore_seconds(config, STORE, list(range(args.partitions))))
        changelog_records = raw[0][0]
        raw_seconds = statistics.median(seconds for _records, seconds in raw)
        restore = statistics.median(each.seconds for each in restores)
        opening = statistics.median(each.open_seconds for each in restores)

    results = {
        "settings": settings,
        "rounds": rounds,
        "smoothscale": summary([r["smoothscale"] for r in rounds]),
        "plain_spark": summary([r["plain_spark"] for r in rounds]),
        "throughput_ratio": round(statistics.median(r["ratio"] for r in rounds), 2),
        "throughput_goal": goal,
        "restore": {
            "changelog_records": changelog_records,
            "raw_records_per_second": round(changelog_records / raw_seconds),
            "restore_records_per_second": round(changelog_records / restore),
            "restore_seconds": round(restore, 3),
            "stores_open_seconds": round(opening, 3),
        },
        "restore_ratio": round(raw_seconds / restore, 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"throughput{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (args.out / f"throughput{name}-table.md").write_text(table)
    print(table)
    exact = results["smoothscale"]["exact"] and results["plain_spark"]["exact"]
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
