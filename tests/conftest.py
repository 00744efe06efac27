"""Fixtures shared by the test suite."""

from collections.abc import Iterator

import pytest

from smoothscale.kafka.embedded import EmbeddedKafka


@pytest.fixture(scope="session")
def embedded_kafka() -> Iterator[EmbeddedKafka]:
    """One embedded Kafka cluster (3 brokers) for the whole session: create uniquely named topics,
    and inject no faults here (use `kafka_cluster`)."""
    with EmbeddedKafka(brokers=3) as kafka:
        yield kafka


@pytest.fixture
def kafka_cluster() -> Iterator[EmbeddedKafka]:
    """A fresh embedded Kafka cluster (3 brokers) for one test, free to take brokers down or
    inject request errors."""
    with EmbeddedKafka(brokers=3) as kafka:
        yield kafka
