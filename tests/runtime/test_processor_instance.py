"""A processor pipeline (a pyspark StatefulProcessor) run by the instance, over the embedded
Kafka, with micro-batches fed the way the worker feeds them but without Spark (`feed_rows`):
state, outputs and dead letters committed in each task's transaction, hand-overs, late rows,
and the batches without input that timers call for."""

import dataclasses
import datetime
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from confluent_kafka import Producer
from examples.processors.deduplicate import TTL_MS
from examples.processors.deduplicate import pipeline as deduplicate
from examples.processors.running_count import RunningCount
from examples.processors.running_count import pipeline as running_count
from examples.processors.session_windows import pipeline as session_windows
from pyspark.sql.streaming.stateful_processor import TimerValues

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.progress import ProgressReader, ReportedRole
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.decode import PIPELINE_ERROR, REASON_HEADER
from smoothscale.runtime.pipeline import load_pipeline
from smoothscale.runtime.processor import PreparedProcessor, ProcessorRefused, prepare
from smoothscale.runtime.processor.loop import due_without_input
from smoothscale.runtime.worker import dead_letter_sender
from smoothscale.tasks import TaskRole
from tests.runtime.instance_helpers import (
    PARTITIONS,
    STORE,
    app_config,
    feed_rows,
    for_instance,
    produce_users,
    running,
    ticked,
    until_active,
    user_partition,
    users_batch,
)
from tests.runtime.kafka_helpers import read_committed, wait_for
from tests.runtime.processor_helpers import ProcessorTask, at


def active(epoch: int, restore_until: dict[str, int] | None = None) -> TaskAssignment:
    return TaskAssignment(role=TaskRole.ACTIVE, epoch=epoch, restore_until=restore_until)


def in_store(pipeline: Any) -> PreparedProcessor:
    """An example processor pipeline, prepared, keeping its state in the test app's store."""
    return prepare(dataclasses.replace(pipeline, store=STORE))


def outputs(config: WorkerConfig, topic: str | None = None) -> list[tuple[str, Any]]:
    return [
        ((m.key() or b"").decode(), json.loads(m.value() or b""))
        for m in read_committed(config.bootstrap_servers, topic or config.output_topic, PARTITIONS)
    ]


