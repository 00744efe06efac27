"""`smoothscale worker`: the pod's process, one instance of a StreamingApp.

    config -> metrics server -> instance (assignments, restore loop) -> Spark session
           -> streaming query: smoothscale-kafka source -> foreachBatch(MicroBatch) -> instance
           -> main thread: instance.tick() between batches, until SIGTERM

The query reads exactly the active tasks' input partitions (the instance rewrites the source's
plan file whenever its active set changes). Each micro-batch, `MicroBatch` keeps only rows at or
after each task's input position, decodes them (bad rows become dead letters), runs the
pipeline's aggregation in Spark, collects the per-key updates to the driver and hands them to
the instance, which commits one transaction per task. For a processor pipeline (a pyspark
StatefulProcessor) it collects the decoded rows instead, per task, and the instance runs the
processor over each task's rows; the main thread also runs, at each trigger, the batches
without input that a processor's timers, TTL or watermark call for. The Spark checkpoint is not
a source of truth (input positions live in each task's state), so every run gets a fresh one.
"""

import faulthandler
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, cast

from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.decode import JsonInput, classify, sql_literal
from smoothscale.runtime.instance import TICK_LOCK_SECONDS, BatchInput, DeadLetterSender, Instance
from smoothscale.runtime.metrics import InstanceMetrics, start_http_server
from smoothscale.runtime.pipeline import Pipeline, load_pipeline
from smoothscale.runtime.processor import PreparedProcessor
from smoothscale.runtime.source import BATCH_INTERVAL_OPTION, RangeRead, batch_reads
from smoothscale.runtime.spark import QUERY_START_ATTEMPTS, local_session, started_too_late

if TYPE_CHECKING:
    import pandas as pd
    from confluent_kafka import Producer
    from pyspark.sql import DataFrame, Observation, Row, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

Update = tuple[int, str, Any]
"""One row of a pipeline's aggregate: (partition, key, update)."""

TICK_SECONDS = 0.1
"""How often the main thread looks for a new assignment between batches."""
KEEP_WARM_SECONDS = 30.0
"""Longest an instance reads no input before it reads its warm-up sample again (Spark stops
Python workers idle for a minute)."""
GIL_SWITCH_SECONDS = 0.0005
"""The worker process's GIL switch interval (Python's default is 5 ms). A batch's commit runs
in Python on a thread of its own (about 50 ms of CPU a task at the throughput benchmark's
sizes) while Spark's thread builds and runs the next batch through many short calls into the
JVM, and after each it waits for the GIL: up to the interval while the committer holds it. At
the default, building a batch's first two frames took 30-120 ms and a batch 1.17-1.27 s; at
0.5 ms, 26-63 ms and 1.04-1.13 s, and throughput against plain Spark went from 0.86-0.87 to
0.88-0.95 (docs/benchmarks/throughput.md, Fourteenth session)."""
WARM_UP_TIMEOUT_SECONDS = 120.0
"""Longest a new instance waits for its warm-up batch before it says it is ready anyway."""
WARM_UP_ROUNDS = 6
"""At most this many runs of the pipeline over the warm-up sample in a new instance's first
warm-up batch (see MicroBatch._warm)."""
WARM_UP_FALLING = 0.9
"""A warm-up round counts as faster than the fastest before it below this fraction of it."""


