"""How long Kafka keeps a compacted topic's tombstones (`delete.retention.ms`), as the brokers say.

A reader that stops in a compacted topic and reads on later sees every delete written meanwhile
only while their tombstones are kept: the log cleaner removes a tombstone `delete.retention.ms`
after it cleaned the segment holding it (Kafka's default: one day). An instance reuses a task's
local store only well within that (docs/runtime.md, State: one RocksDB per task).
"""

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

DELETE_RETENTION = "delete.retention.ms"


def tombstone_retention_seconds(
    client_config: Mapping[str, str], topics: Iterable[str], timeout: float = 10.0
) -> dict[str, float]:
    """Per topic, its `delete.retention.ms` in seconds (the topic's own, else the broker's
    default, as DescribeConfigs answers). Raises KafkaException when the brokers cannot say (no
    DescribeConfigs right on the topic, a topic missing), TimeoutError when they do not answer
    within `timeout` seconds."""
    admin = AdminClient(dict(client_config))
    resources = [ConfigResource("topic", topic) for topic in topics]
    if not resources:
        return {}
    retention: dict[str, float] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
        configs = future.result(timeout)
        entry = configs.get(DELETE_RETENTION)
        if entry is None or entry.value is None:
            raise KafkaException(f"topic {resource.name}: the brokers gave no {DELETE_RETENTION}")
        retention[resource.name] = int(entry.value) / 1000
    return retention
