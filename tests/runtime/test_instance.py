"""The instance state machine and the hand-over protocol, with a stand-in for Spark.

These tests drive real instances (stores, changelog, transactions, restore loop, reports)
through the operator's channels; the Spark half of a micro-batch is replaced by `feed`.
"""

import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from devstack.demo.timeline import read_timelines
from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from smoothscale.kafka.assignments import (
    Assignment,
    AssignmentFollower,
    AssignmentWriter,
    TaskAssignment,
)
from smoothscale.kafka.progress import ProgressCommitter, ProgressReader, ReportedRole, TaskReport
from smoothscale.runtime.changelog import closer, data, marker
from smoothscale.runtime.metrics import start_http_server
from smoothscale.runtime.restore import catch_up
from smoothscale.runtime.source import read_plan
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.transactions import TaskProducer, TransactionError
from smoothscale.runtime.worker import KeepWarm
from smoothscale.runtime.writer import Writer
from smoothscale.tasks import TaskRole
from tests.runtime.instance_helpers import (
    PARTITIONS,
    STORE,
    app_config,
    feed,
    final_totals,
    for_instance,
    produce_to_partition,
    produce_users,
    running,
    ticked,
    until_active,
    user_partition,
    users_batch,
)
from tests.runtime.kafka_helpers import wait_for


def active(epoch: int, restore_until: dict[str, int] | None = None) -> TaskAssignment:
    return TaskAssignment(role=TaskRole.ACTIVE, epoch=epoch, restore_until=restore_until)


def warmup(epoch: int) -> TaskAssignment:
    return TaskAssignment(role=TaskRole.WARMUP, epoch=epoch)


def role(name: TaskRole, epoch: int) -> TaskAssignment:
    return TaskAssignment(role=name, epoch=epoch)


def test_hand_over_between_two_instances_keeps_the_state_exact(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    operator.write("pod-b", Assignment(generation=1))
    produced = users_batch(300)
    produce_users(config, produced[:200])
    with running(for_instance(config, "pod-a")) as a, running(for_instance(config, "pod-b")) as b:
        until_active(a, {0: 1, 1: 1})
        while feed(a):
            pass

        # Plan + warm up: B follows task 1's changelog while A keeps processing.
        operator.write("pod-b", Assignment(generation=2, tasks={1: warmup(1)}))
        produce_users(config, produced[200:250])
        feed(a)
        b.tick()

        def b_caught_up() -> bool:
            b.tick()
            progress = reader.read(["pod-b"], PARTITIONS)
            report = progress.get(("pod-b", 1))
            return (
                report is not None
                and report.report.role is ReportedRole.WARMUP
                and (report.lag == 0)
            )

        wait_for(b_caught_up, 10, "the warm-up to catch up")

        def ends_reported_with_positions() -> bool:
            b.tick()
            report = reader.reports("pod-b", PARTITIONS)[1]
            return report.ends is not None and dict(report.ends) == dict(report.positions)

        wait_for(ends_reported_with_positions, 10, "the warm-up to report its changelog end")

        # Revoke from A: it finishes its batch, releases, acknowledges its final offsets.
        operator.write("pod-a", Assignment(generation=3, tasks={0: active(1)}))
        produce_users(config, produced[250:])
        feed(a)
        wait_for(lambda: ticked(a).active_tasks() == {0: 1}, 10, "the release")
        released = reader.reports("pod-a", PARTITIONS)[1]
        assert released.role is ReportedRole.RELEASED

        # Activate at B with epoch 2, restoring exactly to A's acknowledged offsets.
        operator.write(
            "pod-b",
            Assignment(generation=4, tasks={1: active(2, dict(released.positions))}),
        )
        until_active(b, {1: 2})
        while feed(a) + feed(b):
            pass
        assert reader.reports("pod-b", PARTITIONS)[1].role is ReportedRole.ACTIVE

        state = {**a.state_snapshot(0), **b.state_snapshot(1)}
    operator.close()
    reader.close()

    reference = Counter(produced)
    assert state == dict(reference)
    totals = final_totals(config)
    assert {user: seen[-1] for user, seen in totals.items()} == dict(reference)
    for user, seen in totals.items():
        assert seen == sorted(set(seen)), f"{user}: a total was emitted twice or went back"


def test_busy_instances_hand_a_task_over_between_two_of_their_batches(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """On a busy instance micro-batches run back to back and the main thread's tick rarely gets
    in between: the release and the activation happen at the end of a batch, and the new
    owner's plan holds the task before Spark plans its next batch."""
    config = app_config(embedded_kafka, tmp_path)
    topic = config.input_topics[0]
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={1: active(1)}))
    operator.write("pod-b", Assignment(generation=1, tasks={0: active(1), 1: warmup(1)}))
    produced = users_batch(300)
    produce_users(config, produced[:200])
    with running(for_instance(config, "pod-a")) as a, running(for_instance(config, "pod-b")) as b:
        until_active(a, {1: 1})
        until_active(b, {0: 1})
        while feed(a, tick=False) + feed(b, tick=False):
            pass
        # From here on no tick: only batches.
        operator.write("pod-a", Assignment(generation=2))
        produce_users(config, produced[200:250])
        wait_for(lambda: feed(a, tick=False) >= 0 and not a.active_tasks(), 10, "the release")
        released = reader.reports("pod-a", PARTITIONS)[1]
        assert released.role is ReportedRole.RELEASED
        operator.write(
            "pod-b",
            Assignment(generation=2, tasks={0: active(1), 1: active(2, dict(released.positions))}),
        )
        wait_for(
            lambda: feed(b, tick=False) >= 0 and b.active_tasks() == {0: 1, 1: 2},
            10,
            "the activation",
        )
        planned = read_plan(b.plan_path).partitions
        produce_users(config, produced[250:])
        while feed(a, tick=False) + feed(b, tick=False):
            pass
        state = {**b.state_snapshot(0), **b.state_snapshot(1)}
    operator.close()
    reader.close()

    assert f"{topic}:1" in planned
    assert state == dict(Counter(produced))


