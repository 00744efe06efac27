"""A StatefulProcessor through scaling, end to end (issue 21): the session-windows processor
(examples/processors/session_windows.py, event-time timers and the watermark) as a
StreamingApp's pipeline on Spark pods, the operator installed with its chart, the real kubectl;
clicks written in three parts, `kubectl scale` 1 -> 2 after the first and 2 -> 1 after the
second, so that open sessions, their timers and each task's watermark move with the
hand-overs both ways. Every session the app emits is compared with plain Spark's
`transformWithStateInPandas` over the same three parts (one query, RocksDB state) and with the
sessions computed from the clicks: each closed session once, in order per user.

Why they must agree whatever the micro-batches: the processor closes a session when a click
comes more than the gap after it, or when the watermark passes its timer, so a session's
contents depend on the clicks alone; a last click far later on each partition moves every
task's watermark past every other session's timer."""

import io
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from examples.processors.session_windows import GAP_MS

from devstack.demo.scenario import INPUT_TOPIC, OUTPUT_TOPIC, QUIET, Session, session
from devstack.demo.timeline import read_committed
from smoothscale.runtime.processor import prepare
from smoothscale.runtime.spark import local_session
from tests.operator.processor_sessions import pipeline as sessions
from tests.operator.test_scaling import options
from tests.runtime.test_processor_examples import reference_sessions
from tests.runtime.test_processor_spark import plain_spark

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.cluster]

TASKS = 2
USERS = [f"user-{i}" for i in range(6)]
CLOSERS = {"end-0": 0, "end-1": 1}
"""A last click far later on each partition (its task): the watermark passes every session."""
START = datetime(2026, 1, 1, tzinfo=UTC)


def part(number: int) -> list[dict[str, Any]]:
    """Clicks 8 s apart per user, 4 a part; odd users pause 60 s (more than the gap) in the
    middle of the second part: sessions open across the parts, and some close inside one."""
    clicks = []
    for step in range(4 * number, 4 * number + 4):
        for index, user in enumerate(USERS):
            seconds = 8 * step + index + (60 if index % 2 and step >= 6 else 0)
            clicks.append({"user": user, "ts": (START + timedelta(seconds=seconds)).isoformat()})
    return clicks


def closing() -> list[dict[str, Any]]:
    return [
        {"user": user, "ts": (START + timedelta(days=1)).isoformat()} for user in sorted(CLOSERS)
    ]


def partition_of(user: str) -> int:
    return CLOSERS[user] if user in CLOSERS else USERS.index(user) % TASKS


def produce(running: Session, clicks: list[dict[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": running.bootstrap, **QUIET})
    for click in clicks:
        producer.produce(
            INPUT_TOPIC,
            key=click["user"].encode(),
            value=json.dumps(click).encode(),
            partition=partition_of(click["user"]),
        )
    assert producer.flush(30) == 0
    running.say(f"{len(clicks)} clicks written")


def emitted(running: Session) -> list[tuple[str, int, int, int]]:
    """Every session in the output topic, each partition in offset order."""
    found = []
    for message in read_committed(running.bootstrap, OUTPUT_TOPIC, TASKS, QUIET):
        value = json.loads(message.value() or b"{}")
        found.append((value["user"], value["start"], value["end"], value["clicks"]))
    return found


def milliseconds(clicks: list[dict[str, Any]]) -> dict[str, list[int]]:
    times: dict[str, list[int]] = {}
    for click in clicks:
        at = datetime.fromisoformat(click["ts"]) - datetime(1970, 1, 1, tzinfo=UTC)
        times.setdefault(click["user"], []).append(at // timedelta(milliseconds=1))
    return times


def test_session_windows_through_a_scale_out_and_in_equal_plain_sparks(tmp_path: Path) -> None:
    parts = [part(0), part(1), part(2) + closing()]
    clicks = [click for clicks in parts for click in clicks if click["user"] in USERS]
    expected = reference_sessions(milliseconds(clicks))  # the closers' own never close
    app = options(
        tmp_path,
        tasks=TASKS,
        keys=len(USERS),
        backlog=0,
        pipeline="tests.operator.processor_sessions:pipeline",
    )
    out = io.StringIO()
    with session(app, out) as running:
        watcher = running.watcher
        running.apply(replicas=1)
        watcher.run_until(lambda: watcher.settled(1), "one instance running")
        produce(running, parts[0])
        running.scale(2)
        watcher.run_until(lambda: watcher.settled(2), "two instances, tasks handed over")
        produce(running, parts[1])
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "back to one instance")
        produce(running, parts[2])
        watcher.run_until(
            lambda: len(emitted(running)) >= len(expected), "every session closed and emitted"
        )
        time.sleep(3 * app.trigger_interval)  # a session emitted twice would show by now
        sessions_emitted = emitted(running)
        story = out.getvalue()

    spark = local_session("test-processor-scaling")
    try:
        reference = plain_spark(spark, prepare(sessions()), parts)
    finally:
        spark.stop()
    plain = sorted((r["user"], r["start"], r["end"], r["clicks"]) for r in reference)
    assert sorted(sessions_emitted) == plain == expected, story
    assert len(set(sessions_emitted)) == len(sessions_emitted), "no session emitted twice"
    for user in {s[0] for s in sessions_emitted}:
        starts = [s[1] for s in sessions_emitted if s[0] == user]
        assert starts == sorted(starts), f"{user}'s sessions out of order"
    assert any(s[3] > 4 for s in expected), "a session spans a hand-over"
    assert GAP_MS < 60_000, "the odd users' pause closes a session"