class MicroBatch:
    """The foreachBatch function: one micro-batch from Spark rows to the instance's commit."""

    def __init__(
        self, instance: Instance, pipeline: Pipeline | PreparedProcessor, metrics: InstanceMetrics
    ):
        self.instance = instance
        self.pipeline = pipeline
        self.input: JsonInput = (
            pipeline.json_input if isinstance(pipeline, PreparedProcessor) else pipeline
        )
        self.metrics = metrics
        self._warmed_once = False

    def __call__(self, batch: "DataFrame", batch_id: int) -> None:
        # Timed for the stall watch from here to the end of its commit, which runs behind the
        # next batch's reading (Instance.commit_behind).
        started = self.instance.batch_began()
        try:
            collected = None if self.instance.stopping else self._run(batch, batch_id)
        except BaseException:
            self.instance.batch_ended(started)
            raise
        self.instance.commit_behind(collected, started)

    def _run(self, batch: "DataFrame", batch_id: int) -> BatchInput | None:
        """The batch itself: the warm-up sample if it is due, then the active tasks' rows,
        ready to commit (None: no task has input in it)."""
        warm_up = self.instance.warm_up_from()
        if warm_up:
            self._warm(batch, warm_up)
        read_from = self.instance.read_from()
        if not read_from:
            return None
        classified = classify(batch.where(_at_or_after(read_from)), self.input)
        try:
            collected = self._collect(classified, batch.columns, read_from)
        finally:
            self.instance.last_read = time.monotonic()
        if collected is None:
            return None
        collected.read_from = dict(read_from)
        self.metrics.count_dead_letters(
            str(row["reason"]) for rows in collected.dead_letters.values() for row in rows
        )
        log.debug("batch %d: %s records", batch_id, sum(collected.counts.values()))
        return collected

    def _warm(self, batch: "DataFrame", sample: Mapping[tuple[str, int], int]) -> None:
        """Run the whole path of a real batch over the warm-up sample, the same Spark jobs in
        the same order, and drop the result (see Instance.warm_up). In the instance's first
        warm-up, again and again until a run is no longer faster (at most WARM_UP_ROUNDS): a
        young JVM compiles the batch's code while it runs it, and a new pod's first real batches
        were measured at about twice an old pod's after a single warm-up run. Later warm-ups
        (KeepWarm) only keep the Python workers alive: one run. A sample that fails to aggregate
        says nothing about the tasks: the instance is ready anyway, and a real batch will show
        the error where it matters."""
        rows = batch.where(_at_or_after(sample))
        if rows.isEmpty():
            return  # planned before the sample was: the next batch reads it
        rounds = 1 if self._warmed_once else WARM_UP_ROUNDS
        fastest = math.inf
        for run in range(1, rounds + 1):
            started = time.monotonic()
            classified = classify(rows, self.input)
            try:
                collected = self._collect(classified, batch.columns, sample)
            except Exception:
                log.warning(
                    "the warm-up batch failed; the instance is ready without it", exc_info=True
                )
                break
            took = time.monotonic() - started
            records = 0 if collected is None else sum(collected.counts.values())
            log.info(
                "warm-up run %d: the pipeline ran over %d sampled records in %.2f s",
                run,
                records,
                took,
            )
            if took >= WARM_UP_FALLING * fastest:
                break
            fastest = took
        self._warmed_once = True
        self.instance.last_read = time.monotonic()
        self.instance.warmed.set()

    def _collect(
        self,
        classified: "DataFrame",
        columns: list[str],
        read_from: Mapping[tuple[str, int], int],
    ) -> BatchInput | None:
        """The batch's updates (a processor pipeline: its decoded rows), dead letters and input
        ranges per task, from its classified rows (`columns`: the source's; `read_from`: the
        positions the rows were filtered at). None when no task has input in the batch.

        One Spark job reads the batch: the pipeline's aggregation (or the processor's rows),
        which also counts the bad records (`observe`). Each task's range (where its input ends,
        its records, the newest one's time) is what the source noted it read
        (`source.batch_reads`); a second job over the rows computes it only when the source's
        notes cannot say, and bad records are fetched only when some were counted. Nothing is
        persisted: a job that reads the batch again (rare) reads it from Kafka again.

        A frame is built only where it is used: each costs the driver a plan analysis in the
        JVM, 5-20 ms on a quiet machine and several times that beside the commits, and the frames
        of the bad records and of the records as read are used only when some are bad or the
        pipeline raised."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from smoothscale.runtime.decode import bad_rows, good_rows, reason

        observation = Observation()
        observed = classified.observe(observation, F.count(reason(classified)).alias("bad"))
        good = good_rows(observed, self.input)

        def read() -> "DataFrame":
            """The batch's records as the source read them."""
            return classified.select(*columns)

        collected = BatchInput()
        pipeline = self.pipeline
        poisoned: list[Row] = []
        if isinstance(pipeline, PreparedProcessor):
            collected.rows = _rows_per_task(pipeline, good)
            collected.records_at = lambda task, offsets: _records_at(read(), task, offsets)
        else:
            updates, poisoned = self._aggregate(pipeline, read, good)
            collected.records_of = lambda task, key: self._records_of(pipeline, read(), task, key)
            for task, key, update in updates:
                collected.updates.setdefault(task, []).append((key, update))
        bad_count = _observed_count(observation)
        if bad_count is None or not _ranges_from_reads(
            collected, batch_reads(self.instance.plan_path), read_from
        ):
            bad_count = _ranges_by_spark(collected, classified)
        if not collected.ends:
            return None
        # Bad records are rare: a Spark job fetches them only when some were counted (a small
        # batch costs Spark mostly per job, docs/runtime.md, A micro-batch).
        dead = [*(bad_rows(observed).collect() if bad_count else []), *poisoned]
        for row in dead:
            collected.dead_letters.setdefault(int(row["partition"]), []).append(row)
        return collected

    def _aggregate(
        self, pipeline: Pipeline, read: Callable[[], "DataFrame"], good: "DataFrame"
    ) -> "tuple[list[Update], list[Row]]":
        """The pipeline's updates for the batch, and the records it raised on (as dead letters;
        `read` gives the batch's records as read).

        When `aggregate` raises in its Python code, the records that make it raise are found
        by halving the batch (a few small Spark jobs, only then), sent to the dead-letter topic,
        and the batch is aggregated without them. If no record alone makes it raise, the error
        is not the records' and the batch fails, as before.
        """
        from pyspark.errors import PythonException

        from smoothscale.runtime.decode import decode, pipeline_error

        try:
            return self._updates(pipeline, good), []
        except PythonException as error:
            rows = read()
            records = rows.collect()
            poisoned = self._poisoned(pipeline, rows, records)
            if not poisoned:
                raise
            log.warning(
                "the pipeline raised on %d of %d records of the batch; they go to the "
                "dead-letter topic: %s",
                len(poisoned),
                len(records),
                error,
            )
            spark = rows.sparkSession
            left = [r for r in records if (r["partition"], r["offset"]) not in poisoned]
            rest, _ = decode(spark.createDataFrame(left, rows.schema), pipeline)
            dead = [
                pipeline_error(r, poisoned[(r["partition"], r["offset"])])
                for r in records
                if (r["partition"], r["offset"]) in poisoned
            ]
            return self._updates(pipeline, rest), dead

    @staticmethod
    def _updates(pipeline: Pipeline, good: "DataFrame") -> "list[Update]":
        """The pipeline's updates, collected as Arrow columns: a Row object per update cost the
        driver about 5 us each (0.1 s for a batch's 24,000 keys). A struct or a map arrives as
        a dict, an array as a list."""
        table = pipeline.aggregate(good).select("partition", "key", "update").toArrow()
        return list(
            zip(
                table.column("partition").to_pylist(),
                table.column("key").to_pylist(),
                table.column("update").to_pylist(maps_as_pydicts="lossy"),
                strict=True,
            )
        )

    def _poisoned(
        self, pipeline: Pipeline, rows: "DataFrame", records: "list[Row]"
    ) -> dict[tuple[int, int], BaseException]:
        """The records on which `aggregate` raises on its own, by (partition, offset), with
        the error: the batch halved until each failing part is one record."""
        from pyspark.errors import PythonException

        from smoothscale.runtime.decode import decode

        spark = rows.sparkSession
        found: dict[tuple[int, int], BaseException] = {}
        parts = [records]
        for _probe in range(PROBE_BUDGET):
            if not parts:
                return found
            part = parts.pop()
            good, _ = decode(spark.createDataFrame(part, rows.schema), pipeline)
            try:
                self._updates(pipeline, good)
            except PythonException as error:
                if len(part) == 1:
                    found[(part[0]["partition"], part[0]["offset"])] = error
                    if len(found) > POISONED_AT_MOST:
                        return {}
                else:
                    middle = len(part) // 2
                    parts += [part[:middle], part[middle:]]
        return {} if parts else found  # out of probes: too many to be about single records

    @staticmethod
    def _records_of(pipeline: Pipeline, rows: "DataFrame", task: int, key: str) -> "list[Row]":
        """The batch's records of `key` in partition `task`, as the source read them."""
        from pyspark.sql import functions as F

        from smoothscale.runtime.decode import decode

        good, _ = decode(rows.where(F.col("partition") == task), pipeline)
        column = pipeline.key_column
        offsets = [
            row["offset"] for row in good.where(F.col(column) == key).select("offset").collect()
        ]
        return _records_at(rows, task, offsets)


