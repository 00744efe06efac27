"""Fixtures for the PySpark layer of the runtime: one Spark session per test module."""

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import StreamingQuery

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from smoothscale.runtime.spark import local_session


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """A local session for the whole test module (a session takes seconds to start)."""
    session = local_session(f"test-{uuid.uuid4().hex[:6]}")
    yield session
    session.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(
    kafka: EmbeddedKafka | KafkaFront,
    topic: str,
    records: list[tuple[int, bytes | None, bytes | None]],
) -> None:
    """Produce (partition, key, value) records and wait until all are acknowledged."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    try:
        for partition, key, value in records:
            producer.produce(topic, partition=partition, key=key, value=value)
        assert producer.flush(10) == 0, "records were not acknowledged within 10 s"
    finally:
        producer.close()


class CollectingStream:
    """A streaming query over the smoothscale Kafka source whose foreachBatch keeps the rows.

    `on_batch` (optional) runs on each micro-batch instead of collecting it; its return value
    is kept as the batch's result.
    """

    def __init__(
        self,
        spark: SparkSession,
        kafka: EmbeddedKafka | KafkaFront,
        topics: list[str],
        plan_path: Path,
        checkpoint: Path,
        options: dict[str, str] | None = None,
        on_batch: Callable[[DataFrame], Any] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.batches: list[Any] = []
        self._on_batch = on_batch
        reader = (
            spark.readStream.format("smoothscale-kafka")
            .option("bootstrap.servers", kafka.bootstrap_servers)
            .option("topics", ",".join(topics))
            .option("plan.path", str(plan_path))
        )
        for name, value in (options or {}).items():
            reader = reader.option(name, value)
        self.query: StreamingQuery = (
            reader.load()
            .writeStream.foreachBatch(self._collect)
            .trigger(processingTime="100 milliseconds")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    def _collect(self, batch: DataFrame, batch_id: int) -> None:
        result = self._on_batch(batch) if self._on_batch else batch.collect()
        with self._lock:
            self.batches.append(result)

    def drain(self) -> list[Any]:
        """Wait until every record the plan allows is processed; return the new batches."""
        self.query.processAllAvailable()
        with self._lock:
            batches, self.batches = self.batches, []
        return batches

    def drain_rows(self) -> list[Row]:
        return [row for batch in self.drain() for row in batch]

    def stop(self) -> None:
        self.query.stop()


def positions(rows: list[Row]) -> set[tuple[int, int]]:
    return {(row["partition"], row["offset"]) for row in rows}


def offsets(partition: int, start: int, end: int) -> set[tuple[int, int]]:
    return {(partition, offset) for offset in range(start, end)}