def test_an_activation_is_reported_at_once_not_at_the_next_report_interval(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """The operator ends a hand-over, and drains the old owner's pod, on the new owner's report
    that the task is active; progress reports are otherwise sent once per report_interval."""
    config = for_instance(app_config(embedded_kafka, tmp_path), "pod-a").model_copy(
        update={"report_interval": 600.0}
    )
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    with running(config) as a:
        until_active(a, {0: 1, 1: 1})
        reports = reader.reports("pod-a", PARTITIONS)
    operator.close()
    reader.close()

    assert {task: report.role for task, report in reports.items()} == {
        0: ReportedRole.ACTIVE,
        1: ReportedRole.ACTIVE,
    }


def test_an_epoch_marker_transaction_that_fails_once_is_tried_again(
    embedded_kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction can fail for a passing reason (a request timed out on a loaded broker;
    seen in CI as a record purged from the producer's queue): the activation tries again
    instead of stopping the worker, which would cost a Spark start."""
    commit = TaskProducer.commit
    failed: list[int] = []

    def fails_once(producer: TaskProducer, *args: object, **kwargs: object) -> object:
        if not failed:
            failed.append(producer.task)
            raise TransactionError(f"task {producer.task}: Kafka refused a record: purged")
        return commit(producer, *args, **kwargs)

    monkeypatch.setattr(TaskProducer, "commit", fails_once)
    config = for_instance(app_config(embedded_kafka, tmp_path), "pod-a")
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    operator.close()
    with running(config) as a:
        until_active(a, {0: 1})

    assert failed == [0]


def test_an_unfenced_zombie_owner_cannot_corrupt_the_state(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    produced = users_batch(200)
    produce_users(config, produced[:100])
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1, 1: 1})
        feed(a)
        # pod-a stops answering; the operator moves its tasks to pod-b without a release
        # (failover). pod-a never sees that assignment: it is a zombie, still running.
        operator.write("pod-b", Assignment(generation=2, tasks={0: active(2), 1: active(2)}))
        with running(for_instance(config, "pod-b")) as b:
            until_active(b, {0: 2, 1: 2})
            produce_users(config, produced[100:])
            # The mock broker does not fence: the zombie's next transaction commits.
            assert feed(a) > 0
            while feed(b):
                pass
            state = {**b.state_snapshot(0), **b.state_snapshot(1)}
    operator.close()

    # pod-b picked up exactly where pod-a's last batch before the failover left off.
    assert state == dict(Counter(produced))
    # And a later restore ignores the zombie's writes: it rebuilds pod-b's state.
    for task in range(PARTITIONS):
        fresh = TaskState(tmp_path / "fresh", task, [STORE])
        try:
            catch_up(config, fresh, None, timeout=10)
            assert fresh.snapshot(STORE) == {
                user: count for user, count in state.items() if user_partition(user) == task
            }
        finally:
            fresh.close()


def test_a_zombie_owner_kafka_fences_stops_that_task_only_and_commits_nothing_of_it(
    kafka_front: KafkaFront, tmp_path: Path
) -> None:
    config = app_config(kafka_front, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    produced = users_batch(200)
    produce_users(config, produced[:100])
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1, 1: 1})
        feed(a)
        # Task 0 fails over to pod-b; pod-a never hears of it. pod-b's producer fences pod-a's
        # (the same transactional.id) before its marker: pod-a's next commit of task 0 is
        # refused by Kafka, before the changelog could tell it.
        operator.write("pod-b", Assignment(generation=2, tasks={0: active(2)}))
        with running(for_instance(config, "pod-b")) as b:
            until_active(b, {0: 2})
            produce_users(config, produced[100:])
            assert feed(a) > 0
            assert a.active_tasks() == {1: 1}

            def fenced() -> bool:
                a.tick()
                report = reader.reports("pod-a", PARTITIONS).get(0)
                return report is not None and report.role is ReportedRole.FENCED

            wait_for(fenced, 10, "the fenced report")
            assert "fenced" in (reader.reports("pod-a", PARTITIONS)[0].error or "")
            while feed(a) + feed(b):
                pass
            state = {**b.state_snapshot(0), **a.state_snapshot(1)}
    operator.close()
    reader.close()

    assert state == dict(Counter(produced))
    topic = config.changelog_topics()[STORE]
    timelines = read_timelines(config.bootstrap_servers, topic, PARTITIONS)
    assert [overlap for timeline in timelines.values() for overlap in timeline.overlaps] == []
    for user, seen in final_totals(config).items():
        assert seen == sorted(set(seen)), f"{user}: a total was emitted twice or went back"


def test_shutdown_releases_every_active_task_with_its_final_offsets(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    produce_users(config, users_batch(40))
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1, 1: 1})
        feed(a)
        while_active = reader.reports("pod-a", PARTITIONS)
    operator.close()
    try:
        reports = reader.reports("pod-a", PARTITIONS)
    finally:
        reader.close()
    for task in range(PARTITIONS):
        assert while_active[task].role is ReportedRole.ACTIVE
        assert reports[task].role is ReportedRole.RELEASED
        assert reports[task].positions == while_active[task].positions
        assert reports[task].positions[STORE] > 0


def test_an_assignment_older_than_the_changelog_epoch_is_refused_and_reported(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(5)}))
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 5})
    # A stale operator hands the task to pod-b at an epoch below the one in the changelog.
    operator.write("pod-b", Assignment(generation=2, tasks={0: active(4)}))
    with running(for_instance(config, "pod-b")) as b:

        def refused() -> bool:
            b.tick()
            report = reader.reports("pod-b", PARTITIONS).get(0)
            return report is not None and report.role is ReportedRole.REFUSED

        wait_for(refused, 10, "the refusal to be reported")
        report = reader.reports("pod-b", PARTITIONS)[0]
        assert (report.epoch, report.seen_epoch) == (4, 5)
        assert "above epoch 5" in (report.error or "")
        for _ in range(5):
            b.tick()
        assert b.active_tasks() == {}
        assert reader.reports("pod-b", PARTITIONS)[0].role is ReportedRole.REFUSED

        operator.write("pod-b", Assignment(generation=3, tasks={0: active(6)}))
        until_active(b, {0: 6})
    operator.close()
    reader.close()


def test_a_released_task_kept_as_standby_follows_the_new_owner(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    operator.write("pod-b", Assignment(generation=1))
    produced = [user for user in users_batch(300) if user_partition(user) == 0]
    produce_users(config, produced[:50])
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    with running(for_instance(config, "pod-a")) as a, running(for_instance(config, "pod-b")) as b:
        while feed(a):
            pass
        operator.write("pod-a", Assignment(generation=2, tasks={0: role(TaskRole.STANDBY, 1)}))
        wait_for(lambda: ticked(a).active_tasks() == {}, 10, "the release")
        released = reader.reports("pod-a", PARTITIONS)[0]
        assert released.role is ReportedRole.RELEASED
        operator.write(
            "pod-b", Assignment(generation=3, tasks={0: active(2, dict(released.positions))})
        )
        until_active(b, {0: 2})
        produce_users(config, produced[50:])
        while feed(b):
            pass

        def standby_caught_up() -> bool:
            a.tick()
            progress = reader.read(["pod-a"], PARTITIONS).get(("pod-a", 0))
            return (
                progress is not None
                and progress.report.role is ReportedRole.STANDBY
                and progress.lag == 0
            )

        operator.write("pod-a", Assignment(generation=4, tasks={0: role(TaskRole.STANDBY, 2)}))
        wait_for(standby_caught_up, 10, "pod-a's standby to follow pod-b")
        expected = b.state_snapshot(0)
    reader.close()
    operator.close()
    assert expected == dict(Counter(produced))


def test_a_report_kafka_refuses_does_not_stop_processing_and_is_sent_again(
    kafka_cluster: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(kafka_cluster, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    produced = users_batch(60)
    produce_users(config, produced[:30])
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1, 1: 1})
        offset_commit, group_authorization_failed = 8, 30
        kafka_cluster.push_request_errors(offset_commit, [group_authorization_failed] * 3)
        assert feed(a) == 30, "the batch commits although its reports are refused"
        produce_users(config, produced[30:])
        while feed(a):
            pass
        state = {**a.state_snapshot(0), **a.state_snapshot(1)}
        counts = Counter(user_partition(user) for user in produced)

        def reported_everything() -> bool:
            a.tick()
            reports = reader.reports("pod-a", PARTITIONS)
            return all(
                task in reports
                and reports[task].input_positions == {config.input_topics[0]: counts[task]}
                for task in range(PARTITIONS)
            )

        wait_for(reported_everything, 10, "the reports to get through")
    reader.close()
    operator.close()
    assert state == dict(Counter(produced))


def test_a_foreign_changelog_record_fails_only_its_task(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    stranger = Producer({"bootstrap.servers": config.bootstrap_servers})
    stranger.produce(config.changelog_topics()[STORE], key=b"alice", value=b"1", partition=1)
    stranger.flush(10)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: warmup(1)}))
    produce_users(config, users_batch(100))
    with running(for_instance(config, "pod-a")) as a:

        def reported_on_its_task() -> bool:
            a.tick()
            report = reader.reports("pod-a", PARTITIONS).get(1)
            return report is not None and report.error is not None

        wait_for(reported_on_its_task, 10, "the error on task 1")
        report = reader.reports("pod-a", PARTITIONS)[1]
        assert report.role is ReportedRole.WARMUP
        assert "written by smoothscale only" in (report.error or "")
        until_active(a, {0: 1})
        assert feed(a) > 0, "the other task goes on"
    operator.close()
    reader.close()


def test_a_restarted_instance_ends_the_hand_over_its_previous_run_left_open(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    pod_a = for_instance(config, "pod-a")
    # The previous run held task 1 active, then died before it applied the assignment that
    # revoked it: its last report says active.
    previous = ProgressCommitter(
        config.bootstrap_servers, config.app_id, "pod-a", config.changelog_topics()
    )
    previous.commit([TaskReport(1, ReportedRole.ACTIVE, 3, 1, {STORE: 5}, {"users": 9})])
    previous.close()
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    # The operator revoked task 1 (a source gets no other role for a task before it released).
    operator.write("pod-a", Assignment(generation=2, tasks={0: active(3)}))
    # Restarted in place: the same pod, so the same disk, with the task's local store.
    TaskState(pod_a.state_dir, 1, pod_a.stores).close()
    with running(pod_a) as a:
        released = reader.reports("pod-a", PARTITIONS)[1]
        assert (released.role, released.epoch, dict(released.positions)) == (
            ReportedRole.RELEASED,
            3,
            {STORE: 5},
        )
        # An unrelated assignment does not end the release report ...
        operator.write("pod-a", Assignment(generation=3, tasks={0: active(4)}))
        until_active(a, {0: 4})
        operator.write("pod-a", Assignment(generation=4, tasks={0: active(4)}))
        a.tick()
        assert reader.reports("pod-a", PARTITIONS)[1].role is ReportedRole.RELEASED
        # ... the task coming back here does.
        operator.write("pod-a", Assignment(generation=5, tasks={0: active(4), 1: warmup(5)}))

        def warming_up() -> bool:
            a.tick()
            return reader.reports("pod-a", PARTITIONS)[1].role is ReportedRole.WARMUP

        wait_for(warming_up, 10, "the task to be reported as a warm-up")
    operator.close()
    reader.close()


def test_the_state_stays_exact_through_several_hand_overs(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    operator.write("pod-b", Assignment(generation=1))
    produced = [user for user in users_batch(400) if user_partition(user) == 0]
    chunks = [produced[i::4] for i in range(4)]
    generation = 1
    with running(for_instance(config, "pod-a")) as a, running(for_instance(config, "pod-b")) as b:
        owner, other, instance_ids = a, b, ("pod-a", "pod-b")
        until_active(a, {0: 1})
        for epoch, chunk in enumerate(chunks[:3], start=1):
            produce_users(config, chunk)
            while feed(owner):
                pass
            generation += 1
            operator.write(instance_ids[0], Assignment(generation=generation))
            wait_for(lambda o=owner: ticked(o).active_tasks() == {}, 10, "the release")
            released = reader.reports(instance_ids[0], PARTITIONS)[0]
            assert released.role is ReportedRole.RELEASED
            until = dict(released.positions)
            operator.write(
                instance_ids[1],
                Assignment(generation=generation, tasks={0: active(epoch + 1, until)}),
            )
            wait_for(
                lambda o=other, e=epoch: ticked(o).active_tasks() == {0: e + 1}, 10, "activation"
            )
            owner, other, instance_ids = other, owner, (instance_ids[1], instance_ids[0])
        produce_users(config, chunks[3])
        while feed(owner):
            pass
        state = owner.state_snapshot(0)
    operator.close()
    reader.close()
    assert state == dict(Counter(produced))


def test_an_activation_needing_a_long_restore_never_stops_the_other_tasks(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Issue 9.4: a task whose changelog holds far more than its restoreUntil says is marked,
    then restored through its marker in the background: meanwhile it is not active yet (it
    reports as a warm-up) and the instance's other task keeps processing."""
    config = app_config(embedded_kafka, tmp_path)
    changelog = config.changelog_topics()[STORE]
    # An earlier owner of task 1 wrote 40 closed batches of 1,000 keys each.
    earlier = Writer(1, 1, 7)
    producer = TaskProducer(config, task=1, epoch=1)
    producer.commit({STORE: [marker(earlier, "pod-old")]})
    for batch in range(1, 41):
        records = [data(earlier, batch, f"key-{k}", batch, None) for k in range(1_000)]
        records.append(closer(earlier, batch, {config.input_topics[0]: 0}, None))
        producer.commit({STORE: records})
    producer.close()
    ends = Consumer({"bootstrap.servers": config.bootstrap_servers, "group.id": "ends"})
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    users = users_batch(200)
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1})
        before = ends.get_watermark_offsets(TopicPartition(changelog, 1), timeout=10)[1]
        # Task 1 comes with a stale, low restoreUntil: the marker is written at once, and the
        # restore through it (40,000 records) follows in the background.
        operator.write(
            "pod-a", Assignment(generation=2, tasks={0: active(1), 1: active(2, {STORE: 1})})
        )
        processed_while_activating = 0
        while 1 not in ticked(a).active_tasks():
            marked = ends.get_watermark_offsets(TopicPartition(changelog, 1), timeout=10)[1]
            if marked > before and 1 not in a.active_tasks():
                produce_users(config, [u for u in users if user_partition(u) == 0][:20])
                processed_while_activating += feed(a)
        assert processed_while_activating > 0, "task 0 kept processing while task 1 restored"
        assert a.active_tasks() == {0: 1, 1: 2}
        assert a.state_snapshot(1) == {f"key-{k}": 40 for k in range(1_000)}
    operator.close()
    ends.close()


def test_a_new_pod_under_a_known_name_owes_none_of_its_predecessors_releases(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A pod re-created under the same name has a new, empty disk: the operator takes it for a
    new instance (the old one's tasks fail over), so it reports its warm-ups, not the releases
    its predecessor's reports would imply."""
    config = app_config(embedded_kafka, tmp_path)
    pod_a = for_instance(config, "pod-a")
    predecessor = ProgressCommitter(
        config.bootstrap_servers, config.app_id, "pod-a", config.changelog_topics()
    )
    predecessor.commit([TaskReport(1, ReportedRole.ACTIVE, 3, 1, {STORE: 5}, {"users": 9})])
    predecessor.close()
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=2, tasks={1: warmup(4)}))
    with running(pod_a) as a:

        def warming_up() -> bool:
            a.tick()
            report = reader.reports("pod-a", PARTITIONS).get(1)
            return report is not None and report.role is ReportedRole.WARMUP

        wait_for(warming_up, 10, "the warm-up report")
    operator.close()
    reader.close()


def test_a_new_instance_samples_as_many_partitions_as_its_spark_reads_at_once(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """The warm-up sample spans up to `partitions` input partitions with input (the last
    `records` of each): a real batch reads its partitions at once, each through a Python reader
    of its own, and a reader the sample did not start would start cold in the first batch of a
    task handed over."""
    config = for_instance(app_config(embedded_kafka, tmp_path), "pod-a")
    topic = config.input_topics[0]
    produce_to_partition(config, 0, 5, "zoe")
    produce_to_partition(config, 1, 2, "zoe")
    with running(config) as instance:
        assert instance.warm_up(records=3, partitions=PARTITIONS)
        both = read_plan(instance.plan_path).partitions
        assert instance.warm_up(records=3, partitions=1)
        one = read_plan(instance.plan_path).partitions

    assert both == {f"{topic}:0": 2, f"{topic}:1": 0}
    assert one == {f"{topic}:0": 2}


def test_a_task_turns_active_in_the_tick_that_writes_its_marker(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Writing the epoch marker and reading it back take one tick, not one each: on a busy
    instance a tick comes only between micro-batches, and every extra one is a batch more with
    the task owned by nobody. (start() takes the first assignment and ticks once.)"""
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    operator.close()
    with running(for_instance(config, "pod-a")) as instance:
        after_one_tick = instance.active_tasks()
        plan = read_plan(instance.plan_path)

    assert after_one_tick == {0: 1, 1: 1}
    # ... and the source sees them in one plan, the first after start's empty one: it starts
    # a batch as soon as it sees a new partition, which must not be with only one of them.
    assert (plan.version, len(plan.partitions)) == (2, 2)


def test_a_task_moved_within_the_acceptable_recovery_lag_turns_active_in_one_tick(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """The operator moves a task whose new owner is within acceptableRecoveryLag (10,000 by
    default, here a raised one) before that owner has read its changelog. The owner restores it
    within the tick that activates it, so it joins the first batch beside the tasks moved with
    it. A later tick would cost it a whole batch (the demo's third task stopped 3.0-3.4 s, the
    others about 2)."""
    config = app_config(embedded_kafka, tmp_path)
    changelog = config.changelog_topics()[STORE]
    earlier = Writer(1, 1, 7)
    producer = TaskProducer(config, task=1, epoch=1)
    producer.commit({STORE: [marker(earlier, "pod-old")]})
    for batch in range(1, 19):  # about 18,000 changelog offsets
        records = [data(earlier, batch, f"key-{k}", batch, None) for k in range(1_000)]
        records.append(closer(earlier, batch, {config.input_topics[0]: 0}, None))
        producer.commit({STORE: records})
    producer.close()
    ends = Consumer({"bootstrap.servers": config.bootstrap_servers, "group.id": "ends"})
    end = ends.get_watermark_offsets(TopicPartition(changelog, 1), timeout=10)[1]
    ends.close()
    assert 5_000 < end <= 20_000
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={1: active(2, {STORE: end})}))
    operator.close()
    with running(for_instance(config, "pod-a")) as instance:
        after_one_tick = instance.active_tasks()
        plan = read_plan(instance.plan_path)
        state = instance.state_snapshot(1)

    assert after_one_tick == {1: 2}
    assert (plan.version, len(plan.partitions)) == (2, 1)
    assert state == {f"key-{k}": 18 for k in range(1_000)}


def test_a_long_micro_batch_does_not_silence_the_instance(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A new pod's first micro-batches on a cold JVM take tens of seconds on a loaded node, and
    hold the instance lock meanwhile: the ticks that cannot get in still beat (the latest
    reports, committed again), so the operator never takes a busy instance for a hung one."""
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: warmup(1)}))
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    with running(for_instance(config, "pod-a")) as a:
        until_active(a, {0: 1})
        before = reader.reports("pod-a", PARTITIONS)
        held, done = threading.Event(), threading.Event()

        def long_batch() -> None:
            with a.lock:
                held.set()
                done.wait()

        batch = threading.Thread(target=long_batch)
        batch.start()
        held.wait()
        for _ in range(4):
            a.tick()  # each waits TICK_LOCK_SECONDS for the lock, then gives up
        during = reader.reports("pod-a", PARTITIONS)
        done.set()
        batch.join()
    operator.close()
    reader.close()

    assert during[0].beat is not None
    assert before[0].beat is not None
    assert during[0].beat >= before[0].beat + 2
    assert (during[0].role, during[1].role) == (ReportedRole.ACTIVE, ReportedRole.WARMUP)