def _rows_per_task(prepared: PreparedProcessor, good: "DataFrame") -> "dict[int, pd.DataFrame]":
    """A processor pipeline's input: per task, its decoded good records (the value schema's
    fields and their offset), in input (offset) order, in one Spark job."""
    frame = cast("pd.DataFrame", good.orderBy("partition", "offset").toPandas())
    columns = [*prepared.value_schema.names, "offset"]
    return {
        int(task): part[columns].reset_index(drop=True)
        for task, part in frame.groupby("partition", sort=True)
    }


def _records_at(rows: "DataFrame", task: int, offsets: list[int]) -> "list[Row]":
    """The batch's records of partition `task` at `offsets`, as the source read them."""
    from pyspark.sql import functions as F

    if not offsets:
        return []
    return rows.where((F.col("partition") == task) & F.col("offset").isin(offsets)).collect()


def _observed_count(observation: "Observation") -> int | None:
    """The count a job observed over the whole batch, or None when no job did: when the
    pipeline raised and the batch was aggregated again without the poisoned records, or when
    Spark ran the job without the observed rows (it then completes the observation with an
    empty row). Only with the count has the source read every range of the batch.
    (`Observation.get` would wait for ever for a job that never comes, and fails on an empty
    row: the JVM's observation is read instead.)"""
    jvm_observation = observation._jo  # PySpark's own handle on it
    if jvm_observation is None or not jvm_observation.future().isCompleted():
        return None
    outcome = jvm_observation.future().value().get()
    if not outcome.isSuccess() or outcome.get().size() != 1:
        return None
    return int(outcome.get().getLong(0))


