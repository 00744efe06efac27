"""One task, one writer, on the real runtime code: an activation goes active only once its own
marker is proven the highest writer; verification reads every offset after the last verified
record; and no delete is tombstoned while the record it replaced may still come back.

Each test stages, deterministically, an interleaving a real cluster can produce (a racing
activation, a zombie's marker landing in the slot of a commit marker, a gap read timing out),
and checks the state every restore of the changelog gives, from the full log and from every
way the cleaner can compact it."""

import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.progress import ProgressReader, ReportedRole
from smoothscale.kafka.retention import DELETE_RETENTION
from smoothscale.runtime import instance as instance_module
from smoothscale.runtime.changelog import Positioned, RecordKind, marker, parse_record
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.instance import Instance
from smoothscale.runtime.restore import catch_up
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.transactions import TaskProducer
from smoothscale.runtime.writer import Writer
from smoothscale.tasks import TaskRole
from tests.runtime.changelog_model import replay
from tests.runtime.compaction import as_log, as_records, compact
from tests.runtime.instance_helpers import (
    PARTITIONS,
    STORE,
    app_config,
    cycling_count,
    cycling_reference,
    feed,
    for_instance,
    produce_to_partition,
    running,
    ticked,
    until_active,
)
from tests.runtime.kafka_helpers import read_committed, wait_for


def active(epoch: int, restore_until: dict[str, int] | None = None) -> TaskAssignment:
    return TaskAssignment(role=TaskRole.ACTIVE, epoch=epoch, restore_until=restore_until)


def changelog(config: WorkerConfig, task: int) -> list[Positioned]:
    topic = config.changelog_topics()[STORE]
    messages = read_committed(config.bootstrap_servers, topic, PARTITIONS)
    return sorted(
        (message.offset() or 0, parse_record(message.key(), message.value(), message.headers()))
        for message in messages
        if message.partition() == task
    )


def restored(config: WorkerConfig, task: int, root: Path) -> dict[str, object]:
    """What a fresh restore of the task's changelog gives (the real restore code)."""
    fresh = TaskState(root / f"fresh-{task}", task, [STORE])
    try:
        catch_up(config, fresh, None, timeout=10)
        return fresh.snapshot(STORE)
    finally:
        fresh.destroy()


def assert_compaction_safe(log: list[Positioned], sample: random.Random | None = None) -> None:
    """The log restores the same state however the cleaner has compacted it: at every point
    of its history (each prefix), cleaned up to every offset, tombstones kept or removed.
    With `sample`, at 20 points drawn from it and its markers, cleaned up to 20 offsets each."""
    ends = range(1, len(log) + 1)
    if sample is not None:
        markers = [i + 1 for i, (_o, r) in enumerate(log) if r.kind is RecordKind.MARKER]
        ends = sorted({len(log), *markers[-5:], *sample.sample(ends, min(20, len(log)))})
    for end in ends:
        prefix = log[:end]
        expected = replay(prefix).visible()
        points = [offset for offset, _record in prefix] + [prefix[-1][0] + 1]
        if sample is not None:
            points = sample.sample(points, min(20, len(points)))
        for cleaning_point in points:
            for remove_tombstones in (False, True):
                compacted = compact(as_log(prefix), cleaning_point, remove_tombstones)
                assert replay(as_records(compacted)).visible() == expected, (
                    f"the log up to offset {prefix[-1][0]}, cleaned up to {cleaning_point} "
                    f"(tombstones {'removed' if remove_tombstones else 'kept'}), restores "
                    "another state than the full log"
                )


