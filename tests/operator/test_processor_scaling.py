"""StatefulProcessors through scaling, end to end (issue 21): each example processor
(examples/processors: a running count, deduplication with a TTL, session windows closed by
event-time timers) as a StreamingApp's pipeline on Spark pods, the operator installed with its
chart, the real kubectl; input written in three parts, `kubectl scale` 1 -> 2 after the first
and 2 -> 1 after the second, so that each task's state (and timers, and watermark) moves with
the hand-overs both ways. The app's outputs are compared with plain Spark's
`transformWithStateInPandas` over the same three parts (one query, RocksDB state) and with what
the input says, record by record where the outputs do not depend on the micro-batches:

- running count (Update: a user's total in every batch that sees the user): per user the
  totals strictly rise (nothing repeated or out of order) and the last is the user's number of
  records, as plain Spark's last;
- deduplication: every output record, the first event of each id, once (within the TTL);
- session windows: every closed session once, in order per user. A session's contents depend
  on the clicks alone (a click more than the gap after a session closes it, and so does the
  watermark passing its timer), and a last click far later on each partition moves every
  task's watermark past every other session's timer."""

import importlib
import io
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from devstack.demo.scenario import INPUT_TOPIC, OUTPUT_TOPIC, QUIET, Session, session
from devstack.demo.timeline import read_committed
from smoothscale.runtime.processor import prepare
from smoothscale.runtime.spark import local_session
from tests.operator.test_scaling import options
from tests.runtime.test_processor_examples import reference_sessions
from tests.runtime.test_processor_spark import plain_spark

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.cluster]

TASKS = 2
USERS = [f"user-{i}" for i in range(6)]
CLOSERS = {"end-0": 0, "end-1": 1}
"""A last click far later on each partition (its task): the watermark passes every session."""
START = datetime(2026, 1, 1, tzinfo=UTC)


def clicks(number: int) -> list[dict[str, Any]]:
    """Part `number` of the clicks: 8 s apart per user, 4 a part; odd users pause 60 s (more
    than the gap) in the middle of the second part: sessions open across the parts, and some
    close inside one. The last part ends with the closers."""
    found = []
    for step in range(4 * number, 4 * number + 4):
        for index, user in enumerate(USERS):
            seconds = 8 * step + index + (60 if index % 2 and step >= 6 else 0)
            found.append({"user": user, "ts": (START + timedelta(seconds=seconds)).isoformat()})
    if number == 2:
        later = (START + timedelta(days=1)).isoformat()
        found += [{"user": user, "ts": later} for user in sorted(CLOSERS)]
    return found


def events(number: int) -> list[dict[str, Any]]:
    """Part `number` of the deduplication's events: ids seen in earlier parts come again."""
    return [
        {"id": f"id-{(7 * i + 3 * number) % 17}", "payload": f"{number}.{i}"} for i in range(20)
    ]


def users(number: int) -> list[dict[str, Any]]:
    """Part `number` of the running count's records."""
    return [{"user": USERS[(5 * i + number) % len(USERS)]} for i in range(18)]


@dataclass(frozen=True)
class Case:
    pipeline: str
    """The pods' spec.pipeline.ref (tests/operator/processor_apps.py)."""
    key: str
    """The grouping field, which is the record key (a key's records in one partition)."""
    part: Callable[[int], list[dict[str, Any]]]
    compared: Callable[[list[dict[str, Any]]], Any]
    """What must be equal, from output rows in offset order per partition."""
    expected: Callable[[list[dict[str, Any]]], Any]
    """The same, computed from the input."""


def last_totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Per user the last total, after checking that the user's totals strictly rise."""
    totals: dict[str, list[int]] = {}
    for row in rows:
        totals.setdefault(row["user"], []).append(row["count"])
    for user, seen in totals.items():
        assert seen == sorted(set(seen)), f"{user}'s totals repeat or go back: {seen}"
    return {user: seen[-1] for user, seen in totals.items()}


def every_record(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(row.items())) for row in rows)


