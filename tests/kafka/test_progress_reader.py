"""The operator's reading of the report channel: lag from the instance's own view of the
changelog, and reports that do not parse counted and skipped."""

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from smoothscale.kafka import names
from smoothscale.kafka.progress import ProgressCommitter, ProgressReader, ReportedRole, TaskReport
from tests.runtime.kafka_helpers import unique


def _changelog_with(embedded_kafka: EmbeddedKafka, app: str, records: int) -> dict[str, str]:
    stores = {"counts": names.changelog_topic(app, "counts")}
    embedded_kafka.create_topic(stores["counts"], 2)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    for i in range(records):
        producer.produce(stores["counts"], key=b"k%d" % i, value=b"1", partition=0)
    producer.flush(10)
    return stores


def test_a_warmup_that_keeps_pace_with_a_busy_owner_is_judged_on_its_own_view(
    embedded_kafka: EmbeddedKafka,
) -> None:
    # The changelog has grown to 500 since the warm-up measured it at 300 with 290 applied: it
    # is 10 behind what it saw, not 210 behind a target that moved while it reported.
    app = unique("app")
    stores = _changelog_with(embedded_kafka, app, 500)
    keeping_pace = TaskReport(
        0, ReportedRole.WARMUP, 1, 1, positions={"counts": 290}, ends={"counts": 300}
    )
    committer = ProgressCommitter(embedded_kafka.bootstrap_servers, app, "pod-a", stores)
    committer.commit([keeping_pace])
    committer.close()
    reader = ProgressReader(embedded_kafka.bootstrap_servers, app, stores)
    try:
        assert reader.read(["pod-a"], tasks=2)[("pod-a", 0)].lag == 10
    finally:
        reader.close()


def test_every_commit_carries_the_next_beat_so_a_silent_instance_can_be_told(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    stores = _changelog_with(embedded_kafka, app, 10)
    committer = ProgressCommitter(embedded_kafka.bootstrap_servers, app, "pod-a", stores)
    reader = ProgressReader(embedded_kafka.bootstrap_servers, app, stores)
    same = TaskReport(0, ReportedRole.WARMUP, 1, 1, positions={"counts": 10}, ends={"counts": 10})
    try:
        beats = []
        for _ in range(3):
            committer.commit([same])
            beats.append(reader.read(["pod-a"], tasks=2)[("pod-a", 0)].report.beat)
        assert beats == [1, 2, 3], "the same facts, reported again, still beat"
    finally:
        committer.close()
        reader.close()


def test_without_reported_ends_lag_is_against_the_current_end(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    stores = _changelog_with(embedded_kafka, app, 500)
    committer = ProgressCommitter(embedded_kafka.bootstrap_servers, app, "pod-a", stores)
    committer.commit([TaskReport(0, ReportedRole.WARMUP, 1, 1, positions={"counts": 290})])
    committer.close()
    reader = ProgressReader(embedded_kafka.bootstrap_servers, app, stores)
    try:
        assert reader.read(["pod-a"], tasks=2)[("pod-a", 0)].lag == 210
    finally:
        reader.close()


def test_a_report_that_does_not_parse_is_counted_and_skipped(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    stores = _changelog_with(embedded_kafka, app, 10)
    broken = Consumer(
        {
            "bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": names.instance_group(app, "pod-a"),
            "enable.auto.commit": False,
        }
    )
    broken.commit(
        offsets=[
            TopicPartition(stores["counts"], 0, 4, metadata='{"role": "juggling"}'),
            TopicPartition(stores["counts"], 1, 7, metadata="not json"),
        ],
        asynchronous=False,
    )
    broken.close()
    reader = ProgressReader(embedded_kafka.bootstrap_servers, app, stores)
    try:
        assert reader.read(["pod-a"], tasks=2) == {}
        assert reader.unreadable_reports == 2
    finally:
        reader.close()


def test_the_ends_of_partitions_added_since_the_reader_started_are_read(
    kafka_front: KafkaFront,
) -> None:
    """Input partitions added while the app runs: their changelog partitions are added too,
    and the operator's long-lived reader, whose metadata knew fewer, reads their ends."""
    app = unique("app")
    stores = {"counts": names.changelog_topic(app, "counts")}
    admin = AdminClient({"bootstrap.servers": kafka_front.bootstrap_servers})
    admin.create_topics([NewTopic(stores["counts"], 2)])[stores["counts"]].result(10)
    reader = ProgressReader(kafka_front.bootstrap_servers, app, stores)
    try:
        assert reader.end_offsets(2)[0] == {("counts", 0): 0, ("counts", 1): 0}
        admin.create_partitions([NewPartitions(stores["counts"], 3)])[stores["counts"]].result(10)
        producer = Producer({"bootstrap.servers": kafka_front.bootstrap_servers})
        producer.produce(stores["counts"], key=b"k", value=b"1", partition=2)
        producer.flush(10)

        ends, _inputs = reader.end_offsets(3)
    finally:
        reader.close()
    assert ends == {("counts", 0): 0, ("counts", 1): 0, ("counts", 2): 1}
