"""Throughput of the smoothscale Kafka source vs a plain confluent-kafka consumer, same broker.

Run: .venv/bin/python benchmarks/source.py [--records 200000] [--partitions 8]

Produces `records` JSON values of about 50 bytes over `partitions` partitions of the embedded
Kafka, then measures:
1. raw: one confluent-kafka consumer assigned every partition, reading to the end;
2. source, cold: a streaming query over the source whose foreachBatch counts per key (the
   first batch pays for Spark's Python workers);
3. source, warm: the same query reading as many new records again, its workers started.
Prints records/s for each. Not a test: numbers depend on the machine and its load.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime.source import write_plan
from smoothscale.runtime.spark import local_session

TOPIC = "benchmark-input"


def produce(bootstrap_servers: str, records: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "log_level": 3})
    for i in range(records):
        value = json.dumps({"user": f"user-{i % 1000:04d}", "n": i}).encode()
        while True:
            try:
                producer.produce(TOPIC, partition=i % partitions, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)
    producer.close()


def raw_consume(bootstrap_servers: str, partitions: int) -> tuple[int, float]:
    """(records read, seconds) for one consumer reading every partition to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "benchmark-raw",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 3,
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
            for p in range(partitions)
        }
        began = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
        read = 0
        while True:
            read += sum(1 for m in consumer.consume(10_000, timeout=0.5) if m.error() is None)
            done = consumer.position([TopicPartition(TOPIC, p) for p in range(partitions)])
            if all(tp.offset >= ends[tp.partition] for tp in done):
                return read, time.perf_counter() - began
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()

    spark = local_session("benchmark-source")
    counted: list[int] = []

    def count_per_user(batch: DataFrame, _batch_id: int) -> None:
        users = batch.select(F.get_json_object(F.col("value").cast("string"), "$.user").alias("u"))
        counted.append(sum(row["count"] for row in users.groupBy("u").count().collect()))

    with EmbeddedKafka(brokers=1) as kafka, tempfile.TemporaryDirectory() as workdir:
        kafka.create_topic(TOPIC, args.partitions)
        produce(kafka.bootstrap_servers, args.records, args.partitions)
        raw_records, raw_seconds = raw_consume(kafka.bootstrap_servers, args.partitions)

        plan = Path(workdir) / "plan.json"
        write_plan(plan, {(TOPIC, p): 0 for p in range(args.partitions)}, version=1)
        began = time.perf_counter()
        query = (
            spark.readStream.format("smoothscale-kafka")
            .option("bootstrap.servers", kafka.bootstrap_servers)
            .option("topics", TOPIC)
            .option("plan.path", str(plan))
            .load()
            .writeStream.foreachBatch(count_per_user)
            .option("checkpointLocation", str(Path(workdir) / "checkpoint"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        try:
            query.processAllAvailable()
            cold_seconds = time.perf_counter() - began
            cold_records = sum(counted)
            # Hold the query off the topic while the second round is produced, then hand it
            # every partition again from where the first round ended.
            write_plan(plan, {}, version=2)
            query.processAllAvailable()
            produce(kafka.bootstrap_servers, args.records, args.partitions)
            first_round_ends = {
                (TOPIC, p): len(range(p, args.records, args.partitions))
                for p in range(args.partitions)
            }
            counted.clear()
            began = time.perf_counter()
            write_plan(plan, first_round_ends, version=3)
            query.processAllAvailable()
            warm_seconds = time.perf_counter() - began
            warm_records = sum(counted)
            warm_batches = len(counted)
        finally:
            query.stop()
    spark.stop()

    print(f"records per run: {args.records} over {args.partitions} partitions (~50 B values)")
    print(f"raw confluent-kafka consumer: {raw_records / raw_seconds:>10,.0f} records/s")
    print(f"source, cold (first batch):   {cold_records / cold_seconds:>10,.0f} records/s")
    print(
        f"source, warm:                 {warm_records / warm_seconds:>10,.0f} records/s "
        f"({warm_records} records in {warm_batches} batch(es), {warm_seconds:.2f} s)"
    )


if __name__ == "__main__":
    main()
