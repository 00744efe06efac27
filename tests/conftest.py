"""Fixtures shared by the test suite."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from devstack.stack import LocalStack, StackInfo

REPOSITORY = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long scenarios first: the gate runs tests on several workers (scripts/test), and
    the longest first lets them run side by side while the short tests fill in at the end,
    instead of one long scenario running alone while the others idle. Longest by what a test
    declares: a longer timeout of its own first, then Spark scenarios, then other slow ones,
    each group in collection order."""

    def length(item: pytest.Item) -> tuple[bool, float, bool]:
        timeout = item.get_closest_marker("timeout")
        declared = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
        slow = item.get_closest_marker("slow") is not None
        spark = item.get_closest_marker("spark") is not None
        return (not slow, -declared, not spark)

    items.sort(key=length)


@pytest.fixture(scope="session")
def embedded_kafka() -> Iterator[EmbeddedKafka]:
    """One embedded Kafka cluster (3 brokers) for the whole session: create uniquely named topics,
    and inject no faults here (use `kafka_cluster`)."""
    with EmbeddedKafka(brokers=3) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def kafka_front() -> Iterator[KafkaFront]:
    """An embedded Kafka (3 brokers) behind the Kafka front, for tests that administer topics
    (AdminClient create_topics, describe_configs) or need a compacted partition (`compact`).
    Clients use `kafka_front.bootstrap_servers`; create uniquely named topics."""
    with EmbeddedKafka(brokers=3) as kafka, KafkaFront(kafka) as front:
        yield front


@pytest.fixture
def kafka_cluster() -> Iterator[EmbeddedKafka]:
    """A fresh embedded Kafka cluster (3 brokers) for one test, free to take brokers down or
    inject request errors."""
    with EmbeddedKafka(brokers=3) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    """The local control plane, as `smoothscale dev up` runs it: API server (with the CRDs of
    crds/ installed), process kubelet and a 3-broker embedded Kafka, each in its own process.
    Yields kubeconfig, api_url and kafka_bootstrap; create uniquely named objects and topics."""
    state_dir = tmp_path_factory.mktemp("local-cluster")
    with LocalStack(state_dir, crd_dir=REPOSITORY / "crds", shutdown_grace_period=0) as stack:
        assert stack.info is not None
        yield stack.info