def test_a_micro_batch_that_hangs_makes_the_instance_stalled_and_its_probes_fail(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A pipeline that blocks (or a query that hangs) keeps its tasks from progressing: once the
    query runs, a batch running past the stall timeout makes the instance say so in the reports
    of its active tasks (the operator moves them), on /readyz (the pod turns not Ready, which
    wakes the operator at once) and on /healthz (the kubelet restarts it). It recovers as soon
    as a batch completes."""
    config = for_instance(app_config(embedded_kafka, tmp_path), "pod-a").model_copy(
        update={"stall_timeout": 1.0}
    )
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    with running(config) as a:
        until_active(a, {0: 1})
        a.metrics.set_ready(True)  # the query runs
        server = start_http_server(0, a.metrics, host="127.0.0.1")
        held, done = threading.Event(), threading.Event()

        def hung_batch() -> None:
            with a.batch():
                held.set()
                done.wait()

        batch = threading.Thread(target=hung_batch)
        batch.start()
        held.wait()
        try:
            for _ in range(4):
                a.tick()  # each waits TICK_LOCK_SECONDS for the lock, then beats
            report = reader.reports("pod-a", PARTITIONS)[0]
            health, readiness = (probe(server.port, path) for path in ("/healthz", "/readyz"))
            # The worker's main thread keeps the query warm after a while without input: it
            # must not wait on the hung batch (its reports and SIGTERM would wait with it).
            keep_warm = threading.Thread(target=KeepWarm(a, idle_seconds=0.0).tick, daemon=True)
            keep_warm.start()
            keep_warm.join(timeout=10)
            kept_waiting = keep_warm.is_alive()
        finally:
            done.set()
            batch.join()
        a.tick()
        recovered = [probe(server.port, path) for path in ("/healthz", "/readyz")]
        server.stop()
    operator.close()
    reader.close()

    assert report.role is ReportedRole.ACTIVE
    assert report.stalled_for is not None
    assert report.stalled_for >= 1.0
    assert health == (503, health[1])
    assert "no micro-batch completed" in health[1]
    assert readiness == (503, health[1])
    assert [status for status, _ in recovered] == [200, 200]
    assert not kept_waiting, "keeping warm waited on the hung batch"


def probe(port: int, path: str) -> tuple[int, str]:
    """What a kubelet's HTTP probe of `path` gets: the status and the body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_fenced_task_is_reported_at_once_and_until_it_is_given_again(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """The operator may take a task from an owner on its last `active` report, not knowing a
    newer writer fenced it: the owner says `fenced` at once, and keeps saying it through an
    assignment that no longer gives it the task, so the task fails over above that writer."""
    config = for_instance(app_config(embedded_kafka, tmp_path), "pod-a").model_copy(
        update={"report_interval": 600.0}
    )
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1)}))
    users = [user for user in users_batch(80) if user_partition(user) == 0]
    produce_users(config, users[:20])
    with running(config) as a:
        until_active(a, {0: 1})
        feed(a)
        newer = TaskProducer(config, task=0, epoch=2)
        newer.commit({STORE: [marker(Writer(2, 5, 1), "pod-b")]})
        newer.close()
        produce_users(config, users[20:])
        feed(a, tick=False)
        at_once = reader.reports("pod-a", PARTITIONS)[0]
        operator.write("pod-a", Assignment(generation=2))
        a.tick()
        a.tick()
        later = reader.reports("pod-a", PARTITIONS)[0]
    operator.close()
    reader.close()

    assert (at_once.role, at_once.seen_epoch) == (ReportedRole.FENCED, 2)
    assert (later.role, later.seen_epoch) == (ReportedRole.FENCED, 2)


def test_a_restarted_instance_releases_against_the_first_assignment_it_applies(
    embedded_kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container restarted in place reads its assignment (the task active), then the
    operator, on its predecessor's last report, takes the task from it before the new process
    applies anything: the release is owed against what it applies, or the hand-over waits."""
    config = app_config(embedded_kafka, tmp_path)
    pod_a = for_instance(config, "pod-a")
    previous = ProgressCommitter(
        config.bootstrap_servers, config.app_id, "pod-a", config.changelog_topics()
    )
    previous.commit([TaskReport(1, ReportedRole.ACTIVE, 3, 1, {STORE: 5}, {"users": 9})])
    previous.close()
    TaskState(pod_a.state_dir, 1, pod_a.stores).close()
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    read_first = Assignment(generation=2, tasks={0: active(3), 1: active(3)})
    operator.write("pod-a", read_first)
    operator.write("pod-a", Assignment(generation=3, tasks={0: active(3)}))
    poll = AssignmentFollower.poll
    held_back: list[Assignment | None] = []

    def first_read_before_the_revoke(  # type: ignore[no-untyped-def]
        follower: AssignmentFollower, timeout: float = 0.0
    ):
        newest = poll(follower, timeout)
        if not held_back:  # start's read: as if generation 3 had not arrived yet
            held_back.append(newest)
            return read_first
        if held_back[0] is not None:  # the next read finds it
            newest, held_back[0] = held_back[0], None
        return newest

    monkeypatch.setattr(AssignmentFollower, "poll", first_read_before_the_revoke)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    with running(pod_a) as a:
        until_active(a, {0: 3})
        released = reader.reports("pod-a", PARTITIONS)[1]
    operator.close()
    reader.close()

    assert (released.role, released.epoch) == (ReportedRole.RELEASED, 3)


def test_a_restarted_instance_given_back_a_task_it_had_released_warms_it_up(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """A task the previous run released, given back as a warm-up (the operator gives a source
    a replica only after its release), is a warm-up: released again, it would hide the
    warm-up's progress, and a hand-over waiting for it might never come."""
    config = app_config(embedded_kafka, tmp_path)
    pod_a = for_instance(config, "pod-a")
    previous = ProgressCommitter(
        config.bootstrap_servers, config.app_id, "pod-a", config.changelog_topics()
    )
    previous.commit([TaskReport(1, ReportedRole.RELEASED, 3, 4, {STORE: 0})])
    previous.close()
    TaskState(pod_a.state_dir, 1, pod_a.stores).close()
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=5, tasks={0: active(4), 1: warmup(4)}))
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    with running(pod_a) as a:

        def warming_up() -> bool:
            a.tick()
            return reader.reports("pod-a", PARTITIONS)[1].role is ReportedRole.WARMUP

        wait_for(warming_up, 10, "the warm-up report")
    operator.close()
    reader.close()
