"""Watermarks of partitions added to a topic after a client read its metadata: an instance's
long-lived consumers meet them when input partitions are added (new tasks)."""

import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from devstack.kafka.front import KafkaFront
from smoothscale.kafka.watermarks import watermarks


def test_a_client_that_knew_fewer_partitions_reads_the_watermarks_of_a_new_one(
    kafka_front: KafkaFront,
) -> None:
    topic = f"grown-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(10)
    consumer = Consumer({"bootstrap.servers": kafka_front.bootstrap_servers, "group.id": "w"})
    try:
        assert watermarks(consumer, topic, 0, timeout=10) == (0, 0)
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(10)
        producer = Producer({"bootstrap.servers": kafka_front.bootstrap_servers})
        producer.produce(topic, value=b"v", partition=1)
        producer.flush(10)

        assert watermarks(consumer, topic, 1, timeout=10) == (0, 1)
    finally:
        consumer.close()