def _ranges_from_reads(
    collected: BatchInput,
    reads: Mapping[tuple[str, int], RangeRead] | None,
    read_from: Mapping[tuple[str, int], int],
) -> bool:
    """Fill in each task's input range from what the source noted it read; False (nothing
    filled in) when the notes cannot say: there are none, a range of the batch was not noted
    as read, or one begins before the task's input position (its rows below it were filtered
    out, so the source's count is not the task's)."""
    if reads is None:
        return False
    ends: dict[int, dict[str, int]] = {}
    counts: dict[int, int] = {}
    newest: dict[int, float] = {}
    for (topic, partition), position in read_from.items():
        read = reads.get((topic, partition))
        if read is None or read.end <= position:
            continue  # nothing of the partition at or after its position in this batch
        if read.records is None or read.start < position:
            return False
        if read.records == 0:
            continue  # only offsets without records (transaction markers): nothing to commit
        ends.setdefault(partition, {})[topic] = read.end
        counts[partition] = counts.get(partition, 0) + read.records
        if read.newest_ms is not None:
            newest[partition] = max(read.newest_ms / 1000, newest.get(partition, 0.0))
    collected.ends, collected.counts, collected.newest = ends, counts, newest
    return True


def _ranges_by_spark(collected: BatchInput, classified: "DataFrame") -> int:
    """Fill in each task's input range with a Spark job over the classified rows (where its
    input ends: after its last row); returns how many rows are bad."""
    from pyspark.sql import functions as F

    from smoothscale.runtime.decode import reason

    ranges = (
        classified.groupBy("topic", "partition")
        .agg(
            F.max("offset").alias("last"),
            F.count("*").alias("records"),
            F.max("timestamp").alias("newest"),
            F.count(reason(classified)).alias("bad"),
        )
        .collect()
    )
    for row in ranges:
        task = int(row["partition"])
        collected.ends.setdefault(task, {})[row["topic"]] = int(row["last"]) + 1
        collected.counts[task] = collected.counts.get(task, 0) + int(row["records"])
        if row["newest"] is not None:
            newest = row["newest"].timestamp()
            collected.newest[task] = max(newest, collected.newest.get(task, newest))
    return sum(int(row["bad"]) for row in ranges)