def test_an_activation_that_restores_through_a_higher_writer_does_not_go_active(
    kafka_front: KafkaFront, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A racing activation (a newer operator's, at a higher epoch) writes its marker after this
    activation checked the changelog's epoch and before its own marker: restoring through its
    marker, the instance meets the higher writer first. It must not go active, although Kafka
    fenced the other's producer (it fences the producer initialised first, not the lower
    epoch): it reports the task fenced with the epoch it saw, and takes it only when assigned
    above it."""
    rival_writer = Writer(3, 7, 1)
    rivals: list[TaskProducer] = []

    def rival_first(
        config: WorkerConfig, task: int, epoch: int, client: Producer | None = None
    ) -> TaskProducer:
        if not rivals:
            rivals.append(TaskProducer(config, task, rival_writer.epoch))
            rivals[0].commit({STORE: [marker(rival_writer, "pod-c")]})
        return TaskProducer(config, task, epoch, client=client)

    config = app_config(kafka_front, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    produce_to_partition(config, 0, 3, "alice")
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1})
        while feed(a):
            pass
        operator.write("pod-a", Assignment(generation=2))
        wait_for(lambda: ticked(a).active_tasks() == {}, 10, "the release")
    released = reader.reports("pod-a", PARTITIONS)[0]
    assert released.role is ReportedRole.RELEASED

    monkeypatch.setattr(instance_module, "TaskProducer", rival_first)
    operator.write("pod-b", Assignment(generation=3, tasks={0: active(2, released.positions)}))
    with running(for_instance(config, "pod-b")) as b:

        def refused() -> bool:
            b.tick()
            report = reader.reports("pod-b", PARTITIONS).get(0)
            return report is not None and report.role is ReportedRole.FENCED

        wait_for(refused, 10, "the lost activation to be reported")
        report = reader.reports("pod-b", PARTITIONS)[0]
        assert (report.epoch, report.seen_epoch) == (2, 3)
        assert "3.7.1" in (report.error or "")
        for _ in range(3):
            b.tick()
        assert b.active_tasks() == {}

        monkeypatch.undo()
        operator.write("pod-b", Assignment(generation=4, tasks={0: active(4)}))
        until_active(b, {0: 4})
        produce_to_partition(config, 0, 2, "alice")
        while feed(b):
            pass
        state = b.state_snapshot(0)
    rivals[0].close()
    operator.close()
    reader.close()

    assert state == {"alice": 5}
    assert restored(config, 0, tmp_path) == state


def test_a_higher_marker_in_the_slot_of_a_commit_marker_fences_the_owner(
    embedded_kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a broker that does not fence, a newer owner's marker can land right after the last
    record of the owner's transaction, where its commit marker usually goes. Its next batch is
    skipped by every restore; verification must read that offset and fence the owner, or the
    owner tombstones records the newer owner's state still holds."""
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    newer = Writer(5, 9, 1)
    armed: list[bool] = []
    commit = TaskProducer.commit

    def with_a_rival_before_the_commit(
        producer: TaskProducer, changelog: object, outputs: object = (), also: object = None
    ) -> dict[str, int]:
        def then_the_rival(kafka: Producer) -> None:
            if callable(also):
                also(kafka)
            if armed and producer.task == 0:
                armed.clear()
                kafka.flush(10)  # this transaction's records are in the log now
                rival = TaskProducer(config, task=0, epoch=newer.epoch)
                rival.commit({STORE: [marker(newer, "pod-b")]})
                rival.close()

        return commit(producer, changelog, outputs, then_the_rival)  # type: ignore[arg-type]

    monkeypatch.setattr(TaskProducer, "commit", with_a_rival_before_the_commit)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1})
        produce_to_partition(config, 0, 1, "alice")
        assert feed(a) == 1
        armed.append(True)
        produce_to_partition(config, 0, 1, "alice")
        assert feed(a) == 1
        log = changelog(config, 0)
        at = next(i for i, (_o, r) in enumerate(log) if r.writer == newer)
        assert log[at][0] == log[at - 1][0] + 1, "the rival's marker follows pod-a's last record"
        for _ in range(3):
            produce_to_partition(config, 0, 1, "alice")
            feed(a)
        assert a.active_tasks() == {}, "the owner found the newer writer and stopped"

        def fenced() -> bool:
            a.tick()
            report = reader.reports("pod-a", PARTITIONS)[0]
            return (report.role, report.seen_epoch) == (ReportedRole.FENCED, newer.epoch)

        wait_for(fenced, 10, "the fenced report")
    operator.close()
    reader.close()

    # The newer owner restored through its marker: both of pod-a's batches before it count.
    legitimate = {"alice": 2}
    log = changelog(config, 0)
    assert restored(config, 0, tmp_path) == replay(log).visible() == legitimate
    assert_compaction_safe(log)


