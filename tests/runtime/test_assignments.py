"""The assignment channel: an instance sees its newest assignment, and only its own."""

from confluent_kafka import Producer

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka import names
from smoothscale.kafka.assignments import (
    Assignment,
    AssignmentFollower,
    AssignmentWriter,
    TaskAssignment,
    decode_assignment,
    read_assignments,
)
from smoothscale.tasks import TaskRole
from tests.runtime.kafka_helpers import unique


def assignment(generation: int, **tasks: TaskAssignment) -> Assignment:
    return Assignment(generation=generation, tasks={int(t[1:]): a for t, a in tasks.items()})


ACTIVE = TaskAssignment(role=TaskRole.ACTIVE, epoch=4, restore_until={"counts": 1234})
WARMUP = TaskAssignment(role=TaskRole.WARMUP, epoch=3)


def test_the_record_is_the_json_of_the_architecture_doc() -> None:
    record = assignment(7, t0=ACTIVE, t5=WARMUP).to_json()
    assert record == (
        b'{"generation":7,"tasks":{"0":{"role":"active","epoch":4,"restoreUntil":'
        b'{"counts":1234}},"5":{"role":"warmup","epoch":3}}}'
    )
    assert decode_assignment(record) == assignment(7, t0=ACTIVE, t5=WARMUP)
    assert decode_assignment(record).tasks_in(TaskRole.WARMUP) == {5}


def test_a_follower_yields_its_newest_assignment_and_ignores_stale_ones(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    embedded_kafka.create_topic(names.assignments_topic(app), 1)
    writer = AssignmentWriter(embedded_kafka.bootstrap_servers, app)
    writer.write("pod-a", assignment(1, t0=WARMUP))
    writer.write("pod-b", assignment(2, t1=ACTIVE))
    writer.write("pod-a", assignment(3, t0=ACTIVE))
    # A late write from an operator that lost its leadership: an older generation.
    writer.write("pod-a", assignment(2, t0=WARMUP))

    follower = AssignmentFollower(embedded_kafka.bootstrap_servers, app, "pod-a")
    try:
        newest = follower.poll(timeout=5)
        assert newest == assignment(3, t0=ACTIVE)
        assert follower.poll(timeout=0.5) is None, "nothing new: no assignment to apply again"

        writer.write("pod-b", assignment(4, t2=ACTIVE))
        assert follower.poll(timeout=0.5) is None, "another instance's assignment is not ours"

        writer.write("pod-a", assignment(5))
        assert follower.poll(timeout=5) == assignment(5)
    finally:
        follower.close()
        writer.close()


def test_reading_all_assignments_keeps_the_newest_per_instance_and_honours_tombstones(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    embedded_kafka.create_topic(names.assignments_topic(app), 1)
    writer = AssignmentWriter(embedded_kafka.bootstrap_servers, app)
    writer.write("pod-a", assignment(3, t0=ACTIVE))
    writer.write("pod-a", assignment(2, t0=WARMUP))
    writer.write("pod-b", assignment(3, t1=ACTIVE))
    writer.write("pod-c", assignment(1, t2=WARMUP))
    writer.forget("pod-c")
    writer.close()

    current = read_assignments(embedded_kafka.bootstrap_servers, app)
    assert current == {"pod-a": assignment(3, t0=ACTIVE), "pod-b": assignment(3, t1=ACTIVE)}


def test_reading_an_empty_assignments_topic_finds_nothing(embedded_kafka: EmbeddedKafka) -> None:
    app = unique("app")
    embedded_kafka.create_topic(names.assignments_topic(app), 1)
    assert read_assignments(embedded_kafka.bootstrap_servers, app) == {}


def test_fields_a_newer_operator_adds_are_ignored() -> None:
    record = b'{"generation":2,"zone":"a","tasks":{"1":{"role":"warmup","epoch":3,"why":"x"}}}'
    assert decode_assignment(record) == assignment(2, t1=WARMUP)


def test_a_record_that_does_not_decode_is_counted_and_skipped(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    topic = names.assignments_topic(app)
    embedded_kafka.create_topic(topic, 1)
    writer = AssignmentWriter(embedded_kafka.bootstrap_servers, app)
    writer.write("pod-a", assignment(1, t0=WARMUP))
    garbage = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    garbage.produce(topic, key=b"pod-a", value=b'{"generation": "two"')
    garbage.flush(10)
    writer.write("pod-a", assignment(3, t0=ACTIVE))
    writer.close()
    bad: list[int] = []
    follower = AssignmentFollower(
        embedded_kafka.bootstrap_servers, app, "pod-a", on_bad_record=lambda: bad.append(1)
    )
    try:
        assert follower.poll(timeout=5) == assignment(3, t0=ACTIVE)
        assert bad == [1]
    finally:
        follower.close()
    assert read_assignments(embedded_kafka.bootstrap_servers, app) == {
        "pod-a": assignment(3, t0=ACTIVE)
    }