PROBE_BUDGET = 100
"""Spark jobs spent at most on finding the records the pipeline raises on, per batch: enough
for a few such records in a batch of 10,000 (about 2 log2(n) jobs each); more, and the error
is not about single records, so the batch fails as it did."""
POISONED_AT_MOST = 8
"""Records found raising on their own beyond which the error is taken for the pipeline's (the
batch fails) without spending the rest of PROBE_BUDGET: a pipeline that raises on every record
is told in about 20 small jobs, not 100."""


def _at_or_after(read_from: Mapping[tuple[str, int], int]) -> str:
    """Rows of the active tasks' partitions at or after each one's input position (SQL)."""
    conditions = [
        f"(topic = {sql_literal(topic)} AND partition = {partition} AND offset >= {offset})"
        for (topic, partition), offset in sorted(read_from.items())
    ]
    return " OR ".join(conditions) or "false"


def dead_letter_sender(topic: str) -> DeadLetterSender:
    """Queues a task's bad rows to `topic` on the task's producer, inside its transaction."""

    def send(producer: "Producer", rows: "list[Row]") -> int:
        from smoothscale.runtime.decode import send_dead_letters

        return send_dead_letters(rows, producer, topic)

    return send


class Engine(Protocol):
    """What runs an instance's micro-batches: each begins with the instance's
    `batch_began()`, reads its active tasks' input from `read_from()` (and the warm-up
    sample of `warm_up_from()`), and ends in `commit_behind`. The worker's Spark query is the
    one that ships; the local test bed runs protocol scenarios with one without Spark."""

    def failure(self) -> str | None:
        """Why the engine stopped running batches; None while it runs them."""

    def stop(self) -> None:
        """Stop running batches and free what the engine holds."""


LISTEN_ADDRESS_ENV = "SMOOTHSCALE_LISTEN_ADDRESS"
"""The address the instance's metrics and probe endpoints listen on, when set (in spec.env):
the pod's IP from the downward API (fieldRef status.podIP) serves them there only."""
ALL_ADDRESSES = "0.0.0.0"

EXIT_BATCH_UNFINISHED = 3
"""The worker's exit code when it stopped with a micro-batch still running (a hung pipeline)."""

EngineStarter = Callable[
    [WorkerConfig, Instance, Pipeline | PreparedProcessor, InstanceMetrics], Engine
]


def run_worker(config: WorkerConfig, start_engine: "EngineStarter | None" = None) -> int:
    """Run the instance until SIGTERM (or SIGINT), or until its pod is replaced under its name;
    returns the process exit code. `start_engine` runs its micro-batches (default: the Spark
    streaming query)."""
    pipeline = load_pipeline(config.pipeline)
    metrics = InstanceMetrics()
    server = start_http_server(
        config.metrics_port, metrics, host=os.environ.get(LISTEN_ADDRESS_ENV, ALL_ADDRESSES)
    )
    log.info(
        "instance %s of %s: metrics on port %d", config.instance_id, config.app_id, server.port
    )
    config.state_dir.mkdir(parents=True, exist_ok=True)
    instance = Instance(
        config,
        pipeline,
        metrics,
        config.state_dir / "plan.json",
        dead_letter_sender(config.dead_letters()),
    )
    stop = StopRequest()
    stop.install()
    engine: Engine | None = None
    try:
        instance.start()
        with _ticking(instance):
            engine = (start_engine or SparkQuery.start)(config, instance, pipeline, metrics)
            _warm_up(instance, engine)
        stop.install()  # again: PySpark installs its own SIGINT handler
        metrics.set_ready(True)
        log.info("instance %s ready", config.instance_id)
        keep_warm = KeepWarm(instance)
        triggered = time.monotonic()
        while stop.signal is None and not instance.replaced:
            failure = engine.failure()
            if failure is not None:
                raise RuntimeError(f"the micro-batches stopped: {failure}")
            instance.tick()
            keep_warm.tick()
            if time.monotonic() - triggered >= config.trigger_interval:
                # At each trigger, as Spark plans a batch without data (none comes from the
                # source: it has no new input).
                triggered = time.monotonic()
                instance.run_due_without_input()
            time.sleep(TICK_SECONDS)
        reason = "its pod replaced" if instance.replaced else stop.signal
        log.info("instance %s stopping: %s", config.instance_id, reason)
        if not instance.replaced and instance.stalled_for() is None:
            wait_for_hand_overs(instance, config.shutdown_timeout / 2)
    finally:
        # A stalled instance's tasks have failed over already and its hung micro-batch will
        # not end: waiting for it would only keep the kubelet's restart a grace period away.
        # (Asked before it stops being ready: a stall is watched only while it is.)
        stalled = instance.stalled_for() is not None
        metrics.set_ready(False)
        budget = 0.0 if stalled else config.shutdown_timeout / 2
        released = instance.shutdown(budget)
        if released and engine is not None:
            engine.stop()  # stopping the query waits for the batch in flight: not if it hangs
        server.stop()
    if not released:
        log.error(
            "instance %s: a micro-batch did not finish within %g s: exiting without releasing "
            "tasks (nothing of that batch is committed)",
            config.instance_id,
            budget,
        )
        return EXIT_BATCH_UNFINISHED
    log.info("instance %s stopped", config.instance_id)
    return 0


