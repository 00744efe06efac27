"""Real `smoothscale worker` processes (PySpark, the smoothscale-kafka source, RocksDB, the
embedded Kafka) driven by the test acting as the operator through the assignment and report
channels. Each worker is a Spark driver (a JVM, ~7 s to start): two per test at most."""

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.progress import InputPositionCommitter, ProgressReader, ReportedRole
from smoothscale.runtime.changelog import closer, data, marker
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import catch_up
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.transactions import TaskProducer
from smoothscale.runtime.writer import Writer
from smoothscale.tasks import TaskRole
from tests.runtime.instance_helpers import (
    PARTITIONS,
    STORE,
    app_config,
    final_totals,
    for_instance,
    produce_users,
    users_batch,
)
from tests.runtime.kafka_helpers import read_committed
from tests.runtime.process_helpers import WorkerProcess, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]

GRACE_SECONDS = 30


def active(epoch: int, restore_until: dict[str, int] | None = None) -> TaskAssignment:
    return TaskAssignment(role=TaskRole.ACTIVE, epoch=epoch, restore_until=restore_until)


def role(name: TaskRole, epoch: int) -> TaskAssignment:
    return TaskAssignment(role=name, epoch=epoch)


@contextmanager
def steady_input(config: WorkerConfig, users: list[str], per_second: int) -> Iterator[None]:
    """Produce `users` at about `per_second` records a second in the background."""
    done = threading.Event()

    def run() -> None:
        chunk = max(1, per_second // 10)
        for start in range(0, len(users), chunk):
            if done.is_set():
                return
            produce_users(config, users[start : start + chunk])
            time.sleep(0.1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
        thread.join()
    finally:
        done.set()
        thread.join()


def processed_everything(config: WorkerConfig) -> bool:
    """Whether the committed input positions (group <appId>) reached every partition's end."""
    committer = InputPositionCommitter(config.bootstrap_servers, config.app_id)
    consumer = Consumer({"bootstrap.servers": config.bootstrap_servers, "group.id": "ends"})
    try:
        topic = config.input_topics[0]
        for partition in range(PARTITIONS):
            high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
            if committer.committed([topic], partition).get(topic, 0) < high:
                return False
        return True
    finally:
        committer.close()
        consumer.close()


def restored_state(config: WorkerConfig, directory: Path) -> dict[str, int]:
    """The app's state as a fresh restore of every changelog partition rebuilds it."""
    state: dict[str, int] = {}
    for task in range(PARTITIONS):
        restored = TaskState(directory, task, [STORE])
        try:
            catch_up(config, restored, None, timeout=20)
            state.update(restored.snapshot(STORE))
        finally:
            restored.close()
    return state


def assert_exactly_once(config: WorkerConfig, produced: list[str], tmp_path: Path) -> None:
    reference = dict(Counter(produced))
    assert restored_state(config, tmp_path / "verify") == reference
    totals = final_totals(config)
    assert {user: seen[-1] for user, seen in totals.items()} == reference
    for user, seen in totals.items():
        assert seen == sorted(set(seen)), f"{user}: a total was emitted twice or went back"


def test_warm_up_catches_up_then_hand_over_keeps_the_state_exact_and_sigterm_releases(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path).model_copy(
        update={"trigger_interval": 0.5, "max_records_per_partition": 200}
    )
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    operator.write("pod-b", Assignment(generation=1))
    produced = users_batch(3000)
    produce_users(config, produced[:1000])
    bad = Producer({"bootstrap.servers": config.bootstrap_servers})
    for n in range(6):
        bad.produce(config.input_topics[0], key=b"x", value=b"{not json", partition=n % 2)
    bad.flush(10)
    a = WorkerProcess(for_instance(config, "pod-a")).start()
    b = WorkerProcess(for_instance(config, "pod-b")).start()
    workers = [a, b]
    try:
        # Bounds for a loaded machine: two Spark drivers start here, often beside another
        # scenario's (pod-a took 85 s to run its query so, against 120 s for all of this).
        wait_until(
            lambda: processed_everything(config), 300, "pod-a to process the backlog", workers
        )
        with steady_input(config, produced[1000:], per_second=400):
            # Warm up task 1 at pod-b while pod-a keeps processing it.
            operator.write("pod-b", Assignment(generation=2, tasks={1: role(TaskRole.WARMUP, 1)}))

            def warm_up_lag() -> int | None:
                progress = reader.read(["pod-b"], PARTITIONS).get(("pod-b", 1))
                if progress is None or progress.report.role is not ReportedRole.WARMUP:
                    return None
                return progress.lag

            wait_until(
                lambda: (lag := warm_up_lag()) is not None and lag <= 100,
                120,
                "the warm-up to catch up",
                workers,
            )
            # Revoke from pod-a; it releases at a batch boundary with its final offsets.
            operator.write("pod-a", Assignment(generation=3, tasks={0: active(1)}))
            revoked = time.monotonic()

            def released() -> dict[str, int] | None:
                report = reader.reports("pod-a", PARTITIONS).get(1)
                if report is None or report.role is not ReportedRole.RELEASED:
                    return None
                return dict(report.positions)

            wait_until(lambda: released() is not None, 60, "pod-a to release task 1", workers)
            final_offsets = released()
            operator.write("pod-b", Assignment(generation=4, tasks={1: active(2, final_offsets)}))
            wait_until(
                lambda: (
                    (r := reader.reports("pod-b", PARTITIONS).get(1)) is not None
                    and r.role is ReportedRole.ACTIVE
                ),
                60,
                "pod-b to activate task 1",
                workers,
            )
            print(
                f"hand-over: task 1 active at pod-b {time.monotonic() - revoked:.1f} s after revoke"
            )
        wait_until(lambda: processed_everything(config), 60, "the rest of the input", workers)

        metrics = a.metrics()
        assert 'smoothscale_records_processed_total{task="0"}' in metrics
        assert 'smoothscale_dead_letters_total{reason="malformed-json"} 6.0' in metrics
        assert "smoothscale_batch_duration_seconds_count" in metrics
        # SIGTERM: both finish their batch, release everything and exit within the grace period.
        started = time.monotonic()
        for worker in workers:
            worker.terminate()
        for worker in workers:
            assert worker.wait(GRACE_SECONDS) == 0, worker.log()[-4000:]
        assert time.monotonic() - started < GRACE_SECONDS
        reports = {**reader.reports("pod-b", PARTITIONS)}
        assert reports[1].role is ReportedRole.RELEASED
        assert reader.reports("pod-a", PARTITIONS)[0].role is ReportedRole.RELEASED
    finally:
        for worker in workers:
            worker.stop()
        operator.close()
        reader.close()
    assert_exactly_once(config, produced, tmp_path)
    dead = read_committed(config.bootstrap_servers, config.dead_letters(), PARTITIONS)
    assert sorted(m.value() for m in dead) == [b"{not json"] * 6
    assert {dict(m.headers() or [])["smoothscale.reason"] for m in dead} == {b"malformed-json"}


def outputs_by_epoch(config: WorkerConfig) -> dict[str, dict[int, list[int]]]:
    """Per user, the totals emitted per writer epoch, in order (read_committed)."""
    emitted: dict[str, dict[int, list[int]]] = {}
    for message in read_committed(config.bootstrap_servers, config.output_topic, PARTITIONS):
        headers = dict(message.headers() or [])
        epoch = int(headers["smoothscale.epoch"] or b"0")
        user = (message.key() or b"").decode()
        emitted.setdefault(user, {}).setdefault(epoch, []).append(
            json.loads(message.value() or b"")
        )
    return emitted


def test_a_standby_takes_over_when_its_owner_is_killed_mid_batch_losing_and_doubling_nothing(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path).model_copy(
        update={"trigger_interval": 0.5, "max_records_per_partition": 200}
    )
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    standby = {task: role(TaskRole.STANDBY, 1) for task in range(PARTITIONS)}
    operator.write("pod-b", Assignment(generation=1, tasks=standby))
    produced = users_batch(2500)
    a = WorkerProcess(for_instance(config, "pod-a")).start()
    b = WorkerProcess(for_instance(config, "pod-b")).start()
    workers = [a, b]
    try:
        with steady_input(config, produced, per_second=300):
            wait_until(
                lambda: all(
                    (r := reader.reports("pod-a", PARTITIONS).get(t)) is not None
                    and r.positions[STORE] > 0
                    for t in range(PARTITIONS)
                ),
                120,
                "pod-a to process input",
                workers,
            )
            wait_until(
                lambda: all(
                    (p := reader.read(["pod-b"], PARTITIONS).get(("pod-b", t))) is not None
                    and p.report.role is ReportedRole.STANDBY
                    for t in range(PARTITIONS)
                ),
                60,
                "pod-b's standbys to report",
                workers,
            )
            # Bounds, not goals: two Spark drivers starting on a loaded machine take minutes.
            wait_until(b.ready, 180, "pod-b's streaming query to run", workers)
            time.sleep(1)
            # A micro-batch here takes seconds and the trigger is 0.5 s: pod-a is mid-batch.
            a.kill()
            failed_over = time.monotonic()
            operator.write(
                "pod-b",
                Assignment(generation=2, tasks={t: active(2) for t in range(PARTITIONS)}),
            )
            wait_until(
                lambda: all(
                    (r := reader.reports("pod-b", PARTITIONS).get(t)) is not None
                    and r.role is ReportedRole.ACTIVE
                    for t in range(PARTITIONS)
                ),
                90,
                "pod-b to take both tasks over",
                [b],
            )
            takeover_seconds = time.monotonic() - failed_over
        wait_until(lambda: processed_everything(config), 90, "the rest of the input", [b])
        b.terminate()
        assert b.wait(GRACE_SECONDS) == 0
    finally:
        for worker in workers:
            worker.stop()
        operator.close()
        reader.close()
    print(f"standby took over in {takeover_seconds:.1f} s")

    reference = dict(Counter(produced))
    assert restored_state(config, tmp_path / "verify") == reference
    for user, by_epoch in outputs_by_epoch(config).items():
        before, after = by_epoch.get(1, []), by_epoch.get(2, [])
        assert before == sorted(set(before)), user
        assert after == sorted(set(after)), user
        assert (after or before)[-1] == reference[user]
        # The mock broker shows an open transaction's records to read_committed readers (real
        # Kafka aborts it when the new owner initialises the task's producer): at most the one
        # batch pod-a was committing when it was killed may repeat what pod-b emits.
        repeated = [total for total in before if after and total >= after[0]]
        assert len(repeated) <= 1, f"{user}: {before} then {after}"


def test_a_warm_up_reports_itself_caught_up_while_spark_is_still_starting(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    owner = TaskProducer(config, task=0, epoch=1)
    writer = Writer(1, 0, 0)
    try:
        owner.commit({STORE: [marker(writer, "owner")]})
        for batch in range(1, 21):
            records = [data(writer, batch, f"user-{key}", batch, None) for key in range(100)]
            records.append(closer(writer, batch, {config.input_topics[0]: batch}, None))
            owner.commit({STORE: records})
    finally:
        owner.close()
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("warm", Assignment(generation=1, tasks={0: role(TaskRole.WARMUP, 1)}))
    operator.close()
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    worker = WorkerProcess(for_instance(config, "warm")).start()
    try:

        def caught_up() -> bool:
            progress = reader.read(["warm"], PARTITIONS).get(("warm", 0))
            return progress is not None and progress.lag == 0

        wait_until(caught_up, timeout=120, what="the warm-up's report", workers=[worker])
        assert not worker.ready(), "the report came only once Spark was up"
        wait_until(worker.ready, timeout=120, what="the worker to be ready", workers=[worker])
    finally:
        reader.close()
        worker.stop()


def test_a_query_whose_python_reader_starts_too_late_is_started_again_losing_nothing(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Spark waits a fixed 10 s for the Python process that runs the source's reader to
    connect back; on a starved node it can start later (seen at a gate's start, load above 10
    on two cores) and the query fails before its first batch. Here that process starts 12 s
    late, once: the worker starts its query again, and every record counts once."""
    late = tmp_path / "late"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case "$*" in *python_streaming_source_runner*)\n'
        f"  if [ ! -e {late} ]; then touch {late}; sleep 12; fi ;;\n"
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    config = app_config(embedded_kafka, tmp_path)
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    operator.close()
    produced = users_batch(600)
    produce_users(config, produced)
    worker = WorkerProcess(
        for_instance(config, "pod-a"), environment={"PYSPARK_PYTHON": str(python)}
    ).start()
    try:
        wait_until(lambda: processed_everything(config), 180, "the input processed", [worker])
        assert late.exists(), "the reader's process was started through the slow python"
        assert "starting it again (attempt 2 of 3)" in worker.log()
    finally:
        worker.stop()
    assert_exactly_once(config, produced, tmp_path)
