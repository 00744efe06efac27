"""A worker without Spark, for the scenarios whose subject is the hand-over protocol.

`smoothscale worker` runs an instance's micro-batches in a PySpark streaming query; starting its
driver takes 10 to 100 s of the 2 cores here, per pod, and a protocol scenario (the operator
killed, Kafka down, API faults, two operators, a drain timing out, ...) starts many pods while
Spark is not what it tests. This worker is `smoothscale worker` with one part swapped: the same
`run_worker` (metrics and probes, the real `Instance` with its assignments, restores, warm-ups,
transactions, reports, the SIGTERM drain), with micro-batches computed here, in Python, by
`PythonBatches`, for the running count's aggregate only (examples.pipelines.running_count:
one update per key, its count of records), folded by the pipeline's own `apply`.

A scenario runs it by putting `path_variable()` in the StreamingApp's spec.env (a directory
first on the pods' PATH): the process kubelet then starts this worker for the pods'
`smoothscale worker`, as a cluster would start whatever the image's `smoothscale` is. Never
shipped: the image runs Spark.
"""

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from smoothscale.runtime.config import WorkerConfig, load_worker_config
from smoothscale.runtime.instance import BatchInput, Instance
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.pipeline import Pipeline
from smoothscale.runtime.processor import PreparedProcessor
from smoothscale.runtime.worker import run_worker

log = logging.getLogger(__name__)

RUNNING_COUNT = "examples.pipelines.running_count"
"""The module of the one aggregate these batches compute, `count_per_user`: one update per
(partition, user), its count of records. A pipeline with that aggregate and an `apply` of its
own (a test's: one that hangs on a key) runs too."""
IDLE_SECONDS = 0.05
"""How often the batch thread looks for a newly active task while it waits for the trigger."""
READ_TIMEOUT_SECONDS = 5.0
"""Longest one batch reads before it commits what it has."""


def read_batch(
    consumer: Consumer, read_from: dict[tuple[str, int], int], limit: int, key_field: str = "user"
) -> BatchInput:
    """One micro-batch of the running count over the partitions of `read_from`, each from its
    offset, up to its end as a read_committed reader sees it (at most `limit` records): per
    task, its records' count per key (the JSON value's `key_field`: the pipeline's aggregate),
    the offsets after them and the newest record's timestamp. `consumer` reads read_committed
    with partition EOF events (`batch_reader`)."""
    batch = BatchInput()
    if not read_from:
        return batch
    consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in read_from.items()])
    open_partitions = set(read_from)
    counts: dict[int, dict[str, int]] = {}
    deadline = time.monotonic() + READ_TIMEOUT_SECONDS
    while open_partitions and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.05):
            where = (message.topic() or "", message.partition() or 0)
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(where)
                    continue
                raise RuntimeError(f"reading {where}: {error}")
            if where not in open_partitions:
                continue
            topic, task = where
            user = json.loads(message.value() or b"")[key_field]
            per_user = counts.setdefault(task, {})
            per_user[user] = per_user.get(user, 0) + 1
            batch.ends.setdefault(task, {})[topic] = (message.offset() or 0) + 1
            batch.counts[task] = batch.counts.get(task, 0) + 1
            _kind, millis = message.timestamp()
            if millis > 0:
                batch.newest[task] = max(millis / 1000, batch.newest.get(task, 0.0))
            if batch.ends[task][topic] - read_from[where] >= limit:
                open_partitions.discard(where)
    for task, per_user in counts.items():
        batch.updates[task] = sorted(per_user.items())
    return batch


def batch_reader(config: WorkerConfig, group: str) -> Consumer:
    """A consumer for `read_batch`: the app's Kafka settings, read_committed, EOF events."""
    return Consumer(
        {
            **config.kafka_config,
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


class PythonBatches:
    """The micro-batches of an instance, on a thread of their own, as the Spark query runs
    them: one batch per trigger interval, or at once when a task becomes active, each ended by
    the instance's `commit_behind`; the warm-up sample is marked run (there is nothing to warm
    without Spark)."""

    def __init__(
        self, config: WorkerConfig, instance: Instance, key_field: str, metrics: InstanceMetrics
    ):
        self.config, self.instance, self.metrics = config, instance, metrics
        self.key_field = key_field
        self._consumer = batch_reader(config, f"{config.app_id}.{config.instance_id}.batches")
        self._stopping = threading.Event()
        self._failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="python-batches", daemon=True)

    @classmethod
    def start(
        cls,
        config: WorkerConfig,
        instance: Instance,
        pipeline: Pipeline | PreparedProcessor,
        metrics: InstanceMetrics,
    ) -> "PythonBatches":
        if not isinstance(pipeline, Pipeline) or (
            pipeline.aggregate.__module__,
            pipeline.aggregate.__name__,
        ) != (RUNNING_COUNT, "count_per_user"):
            raise ValueError(
                f"the protocol worker computes only the running count's aggregate "
                f"({RUNNING_COUNT}.count_per_user), not that of {config.pipeline}: run that "
                "pipeline with `smoothscale worker`"
            )
        engine = cls(config, instance, pipeline.key_column, metrics)
        engine._thread.start()
        return engine

    def failure(self) -> str | None:
        return self._failure

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._consumer.close()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                tasks = self._batch()
                self._wait_for_trigger(started, tasks)
        except Exception as error:
            log.exception("a micro-batch failed")
            self._failure = f"a micro-batch failed: {error!r}"

    def _batch(self) -> set[tuple[str, int]]:
        """One micro-batch; the partitions it read."""
        instance = self.instance
        started = instance.batch_began()
        batch, read_from = None, {}
        try:
            if not instance.stopping:
                if instance.warm_up_from():
                    instance.warmed.set()
                read_from = instance.read_from()
                if read_from:
                    limit = self.config.max_records_per_partition
                    batch = read_batch(self._consumer, read_from, limit, self.key_field)
                    batch.read_from = dict(read_from)
                    instance.last_read = time.monotonic()
        except BaseException:
            instance.batch_ended(started)
            raise
        instance.commit_behind(batch, started)
        return set(read_from)

    def _wait_for_trigger(self, started: float, tasks: set[tuple[str, int]]) -> None:
        """Until the trigger interval since the batch's start, or a task newly active."""
        while not self._stopping.wait(IDLE_SECONDS):
            if time.monotonic() - started >= self.config.trigger_interval:
                return
            if set(self.instance.read_from()) - tasks:
                return


def path_variable(workdir: Path) -> dict[str, str]:
    """The env entry of a StreamingApp (spec.env) whose pods, on the local stack, run this
    worker: PATH with a directory under `workdir` first, whose `smoothscale` runs it with this
    Python (and `smoothscale worker` only), as a cluster runs whatever the image's
    `smoothscale` is."""
    directory = workdir / "protocol-worker-image"
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / "smoothscale"
    program.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "from devstack.protocolworker import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    program.chmod(0o755)
    return {"name": "PATH", "value": f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"}


def main(argv: list[str]) -> int:
    """`smoothscale worker [--config PATH] [--log-level LEVEL]`, as the pods run it."""
    parser = argparse.ArgumentParser(prog="smoothscale (protocol worker)")
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--config", metavar="PATH")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log.info("the protocol worker: micro-batches in Python, without Spark")
    return run_worker(load_worker_config(args.config), PythonBatches.start)
