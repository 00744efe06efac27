"""The report channel: reports round-trip through committed offsets, and lag follows from them."""

from dataclasses import replace

from confluent_kafka import Producer

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka import names
from smoothscale.kafka.progress import (
    InputPositionCommitter,
    ProgressCommitter,
    ProgressReader,
    ReportedRole,
    TaskReport,
)
from tests.runtime.kafka_helpers import unique


def test_reports_round_trip_and_lag_is_end_minus_restore_position(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    stores = {"counts": names.changelog_topic(app, "counts")}
    embedded_kafka.create_topic(stores["counts"], 3)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    for task, records in ((0, 100), (1, 40)):
        for i in range(records):
            producer.produce(stores["counts"], key=b"k%d" % i, value=b"1", partition=task)
    producer.flush(10)

    warmup = TaskReport(0, ReportedRole.WARMUP, epoch=3, generation=7, positions={"counts": 70})
    released = TaskReport(1, ReportedRole.RELEASED, epoch=2, generation=7, positions={"counts": 40})
    active = TaskReport(
        0,
        ReportedRole.ACTIVE,
        epoch=3,
        generation=7,
        positions={"counts": 100},
        input_positions={"clicks": 4242},
    )
    for instance, reports in (("pod-a", [warmup, released]), ("pod-b", [active])):
        committer = ProgressCommitter(embedded_kafka.bootstrap_servers, app, instance, stores)
        committer.commit(reports)
        committer.close()

    reader = ProgressReader(embedded_kafka.bootstrap_servers, app, stores)
    try:
        progress = reader.read(["pod-a", "pod-b", "pod-never-reported"], tasks=3)
    finally:
        reader.close()
    assert set(progress) == {("pod-a", 0), ("pod-a", 1), ("pod-b", 0)}
    assert progress[("pod-a", 0)].report == replace(warmup, beat=1)
    assert progress[("pod-a", 0)].lag == 30
    assert progress[("pod-a", 1)].report.role is ReportedRole.RELEASED
    assert progress[("pod-a", 1)].lag == 0
    assert progress[("pod-b", 0)].lag == 0
    assert progress[("pod-b", 0)].report == replace(active, beat=1), "input positions round-trip"


def test_a_newer_report_replaces_the_older_one(embedded_kafka: EmbeddedKafka) -> None:
    app = unique("app")
    stores = {"counts": names.changelog_topic(app, "counts")}
    embedded_kafka.create_topic(stores["counts"], 1)
    committer = ProgressCommitter(embedded_kafka.bootstrap_servers, app, "pod-a", stores)
    committer.commit([TaskReport(0, ReportedRole.ACTIVE, 1, 1, {"counts": 5})])
    committer.commit([TaskReport(0, ReportedRole.RELEASED, 1, 2, {"counts": 9})])
    committer.close()
    reader = ProgressReader(embedded_kafka.bootstrap_servers, app, stores)
    try:
        assert reader.reports("pod-a", tasks=1) == {
            0: TaskReport(0, ReportedRole.RELEASED, 1, 2, {"counts": 9}, beat=2)
        }
    finally:
        reader.close()


def test_input_positions_are_committed_in_the_app_group(embedded_kafka: EmbeddedKafka) -> None:
    app = unique("app")
    topic = unique("clicks")
    embedded_kafka.create_topic(topic, 2)
    committer = InputPositionCommitter(embedded_kafka.bootstrap_servers, app)
    try:
        assert committer.committed([topic], 1) == {}
        committer.commit({(topic, 1): 17})
        assert committer.committed([topic], 1) == {topic: 17}
        assert committer.committed([topic], 0) == {}
    finally:
        committer.close()
