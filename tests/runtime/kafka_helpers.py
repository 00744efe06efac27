"""Small helpers for tests that talk to the embedded Kafka."""

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def read_committed(
    bootstrap_servers: str, topic: str, partitions: int, timeout: float = 10.0
) -> list[Message]:
    """Every record of `topic` a read_committed reader sees, read up to the current end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": unique("reader"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        watermarks = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            for p in range(partitions)
        }
        ends = {p: high for p, (low, high) in watermarks.items() if high > low}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        messages: list[Message] = []
        deadline = time.monotonic() + timeout

        def done() -> bool:
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            return all(tp.offset >= ends[tp.partition] for tp in positions)

        while not done():
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            messages.extend(m for m in consumer.consume(500, 0.2) if m.error() is None)
        return messages
    finally:
        consumer.close()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.2)