def wait_for_hand_overs(instance: Instance, window: float) -> None:
    """On SIGTERM, go on processing while the operator hands this instance's active tasks over
    (it drains a pod being deleted or evicted with a grace period as it drains one it scales
    in), for at most `window` seconds; whatever is still held then is released. An instance
    the operator drained before deleting it holds nothing and stops at once."""
    deadline = time.monotonic() + window
    while instance.active_tasks() and time.monotonic() < deadline:
        instance.tick()
        time.sleep(TICK_SECONDS)
    if instance.active_tasks():
        log.info(
            "tasks %s not handed over within %.0f s: releasing them",
            instance.active_tasks(),
            window,
        )


def _warm_up(instance: Instance, engine: Engine) -> None:
    """Before the instance says it is ready: one micro-batch over a sample of recent input."""
    if not instance.warm_up():
        log.info("no input to warm up with: ready cold")
        return
    deadline = time.monotonic() + WARM_UP_TIMEOUT_SECONDS
    while not instance.warmed.wait(TICK_SECONDS):
        if engine.failure() is not None or time.monotonic() > deadline:
            log.warning("no warm-up batch within %s s: ready cold", WARM_UP_TIMEOUT_SECONDS)
            break
    instance.end_warm_up()


class KeepWarm:
    """Keeps the query's Python readers warm while the instance reads no input.

    Spark stops a Python worker that has been idle for a minute (its PythonWorkerFactory), so
    the readers the warm-up batch started go cold again while an instance waits with nothing
    to read: a new pod whose warm-ups take minutes to restore, a standby, an idle input.
    Measured on this machine: a job on two partitions took 2.6 s after 75 s idle, 0.4 s warm.
    Whenever no micro-batch has read input for `idle_seconds`, the warm-up sample is read
    again (Instance.warm_up), and taken out of the plan once a batch has run it, or after
    `idle_seconds` more if none did. It never waits on a micro-batch in flight (a batch that
    hangs would keep the worker's main thread, and with it its reports and SIGTERM, for ever):
    it tries again at its next tick."""

    def __init__(self, instance: Instance, idle_seconds: float = KEEP_WARM_SECONDS) -> None:
        self.instance = instance
        self.idle_seconds = idle_seconds
        self._armed_at: float | None = None
        self._tried_at = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        if self._armed_at is not None:
            done = self.instance.warmed.is_set() or now - self._armed_at > self.idle_seconds
            if done and self.instance.end_warm_up(lock_timeout=TICK_LOCK_SECONDS):
                self._armed_at = None
            return
        idle_since = max(self.instance.last_read, self._tried_at)
        if now - idle_since > self.idle_seconds:
            self._tried_at = now
            if self.instance.warm_up(lock_timeout=TICK_LOCK_SECONDS):
                self._armed_at = now


