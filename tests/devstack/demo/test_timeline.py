"""The checker reads each task's ownership timeline back from the changelog the instances
wrote: who was active when, overlaps of two owners, and processing pauses."""

import json
from pathlib import Path

from confluent_kafka import Producer

from devstack.demo.timeline import read_timelines, write_timelines
from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime.changelog import ChangelogRecord, closer, data, marker
from smoothscale.runtime.writer import Writer
from tests.runtime.kafka_helpers import unique

A, B = Writer(1, 0, 7), Writer(2, 1, 3)


def write(kafka: EmbeddedKafka, topic: str, records: list[tuple[float, ChangelogRecord]]) -> None:
    """`records` on partition 1 of `topic`, each with its time (seconds)."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for at, record in records:
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            partition=1,
            timestamp=round(at * 1000),
            headers=record.headers(),
        )
    producer.flush(10)


def batch(writer: Writer, number: int) -> ChangelogRecord:
    return closer(writer, number, {"clicks": number}, None)


def test_a_hand_over_reads_as_two_stints_and_one_pause(embedded_kafka: EmbeddedKafka) -> None:
    topic = unique("changelog")
    embedded_kafka.create_topic(topic, 2)
    write(
        embedded_kafka,
        topic,
        [
            (100.0, marker(A, "pod-a")),
            (101.0, data(A, 1, "alice", 1, None)),
            (101.0, batch(A, 1)),
            (102.0, batch(A, 2)),
            (103.0, batch(A, 3)),
            (104.5, marker(B, "pod-b")),
            (105.0, batch(B, 1)),
            (106.0, batch(B, 2)),
        ],
    )

    timelines = read_timelines(embedded_kafka.bootstrap_servers, topic, 2)

    assert timelines[0].stints == []
    task = timelines[1]
    assert [(s.instance, s.epoch, s.batches) for s in task.stints] == [
        ("pod-a", 1, 3),
        ("pod-b", 2, 2),
    ]
    assert task.stints[0].started == 100.0
    assert (task.stints[0].first_commit, task.stints[0].last_commit) == (101.0, 103.0)
    assert task.overlaps == []
    assert task.longest_pause(100.5, 106.0) == 2.0
    assert task.longest_pause(105.25, 106.5) == 0.75


def test_a_batch_committed_after_a_newer_owners_marker_is_an_overlap(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    topic = unique("changelog")
    embedded_kafka.create_topic(topic, 2)
    write(
        embedded_kafka,
        topic,
        [
            (100.0, marker(A, "pod-a")),
            (101.0, batch(A, 1)),
            (102.0, marker(B, "pod-b")),
            (102.5, batch(B, 1)),
            (103.0, batch(A, 2)),  # the old owner still processing: a zombie
            (103.5, batch(B, 2)),
        ],
    )

    task = read_timelines(embedded_kafka.bootstrap_servers, topic, 2)[1]

    assert [(o.stale, o.newer, o.at) for o in task.overlaps] == [("pod-a", "pod-b", 103.0)]
    assert task.commits == [101.0, 102.5, 103.5], "a zombie's commit is no progress"
    write_timelines(tmp_path / "timeline.json", {1: task})
    written = json.loads((tmp_path / "timeline.json").read_text())
    assert written["tasks"][0]["overlaps"][0]["stale"] == "pod-a"


def test_records_that_are_not_smoothscales_are_counted_not_fatal(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic = unique("changelog")
    embedded_kafka.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    producer.produce(topic, key=b"stranger", value=b"1", partition=1)
    producer.flush(10)
    write(embedded_kafka, topic, [(100.0, marker(A, "pod-a")), (101.0, batch(A, 1))])

    task = read_timelines(embedded_kafka.bootstrap_servers, topic, 2)[1]

    assert task.unreadable == 1
    assert task.commits == [101.0]
