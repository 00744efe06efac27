"""Space on a compacted changelog: an owner tombstones a superseded record only once the batch
that superseded it is verified (no higher writer wrote before it), and finding a higher writer
there fences it for the task."""

from itertools import pairwise
from pathlib import Path

from examples.pipelines.running_count import pipeline as running_count

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.progress import ProgressReader, ReportedRole
from smoothscale.runtime.changelog import (
    Positioned,
    RecordKind,
    closer,
    data,
    marker,
    parse_record,
)
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.instance import TOMBSTONES_PER_BATCH, Instance
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.store import StateChanges, TaskState
from smoothscale.runtime.transactions import TaskProducer
from smoothscale.runtime.writer import Writer
from smoothscale.tasks import TaskRole
from tests.runtime.changelog_model import STORE as MODEL_STORE
from tests.runtime.changelog_model import replay
from tests.runtime.compaction import as_log, as_records, compact
from tests.runtime.instance_helpers import (
    PARTITIONS,
    STORE,
    app_config,
    feed,
    for_instance,
    produce_users,
    running,
    until_active,
    user_partition,
    users_batch,
)
from tests.runtime.kafka_helpers import read_committed, wait_for

assert MODEL_STORE == STORE


def changelog(config: WorkerConfig, task: int) -> list[Positioned]:
    topic = config.changelog_topics()[STORE]
    messages = read_committed(config.bootstrap_servers, topic, PARTITIONS)
    return sorted(
        (message.offset() or 0, parse_record(message.key(), message.value(), message.headers()))
        for message in messages
        if message.partition() == task
    )


def active(epoch: int) -> TaskAssignment:
    return TaskAssignment(role=TaskRole.ACTIVE, epoch=epoch)


def test_tombstones_follow_verified_batches_and_compaction_keeps_the_state(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    users = [user for user in users_batch(40) if user_partition(user) == 0][:5]
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1})
        for _ in range(6):
            produce_users(config, users)
            assert feed(a) == len(users)
        state = a.state_snapshot(0)
    operator.close()

    log = changelog(config, 0)
    kinds = [record.kind for _offset, record in log]
    assert RecordKind.TOMBSTONE in kinds
    offset_of = {record.key: offset for offset, record in log if record.value is not None}
    for offset, record in log:
        if record.kind is not RecordKind.TOMBSTONE:
            continue
        # The record it reclaims was superseded by a batch whose closer came before it.
        successors = [o for o, r in log if r.supersedes == record.key]
        assert successors
        assert successors[0] < offset
        closers = [o for o, r in log if r.kind is RecordKind.CLOSE and o > successors[0]]
        assert closers[0] < offset
        assert offset_of[record.key] < successors[0]
    # A commit takes exactly one offset per partition: what makes verification free.
    offsets = [offset for offset, _record in log]
    assert {later - earlier for earlier, later in pairwise(offsets)} == {1, 2}
    for cleaning_point in (len(log) // 2, log[-1][0] + 1):
        for remove_tombstones in (False, True):
            compacted = as_records(compact(as_log(log), cleaning_point, remove_tombstones))
            assert replay(compacted).visible() == state
    assert replay(log).visible() == state


def test_reclaiming_keeps_pace_with_batches_that_change_many_keys(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Every batch changes twice TOMBSTONES_PER_BATCH keys: the compacted changelog keeps the
    live records and the last batch's garbage (verified after it, reclaimed by the next batch),
    not a share of every batch's."""
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    names = (f"user-{number}" for number in range(10 * TOMBSTONES_PER_BATCH))
    users = [user for user in names if user_partition(user) == 0][: 2 * TOMBSTONES_PER_BATCH]
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1})
        for _ in range(6):
            produce_users(config, users)
            assert feed(a, limit=len(users)) == len(users)
        state = a.state_snapshot(0)
    operator.close()

    log = changelog(config, 0)
    compacted = as_records(compact(as_log(log), log[-1][0] + 1, remove_tombstones=True))
    assert replay(compacted).visible() == state
    kept = [record for _offset, record in compacted if record.kind is RecordKind.DATA]
    assert len(kept) <= 2 * len(users)


