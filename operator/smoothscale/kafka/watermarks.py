"""A partition's watermarks, also for partitions added since the client last read its topic.

librdkafka answers `get_watermark_offsets` for a partition its cached metadata does not have
with "Local: Unknown partition", and refreshes a topic's metadata only every
topic.metadata.refresh.interval.ms (5 minutes by default). Input partitions added while an app
runs are new tasks, with new changelog partitions: a long-lived client asks for their
metadata once, then again for the watermarks.
"""

from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition


class WatermarkClient(Protocol):
    """What `watermarks` asks of a client: a confluent-kafka Consumer, or the restore's own."""

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...


def watermarks(
    client: WatermarkClient, topic: str, partition: int, timeout: float
) -> tuple[int, int]:
    """(low, high) of `partition` of `topic`, from its leader, within `timeout` seconds."""
    try:
        return _query(client, topic, partition, timeout)
    except KafkaException as error:
        if error.args[0].code() != KafkaError._UNKNOWN_PARTITION:
            raise
        client.list_topics(topic, timeout=timeout)
        return _query(client, topic, partition, timeout)


def _query(client: WatermarkClient, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    low, high = client.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
    return low, high