def sessions_in_order(rows: list[dict[str, Any]]) -> list[tuple[str, int, int, int]]:
    found = [(r["user"], r["start"], r["end"], r["clicks"]) for r in rows]
    for user in {s[0] for s in found}:
        starts = [s[1] for s in found if s[0] == user]
        assert starts == sorted(set(starts)), f"{user}'s sessions repeat or are out of order"
    return sorted(found)


def milliseconds(records: list[dict[str, Any]]) -> dict[str, list[int]]:
    times: dict[str, list[int]] = {}
    for click in records:
        if click["user"] in CLOSERS:
            continue  # their own sessions never close
        at = datetime.fromisoformat(click["ts"]) - datetime(1970, 1, 1, tzinfo=UTC)
        times.setdefault(click["user"], []).append(at // timedelta(milliseconds=1))
    return times


def first_of_each_id(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    first: dict[str, dict[str, Any]] = {}
    for record in records:
        first.setdefault(record["id"], record)
    return every_record(list(first.values()))


CASES = {
    "running_count": Case(
        "tests.operator.processor_apps:counts",
        "user",
        users,
        last_totals,
        lambda records: dict(Counter(r["user"] for r in records)),
    ),
    "deduplicate": Case(
        "tests.operator.processor_apps:first_seen", "id", events, every_record, first_of_each_id
    ),
    "session_windows": Case(
        "tests.operator.processor_apps:sessions",
        "user",
        clicks,
        sessions_in_order,
        lambda records: reference_sessions(milliseconds(records)),
    ),
}


def partition_of(key: str) -> int:
    """Closers to their own partitions; any other key by a stable hash of its own."""
    return CLOSERS[key] if key in CLOSERS else sum(key.encode()) % TASKS


def produce(running: Session, case: Case, records: list[dict[str, Any]]) -> None:
    producer = Producer({"bootstrap.servers": running.bootstrap, **QUIET})
    for record in records:
        key = str(record[case.key])
        producer.produce(
            INPUT_TOPIC,
            key=key.encode(),
            value=json.dumps(record).encode(),
            partition=partition_of(key),
        )
    assert producer.flush(30) == 0
    running.say(f"{len(records)} records written")


def emitted(running: Session) -> list[dict[str, Any]]:
    """Every output row, each partition in offset order."""
    return [
        json.loads(message.value() or b"{}")
        for message in read_committed(running.bootstrap, OUTPUT_TOPIC, TASKS, QUIET)
    ]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_processor_through_a_scale_out_and_in_agrees_with_plain_spark(
    name: str, tmp_path: Path
) -> None:
    case = CASES[name]
    parts = [case.part(number) for number in range(3)]
    expected = case.expected([record for part in parts for record in part])
    app = options(tmp_path, tasks=TASKS, keys=len(USERS), backlog=0, pipeline=case.pipeline)
    out = io.StringIO()
    with session(app, out) as running:
        watcher = running.watcher

        def caught_up() -> bool:
            try:
                return bool(case.compared(emitted(running)) == expected)
            except AssertionError:
                return False

        running.apply(replicas=1)
        watcher.run_until(lambda: watcher.settled(1), "one instance running")
        produce(running, case, parts[0])
        running.scale(2)
        watcher.run_until(lambda: watcher.settled(2), "two instances, tasks handed over")
        produce(running, case, parts[1])
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "back to one instance")
        produce(running, case, parts[2])
        watcher.run_until(caught_up, "every output the input calls for")
        time.sleep(3 * app.trigger_interval)  # an output emitted twice would show by now
        outputs = emitted(running)
        story = out.getvalue()

    spark = local_session("test-processor-scaling")
    try:
        module, factory = case.pipeline.split(":")
        pipeline = getattr(importlib.import_module(module), factory)()
        reference = plain_spark(spark, prepare(pipeline), parts)
    finally:
        spark.stop()
    assert case.compared(outputs) == expected, story
    assert case.compared(reference) == expected, "plain Spark agrees with the input"