def test_a_delete_is_not_tombstoned_while_the_record_it_replaced_is_unverified(
    embedded_kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch deletes a key; its verification cannot read the gap in time (a lower writer
    wrote in between), so the record the delete replaced is not garbage yet. Later batches
    reclaim the key's older records (one a batch, the limit here), and must not tombstone the
    delete meanwhile: compaction would then keep the record it replaced, and the deleted key
    would come back."""
    monkeypatch.setattr(instance_module, "TOMBSTONES_PER_BATCH", 1)
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(3)}))
    fed: list[str] = []

    def batch(*users: str) -> None:
        for user in users:
            produce_to_partition(config, 0, 1, user)
        fed.extend(users)
        assert feed(a) == len(users)

    with running(for_instance(config, "pod-a"), cycling_count()) as a:
        until_active(a, {0: 3})
        batch("alice", "zed")
        batch("alice", "zed")
        # A lower writer (an older owner the broker did not fence) commits between two
        # batches, and the gap reads time out from here on.
        older = TaskProducer(config, task=0, epoch=1)
        older.commit({STORE: [marker(Writer(1, 0, 0), "pod-z")]})
        older.close()
        monkeypatch.setattr(instance_module, "GAP_READ_SECONDS", 0.0)
        batch("zed")  # zed: 3 -> deleted, in a batch not verified
        for _ in range(3):
            batch("bob")
        monkeypatch.setattr(instance_module, "GAP_READ_SECONDS", 5.0)
        monkeypatch.setattr(instance_module, "TOMBSTONES_PER_BATCH", 100)
        for _ in range(3):
            batch("bob")
        state = a.state_snapshot(0)
    operator.close()

    log = changelog(config, 0)
    deleted = [r.key for _o, r in log if r.kind is RecordKind.DELETE]
    tombstoned = {r.key for _o, r in log if r.kind is RecordKind.TOMBSTONE}
    assert deleted[0] in tombstoned, "the delete is reclaimed in the end"
    assert state == cycling_reference(fed) == replay(log).visible() == {"alice": 2}
    assert_compaction_safe(log)


@pytest.mark.parametrize("bound", ["state_reuse_seconds", "delete.retention.ms"])
def test_a_key_deleted_while_the_task_was_away_never_comes_back(
    kafka_front: KafkaFront, tmp_path: Path, bound: str
) -> None:
    """pod-a releases the task and keeps its store on disk; pod-b deletes a key and reclaims
    its records; the cleaner removes them and, once delete.retention.ms has passed, the
    tombstones too. The task comes back to pod-a after longer than stores are reused: its old
    store would still hold the key, so it is restored from scratch instead. Stores are reused
    for state_reuse_seconds (here 2 s), but never longer than half the changelog's
    delete.retention.ms (here 4 s, with state_reuse_seconds at its default of 12 h)."""
    config = app_config(kafka_front, tmp_path)
    topic = config.changelog_topics()[STORE]
    if bound == "state_reuse_seconds":
        config = config.model_copy(update={"state_reuse_seconds": 2.0})
    else:
        retention = ConfigResource(
            "topic",
            topic,
            incremental_configs=[
                ConfigEntry(DELETE_RETENTION, "4000", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        admin = AdminClient({"bootstrap.servers": config.bootstrap_servers})
        for future in admin.incremental_alter_configs([retention]).values():
            future.result(10)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    fed: list[str] = []

    def batch(instance: Instance, user: str, records: int = 1) -> None:
        produce_to_partition(config, 0, records, user)
        fed.extend([user] * records)
        assert feed(instance) == records

    def hand_over(source: str, instance: Instance, generation: int) -> dict[str, int]:
        operator.write(source, Assignment(generation=generation))
        wait_for(lambda: ticked(instance).active_tasks() == {}, 10, f"{source} to release")
        return dict(reader.reports(source, PARTITIONS)[0].positions)

    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    operator.write("pod-b", Assignment(generation=1))
    with (
        running(for_instance(config, "pod-a"), cycling_count()) as a,
        running(for_instance(config, "pod-b"), cycling_count()) as b,
    ):
        until_active(a, {0: 1})
        batch(a, "zed")
        released = hand_over("pod-a", a, 2)
        operator.write("pod-b", Assignment(generation=3, tasks={0: active(2, released)}))
        until_active(b, {0: 2})
        batch(b, "zed", 2)  # zed: 3, deleted
        for _ in range(3):
            batch(b, "bob")  # pod-b reclaims zed's records, then its delete
        kafka_front.compact(topic, partition=0, remove_tombstones=True)
        released = hand_over("pod-b", b, 4)
        time.sleep(2.5)
        operator.write("pod-a", Assignment(generation=5, tasks={0: active(3, released)}))
        until_active(a, {0: 3})
        batch(a, "zed")
        state = a.state_snapshot(0)
        metrics = a.metrics
    operator.close()
    reader.close()

    assert state == cycling_reference(fed) == {"zed": 1}
    assert metrics.registry.get_sample_value("smoothscale_stale_stores_total") == 1


def test_a_process_whose_pod_was_recreated_under_its_name_steps_down(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A force-deleted pod's process lives on while its successor, same name, new uid, is given
    the task at the next epoch: the old process reads the successor's assignment as its own
    name's, and must let go at once, committing nothing more, on a broker that does not fence
    too. The successor is not put off by its predecessor's older records."""
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    old = for_instance(config, "pod-a").model_copy(update={"instance_uid": "uid-1"})
    new = old.model_copy(update={"instance_uid": "uid-2", "state_dir": tmp_path / "successor"})
    fed: list[str] = []

    def batch(instance: Instance) -> int:
        produce_to_partition(config, 0, 1, "alice")
        fed.append("alice")
        return feed(instance)

    task = {0: active(1)}
    operator.write("pod-a", Assignment(generation=1, tasks=task, uid="uid-1"))
    with running(old) as zombie:
        until_active(zombie, {0: 1})
        assert batch(zombie) == 1
        operator.write("pod-a", Assignment(generation=2, tasks={0: active(2)}, uid="uid-2"))
        with running(new) as successor:
            until_active(successor, {0: 2})
            assert not successor.replaced
            assert batch(zombie) == 0, "the old process read nothing more"
            assert zombie.replaced
            assert zombie.active_tasks() == {}
            batch(successor)
            state = successor.state_snapshot(0)
            report = reader.reports("pod-a", PARTITIONS)[0]
    operator.close()
    reader.close()

    assert state == {"alice": len(fed)}
    assert (report.role, report.uid) == (ReportedRole.ACTIVE, "uid-2")
    log = changelog(config, 0)
    writers = {r.writer for _o, r in log if r.kind is RecordKind.MARKER}
    assert len(writers) == 2
    assert replay(log).visible() == state
