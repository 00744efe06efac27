"""What the Kafka front costs: produce and consume through it vs directly on the mock brokers.

Run: .venv/bin/python benchmarks/kafkafront.py [--records 200000] [--partitions 8] [--rounds 3]

Each round produces `records` values of 50 bytes over `partitions` partitions of a fresh topic,
once on the mock's bootstrap servers and once on the front's, then reads them back with one
consumer assigned every partition. Prints the seconds of each and the ratio front / direct.
Not a test: numbers depend on the machine and its load (a consumer's first fetch sometimes
waits about 1 s whichever way it connects).
"""

import argparse
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront

VALUE = b"x" * 50


def produce(bootstrap_servers: str, topic: str, records: int, partitions: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5, "log_level": 3})
    started = time.perf_counter()
    for index in range(records):
        while True:
            try:
                producer.produce(topic, VALUE, partition=index % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(60)
    return time.perf_counter() - started


def consume(bootstrap_servers: str, topic: str, records: int, partitions: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "benchmark",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0) for partition in range(partitions)])
    seen = 0
    started = time.perf_counter()
    while seen < records:
        seen += sum(1 for message in consumer.consume(10_000, 1.0) if message.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with EmbeddedKafka(brokers=3) as kafka, KafkaFront(kafka) as front:
        for round_number in range(args.rounds):
            timings = {}
            for way, bootstrap in (
                ("direct", kafka.bootstrap_servers),
                ("front", front.bootstrap_servers),
            ):
                topic = f"benchmark-{way}-{round_number}"
                kafka.create_topic(topic, args.partitions)
                timings[way] = (
                    produce(bootstrap, topic, args.records, args.partitions),
                    consume(bootstrap, topic, args.records, args.partitions),
                )
            (direct_produce, direct_consume), (front_produce, front_consume) = (
                timings["direct"],
                timings["front"],
            )
            print(
                f"round {round_number}: produce {direct_produce:.2f} s direct, "
                f"{front_produce:.2f} s front (x{front_produce / direct_produce:.2f}); consume "
                f"{direct_consume:.2f} s direct, {front_consume:.2f} s front "
                f"(x{front_consume / direct_consume:.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
