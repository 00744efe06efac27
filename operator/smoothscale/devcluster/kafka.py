"""`smoothscale dev kafka`: an embedded Kafka cluster in its own process.

The clients that use it (the operator, the instances) run in other processes and reach it over
loopback TCP, as they would reach a real cluster. The process runs until SIGINT or SIGTERM.
"""

import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

from smoothscale.kafka.embedded import EmbeddedKafka


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int


def parse_topic_spec(text: str) -> TopicSpec:
    """`NAME:PARTITIONS` (or `NAME`, one partition) -> TopicSpec."""
    name, separator, count = text.rpartition(":")
    if not separator:
        name, count = text, "1"
    if not name:
        raise ValueError(f"topic {text!r} has no name: write NAME:PARTITIONS, e.g. input:8")
    try:
        partitions = int(count)
    except ValueError:
        raise ValueError(
            f"topic {text!r}: {count!r} is not a partition count: write NAME:PARTITIONS, "
            "e.g. input:8"
        ) from None
    if partitions < 1:
        raise ValueError(f"topic {text!r}: a topic needs at least 1 partition")
    return TopicSpec(name, partitions)


def write_ready_file(path: str, bootstrap_servers: str) -> None:
    """Atomically write what a supervisor needs to know once the cluster is up."""
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump({"bootstrap_servers": bootstrap_servers, "pid": os.getpid()}, handle)
    os.replace(temporary, path)


def serve_kafka(
    brokers: int,
    topics: Sequence[TopicSpec],
    ready_file: str | None = None,
    out: TextIO = sys.stdout,
) -> None:
    """Run a cluster with `topics` until SIGINT/SIGTERM, then stop it cleanly."""
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {
        signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with EmbeddedKafka(brokers) as kafka:
            for topic in topics:
                kafka.create_topic(topic.name, topic.partitions)
            print(f"embedded Kafka: {brokers} broker(s) at {kafka.bootstrap_servers}", file=out)
            for topic in topics:
                print(f"  topic {topic.name}: {topic.partitions} partition(s)", file=out)
            print(f"export KAFKA_BOOTSTRAP={kafka.bootstrap_servers}", file=out, flush=True)
            if ready_file is not None:
                write_ready_file(ready_file, kafka.bootstrap_servers)
            while not stop.wait(timeout=0.5):
                pass
            print("embedded Kafka: stopping", file=out, flush=True)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