def test_an_owner_that_finds_a_higher_writer_before_its_batch_is_fenced(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    users = users_batch(60)
    produce_users(config, users[:30])
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1, 1: 1})
        feed(a)
        # Another instance took task 0 over at epoch 2 without pod-a hearing of it (the test
        # brokers do not fence): its marker lands in the changelog before pod-a's next batch.
        newer = TaskProducer(config, task=0, epoch=2)
        newer.commit({STORE: [marker(Writer(2, 5, 1), "pod-b")]})
        newer.close()
        produce_users(config, users[30:])
        feed(a)
        assert a.active_tasks() == {1: 1}

        def fenced() -> bool:
            a.tick()
            report = reader.reports("pod-a", PARTITIONS).get(0)
            return report is not None and report.role is ReportedRole.FENCED

        wait_for(fenced, 10, "the fenced report")
        assert reader.reports("pod-a", PARTITIONS)[0].seen_epoch == 2
        feed(a)
        assert a.active_tasks() == {1: 1}
    operator.close()
    reader.close()


def test_a_lower_writer_in_the_gap_does_not_stop_verification(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(3)}))
    users = [user for user in users_batch(40) if user_partition(user) == 0][:5]
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 3})
        produce_users(config, users)
        assert feed(a) == len(users)
        # An older owner, not fenced by the broker, still commits: its record lands between
        # pod-a's batches, which then no longer follow on.
        older = TaskProducer(config, task=0, epoch=1)
        older.commit({STORE: [marker(Writer(1, 0, 0), "pod-z")]})
        older.close()
        for _ in range(4):
            produce_users(config, users)
            assert feed(a) == len(users)
        assert a.active_tasks() == {0: 3}
        state = a.state_snapshot(0)
    operator.close()
    log = changelog(config, 0)
    zombie = next(offset for offset, record in log if record.writer == Writer(1, 0, 0))
    assert any(o > zombie and r.kind is RecordKind.TOMBSTONE for o, r in log)
    assert replay(as_records(compact(as_log(log), log[-1][0] + 1, True))).visible() == state


def test_a_stale_local_store_is_restored_from_scratch_when_reopened(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    pod_a = for_instance(config, "pod-a")
    old, new = Writer(1, 0, 0), Writer(2, 1, 0)
    old_owner = TaskProducer(config, task=0, epoch=1)
    first = [data(old, 1, "alice", 1, None), closer(old, 1, {config.input_topics[0]: 1}, None)]
    old_owner.commit({STORE: [marker(old, "pod-a"), *first]})
    new_owner = TaskProducer(config, task=0, epoch=2)
    verified = new_owner.commit({STORE: [marker(new, "pod-b")]})[STORE] - 1
    # pod-a did not know: it committed one more batch and applied it locally, then died
    # before verifying it.
    zombie = data(old, 2, "alice", 99, b"d:alice@1.0.0.1")
    end = old_owner.commit({STORE: [zombie, closer(old, 2, {config.input_topics[0]: 2}, None)]})
    old_owner.close()
    new_owner.close()
    stale = TaskState(pod_a.state_dir, 0, [STORE])
    changes = StateChanges(
        positions=end, verified={STORE: verified}, writers={STORE: old}, closed_batches={STORE: 2}
    )
    changes.put(STORE, b"alice", zombie.key, zombie.value or b"")
    stale.apply(changes)
    stale.close()

    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    standby = TaskAssignment(role=TaskRole.STANDBY, epoch=2)
    operator.write("pod-a", Assignment(generation=1, tasks={0: standby}))
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    metrics = InstanceMetrics()
    instance = Instance(pod_a, running_count(), metrics, pod_a.state_dir / "plan.json")
    instance.start(first_assignment_timeout=5)
    try:

        def restored() -> bool:
            instance.tick()
            report = reader.reports("pod-a", PARTITIONS).get(0)
            return report is not None and report.positions[STORE] >= end[STORE]

        wait_for(restored, 10, "the restore from scratch")
    finally:
        instance.shutdown(timeout=10)
        operator.close()
        reader.close()
    state = TaskState(pod_a.state_dir, 0, [STORE])
    try:
        assert state.snapshot(STORE) == {"alice": 1}, "the zombie's write is gone"
        assert state.writer(STORE) == new
    finally:
        state.close()
    assert metrics.registry.get_sample_value("smoothscale_stale_stores_total") == 1
