"""The test bed's Kafka: librdkafka's mock brokers (`embedded`), the front that makes them
answer like a real cluster (`front`: topic administration, producer fencing, compaction) and
the process that serves both with an HTTP control endpoint (`control`, `smoothscale dev
kafka`)."""
