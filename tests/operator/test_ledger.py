"""The operator's memory survives it: the ledger's codec, its record in the assignments topic,
and the rebuild from whatever copies of it survived."""

import json

import pytest

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka import names
from smoothscale.kafka.assignments import (
    Assignment,
    AssignmentWriter,
    TaskAssignment,
    read_assignments,
)
from smoothscale.kafka.progress import ReportedRole, TaskProgress, TaskReport
from smoothscale.operator.handover import HandOver, Ledger, Ownership
from smoothscale.operator.ledger import LedgerDecodeError, LedgerRecord, decode, encode, rebuild
from smoothscale.tasks import TaskRole
from tests.runtime.kafka_helpers import unique

MID_HAND_OVER = Ledger(
    generation=7,
    tasks={
        0: Ownership(epoch=3, active="pod-a", restore_until={"counts": 120}),
        1: Ownership(epoch=2, handover=HandOver("pod-a", "pod-b")),
    },
    assignments={
        "pod-a": Assignment(
            generation=7,
            tasks={0: TaskAssignment(role=TaskRole.ACTIVE, epoch=3, restoreUntil={"counts": 120})},
        ),
        "pod-b": Assignment(generation=6, tasks={1: TaskAssignment(role=TaskRole.WARMUP, epoch=2)}),
    },
    joined={"pod-a": 1, "pod-b": 5},
)


def _report(
    instance: str, task: int, role: ReportedRole, epoch: int, generation: int
) -> TaskProgress:
    return TaskProgress(instance, TaskReport(task, role, epoch, generation, {"counts": 99}), 0)


def test_the_ledger_round_trips_through_its_json() -> None:
    assert decode(encode(MID_HAND_OVER)) == MID_HAND_OVER


def test_fields_a_newer_operator_added_are_ignored() -> None:
    document = json.loads(encode(MID_HAND_OVER))
    document["shinyNewField"] = {"x": 1}
    document["tasks"]["0"]["priority"] = "high"
    assert decode(json.dumps(document).encode()) == MID_HAND_OVER


def test_a_ledger_of_another_format_version_is_refused_with_what_to_do() -> None:
    document = json.loads(encode(MID_HAND_OVER))
    document["version"] = 2
    with pytest.raises(LedgerDecodeError, match="rebuild"):
        decode(json.dumps(document).encode())


def test_the_newest_generation_wins_and_instances_never_see_the_ledger(
    embedded_kafka: EmbeddedKafka,
) -> None:
    app = unique("app")
    embedded_kafka.create_topic(names.assignments_topic(app), 1)
    servers = embedded_kafka.bootstrap_servers
    record = LedgerRecord(servers, app)
    writer = AssignmentWriter(servers, app)
    try:
        record.write(MID_HAND_OVER)
        for instance, assignment in MID_HAND_OVER.assignments.items():
            writer.write(instance, assignment)
        record.write(Ledger(generation=4))  # a stale operator's late write
        assert record.read() == (MID_HAND_OVER, dict(MID_HAND_OVER.assignments))
        assert read_assignments(servers, app) == dict(MID_HAND_OVER.assignments)
    finally:
        record.close()
        writer.close()


def test_an_empty_topic_holds_no_ledger(embedded_kafka: EmbeddedKafka) -> None:
    app = unique("app")
    embedded_kafka.create_topic(names.assignments_topic(app), 1)
    record = LedgerRecord(embedded_kafka.bootstrap_servers, app)
    try:
        assert record.read() == (None, {})
    finally:
        record.close()


def test_a_status_older_than_kafka_loses_to_the_kafka_ledger() -> None:
    older = Ledger(generation=3, tasks={1: Ownership(epoch=2, active="pod-a")})
    rebuilt = rebuild(older, MID_HAND_OVER, MID_HAND_OVER.assignments, {})
    assert rebuilt.tasks == MID_HAND_OVER.tasks
    assert rebuilt.generation == 7


def test_a_lost_status_keeps_the_hand_over_the_kafka_ledger_recorded() -> None:
    # pod-a may be mid-batch on task 1: it must not fail over to anyone meanwhile.
    rebuilt = rebuild(None, MID_HAND_OVER, MID_HAND_OVER.assignments, {})
    assert rebuilt.tasks[1] == Ownership(epoch=2, handover=HandOver("pod-a", "pod-b"))


def test_a_hand_over_the_source_already_released_is_completed() -> None:
    released = {("pod-a", 1): _report("pod-a", 1, ReportedRole.RELEASED, 2, 7)}
    rebuilt = rebuild(None, MID_HAND_OVER, MID_HAND_OVER.assignments, released)
    assert rebuilt.tasks[1] == Ownership(epoch=3, active="pod-b", restore_until={"counts": 99})


def test_generation_and_epochs_rise_to_what_the_topic_and_reports_show() -> None:
    # The ledger record of generation 9 was lost with its status; its assignments were not.
    newer = {
        **MID_HAND_OVER.assignments,
        "pod-b": Assignment(generation=9, tasks={1: TaskAssignment(role=TaskRole.ACTIVE, epoch=3)}),
    }
    fenced = TaskProgress(
        "pod-a",
        TaskReport(0, ReportedRole.FENCED, 3, 7, {"counts": 99}, seen_epoch=5),
        0,
    )
    rebuilt = rebuild(MID_HAND_OVER, None, newer, {("pod-a", 0): fenced})
    assert rebuilt.generation == 9
    assert rebuilt.tasks[1] == Ownership(epoch=3, active="pod-b")
    assert rebuilt.tasks[0].epoch == 5
    assert rebuilt.tasks[0].active is None, "nobody is known to hold it at epoch 5: it fails over"
    assert rebuilt.assignments == newer
    assert rebuilt.joined["pod-b"] == 9