@contextmanager
def _ticking(instance: Instance) -> Iterator[None]:
    """Tick the instance from a helper thread while the main thread is busy starting Spark
    (10-35 s): warm-ups and standbys restore, take new assignments and report their progress
    from the first second on, which is the point of warming up while the old owner processes.
    Only one thread ticks at a time: the helper stops before the main loop takes over."""
    done = threading.Event()
    failures: list[BaseException] = []

    def tick() -> None:
        try:
            while not done.wait(TICK_SECONDS):
                instance.tick()
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=tick, name="tick-while-spark-starts", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    if failures:
        raise failures[0]


class SparkQuery:
    """The engine that ships: one PySpark streaming query over the instance's active tasks
    (the smoothscale-kafka source, foreachBatch(MicroBatch))."""

    def __init__(
        self, spark: "SparkSession", start_query: "Callable[[str], StreamingQuery]"
    ) -> None:
        self.spark = spark
        self._start_query = start_query
        self.attempts = 1
        self.checkpoint = ""
        self.query = self._fresh_start()

    def _fresh_start(self) -> "StreamingQuery":
        """Start the query on a fresh checkpoint (the last one deleted)."""
        if self.checkpoint:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
        self.checkpoint = tempfile.mkdtemp(prefix="smoothscale-checkpoint-")
        try:
            return self._start_query(self.checkpoint)
        except BaseException:
            shutil.rmtree(self.checkpoint, ignore_errors=True)
            raise

    @classmethod
    def start(
        cls,
        config: WorkerConfig,
        instance: Instance,
        pipeline: Pipeline | PreparedProcessor,
        metrics: InstanceMetrics,
    ) -> "SparkQuery":
        """Start Spark and the query, with a fresh checkpoint (see the module's docstring)."""
        spark = local_session(f"smoothscale-{config.app_id}-{config.instance_id}")
        batch = MicroBatch(instance, pipeline, metrics)

        def start_query(checkpoint: str) -> "StreamingQuery":
            reader = (
                spark.readStream.format("smoothscale-kafka")
                .option("bootstrap.servers", config.bootstrap_servers)
                .option("topics", ",".join(config.input_topics))
                .option("plan.path", str(instance.plan_path))
                .option("max.records.per.partition", str(config.max_records_per_partition))
            )
            if config.trigger_interval > 0:
                # The source paces the batches (see KafkaStreamReader.latestOffset), so that a task
                # taken over starts at once instead of at the next trigger; Spark only polls it.
                reader = reader.option(BATCH_INTERVAL_OPTION, str(config.trigger_interval))
            for name, value in config.kafka_config.items():
                reader = reader.option(f"kafka.{name}", value)
            return (
                reader.load()
                .writeStream.foreachBatch(batch)
                .trigger(processingTime="0 seconds")
                .option("checkpointLocation", checkpoint)
                .start()
            )

        return cls(spark, start_query)

    def failure(self) -> str | None:
        """Why the query stopped, or None while it runs.

        A query that stopped before its first micro-batch because its reader's Python process
        connected back too late (`spark.started_too_late`) is started again, on a fresh
        checkpoint, up to QUERY_START_ATTEMPTS starts: nothing ran yet, so nothing is lost, and
        a pod restart would cost the JVM's start and the restore of every task instead."""
        if self.query.isActive:
            return None
        if started_too_late(self.query) and self.attempts < QUERY_START_ATTEMPTS:
            self.attempts += 1
            log.warning(
                "the streaming query stopped before its first batch: its reader's Python process "
                "connected back too late; starting it again (attempt %d of %d)",
                self.attempts,
                QUERY_START_ATTEMPTS,
            )
            self.query = self._fresh_start()
            return None
        return f"the streaming query: {self.query.exception()}"

    def stop(self) -> None:
        self.query.stop()
        self.spark.stop()
        shutil.rmtree(self.checkpoint, ignore_errors=True)


class StopRequest:
    """SIGTERM (Kubernetes) and SIGINT ask the worker to stop gracefully.

    The handler only records the signal: it runs in the main thread between two bytecodes,
    possibly while that thread holds a lock (an Event's, a logging handler's), so taking any
    lock there can deadlock the process. The main loop polls `signal` instead.
    """

    def __init__(self) -> None:
        self.signal: str | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        # `kill -USR1 <pid>` prints every thread's stack to stderr (what is a stuck worker doing?).
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signal.Signals(signum).name