def test_a_processors_state_and_outputs_stay_exact_through_a_hand_over(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    prepared = in_store(running_count())
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    reader = ProgressReader(config.bootstrap_servers, config.app_id, config.changelog_topics())
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    operator.write("pod-b", Assignment(generation=1))
    produced = users_batch(120)
    produce_users(config, produced[:60])
    with (
        running(for_instance(config, "pod-a"), prepared) as a,
        running(for_instance(config, "pod-b"), prepared) as b,
    ):
        until_active(a, {0: 1, 1: 1})
        feed_rows(a)
        operator.write(
            "pod-b",
            Assignment(generation=2, tasks={1: TaskAssignment(role=TaskRole.WARMUP, epoch=1)}),
        )
        produce_users(config, produced[60:90])
        feed_rows(a)
        operator.write("pod-a", Assignment(generation=3, tasks={0: active(1)}))
        wait_for(lambda: ticked(a).active_tasks() == {0: 1}, 10, "the release")
        released = reader.reports("pod-a", PARTITIONS)[1]
        assert released.role is ReportedRole.RELEASED
        operator.write(
            "pod-b", Assignment(generation=4, tasks={1: active(2, dict(released.positions))})
        )
        until_active(b, {1: 2})
        produce_users(config, produced[90:])
        while feed_rows(a) + feed_rows(b):
            pass
        counts = {
            **{k: v for k, v in a.state_snapshot(0).items() if k.startswith("v")},
            **{k: v for k, v in b.state_snapshot(1).items() if k.startswith("v")},
        }
    operator.close()
    reader.close()

    reference = Counter(produced)
    assert counts == {f'v"count"["{user}"]': {"v": [n]} for user, n in reference.items()}
    totals: dict[str, list[int]] = {}
    for key, value in outputs(config):
        assert value["user"] == key
        totals.setdefault(key, []).append(value["count"])
    assert {user: seen[-1] for user, seen in totals.items()} == dict(reference)
    for user, seen in totals.items():
        assert seen == sorted(set(seen)), f"{user}: a count was emitted twice or went back"
    assert {user_partition(user) for user in reference} == {0, 1}, "both tasks were exercised"


class FailsOnUserThree(RunningCount):
    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        if key == ("user-3",):
            raise ValueError("no user-3 here")
        yield from super().handleInputRows(key, rows, timerValues)


def test_a_handler_raising_on_a_key_sends_its_records_to_dead_letters_and_commits_the_rest(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    prepared = in_store(dataclasses.replace(running_count(), processor=FailsOnUserThree()))
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    produced = users_batch(21)
    produce_users(config, produced)
    sender = dead_letter_sender(config.dead_letters())
    with running(for_instance(config, "pod-a"), prepared, sender) as a:
        until_active(a, {0: 1, 1: 1})
        assert feed_rows(a) == len(produced)
        per_task = Counter(user_partition(user) for user in produced)
        assert a.read_from() == {(config.input_topics[0], t): n for t, n in per_task.items()}
    operator.close()

    reference = Counter(user for user in produced if user != "user-3")
    assert dict(outputs(config)) == {
        user: {"user": user, "count": n} for user, n in reference.items()
    }
    dead = read_committed(config.bootstrap_servers, config.dead_letters(), PARTITIONS)
    assert sorted(json.loads(m.value() or b"")["user"] for m in dead) == ["user-3"] * 3
    assert {dict(m.headers() or [])[REASON_HEADER] for m in dead} == {PIPELINE_ERROR.encode()}


def produce_clicks(config: WorkerConfig, clicks: list[tuple[str, float]]) -> None:
    """(user, seconds after the epoch) clicks, all to partition 0, the time as ISO text."""
    producer = Producer({"bootstrap.servers": config.bootstrap_servers})
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    for user, seconds in clicks:
        ts = (epoch + datetime.timedelta(seconds=seconds)).isoformat()
        value = json.dumps({"user": user, "ts": ts}).encode()
        producer.produce(config.input_topics[0], key=user.encode(), value=value, partition=0)
    producer.flush(10)


def test_a_quiet_tasks_event_time_timer_fires_without_input_and_late_rows_are_dropped(
    embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    config = app_config(embedded_kafka, tmp_path)
    prepared = in_store(session_windows())
    operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
    operator.write("pod-a", Assignment(generation=1, tasks={0: active(1), 1: active(1)}))
    with running(for_instance(config, "pod-a"), prepared) as a:
        until_active(a, {0: 1, 1: 1})
        produce_clicks(config, [("ann", 1), ("ann", 2), ("ann", 3)])
        feed_rows(a)
        # Bob's click moves the newest event time to 100 s; the batch that reads it still
        # runs at the watermark of the batches before it (0), as Spark's does.
        produce_clicks(config, [("bob", 100)])
        feed_rows(a)
        assert outputs(config) == []
        # No input: the watermark moves to 90 s in a batch of its own, and ann's session
        # timer (3 s + the 30 s gap) fires.
        assert a.run_due_without_input() == [0]
        assert outputs(config) == [
            ("ann", {"user": "ann", "start": 1000, "end": 3000, "clicks": 3})
        ]
        assert a.run_due_without_input() == [], "nothing is due any more"
        # A click at 50 s is at or below the watermark (90 s): dropped, and counted.
        produce_clicks(config, [("cid", 50)])
        feed_rows(a)
        late = a.metrics.registry.get_sample_value("smoothscale_late_rows_total", {"task": "0"})
        assert late == 1
        assert a.read_from()[(config.input_topics[0], 0)] == 5
    operator.close()
    assert [key for key, _ in outputs(config)] == ["ann"]


def refused_pipeline() -> Any:
    return dataclasses.replace(running_count(), output_mode="Complete")


def test_load_pipeline_prepares_a_processor_pipeline_and_refuses_one_it_cannot_run() -> None:
    loaded = load_pipeline("examples.processors.session_windows:pipeline")
    assert isinstance(loaded, PreparedProcessor)
    assert loaded.watermark_delay_ms == 10_000
    with pytest.raises(ProcessorRefused, match="output mode 'Complete'"):
        load_pipeline("tests.runtime.test_processor_instance:refused_pipeline")


def test_only_a_due_timer_ttl_deadline_or_watermark_move_calls_for_a_batch_without_input(
    tmp_path: Path,
) -> None:
    dedup = ProcessorTask(tmp_path / "dedup", deduplicate())
    dedup.run([{"id": "x", "payload": "p"}], now=1_000)
    deadline = 1_000 + TTL_MS
    assert not due_without_input(dedup.prepared, dedup.state, deadline - 1)
    assert due_without_input(dedup.prepared, dedup.state, deadline)

    counts = ProcessorTask(tmp_path / "counts", running_count())
    counts.run([{"user": "ann"}])
    assert not due_without_input(counts.prepared, counts.state, 10**12)

    sessions = ProcessorTask(tmp_path / "sessions", session_windows())
    sessions.run([{"user": "ann", "ts": at(5)}])
    assert not due_without_input(sessions.prepared, sessions.state, 0), "5 s - 10 s is below 0"
    sessions.run([{"user": "bob", "ts": at(20)}])
    assert due_without_input(sessions.prepared, sessions.state, 0), "the watermark moves to 10 s"
    sessions.run([])
    assert not due_without_input(sessions.prepared, sessions.state, 0)
