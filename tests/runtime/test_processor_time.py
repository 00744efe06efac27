"""Time in a StatefulProcessor, per task: TTL, processing- and event-time timers, and the
watermark, all kept in the task's store, so they move with a hand-over exactly."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from examples.processors import deduplicate, session_windows
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType

from smoothscale.runtime.processor import ProcessorPipeline
from tests.runtime.processor_helpers import ProcessorTask, at, ms

EVENTS = StructType([StructField("user", StringType()), StructField("delay", LongType())])
FIRED = StructType([StructField("user", StringType()), StructField("at", LongType())])
N = StructType([StructField("n", LongType())])


class Reminders(StatefulProcessor):
    """Registers a processing-time timer `delay` ms after the batch's time for each row (a
    negative delay deletes every timer of the user); emits each timer as it fires."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        now = timerValues.getCurrentProcessingTimeInMs()
        for frame in rows:
            for delay in frame["delay"]:
                if delay < 0:
                    for timer in list(self.handle.listTimers()):
                        self.handle.deleteTimer(timer)
                else:
                    self.handle.registerTimer(now + int(delay))
        return iter([])

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"user": [key[0]], "at": [expiredTimerInfo.getExpiryTimeInMs()]})

    def close(self) -> None:
        pass


def reminders() -> ProcessorPipeline:
    return ProcessorPipeline(
        store="reminders",
        value_schema=EVENTS,
        processor=Reminders(),
        grouping_key="user",
        output_schema=FIRED,
        time_mode="ProcessingTime",
    )


def fired(outcome: Any) -> list[tuple[str, int]]:
    return [(user, value["at"]) for user, value in outcome.outputs]


def test_processing_time_timers_fire_once_in_time_order(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", reminders())
    task.run([{"user": "ann", "delay": 300}, {"user": "bob", "delay": 100}], now=1_000)
    task.run([{"user": "ann", "delay": 100}, {"user": "ann", "delay": 100}], now=1_050)

    assert fired(task.run([], now=1_149)) == [("bob", 1_100)]
    assert fired(task.run([], now=1_400)) == [("ann", 1_150), ("ann", 1_300)]
    assert fired(task.run([], now=9_000)) == []
    task.close()


def test_a_deleted_timer_never_fires(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", reminders())
    task.run([{"user": "ann", "delay": 100}, {"user": "bob", "delay": 100}], now=0)
    task.run([{"user": "ann", "delay": -1}], now=10)
    assert fired(task.run([], now=500)) == [("bob", 100)]
    task.close()


def test_a_timer_registered_on_the_old_owner_fires_once_on_the_new_one(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", reminders())
    task.run([{"user": "ann", "delay": 100}, {"user": "bob", "delay": 5_000}], now=0)
    assert fired(task.run([], now=200)) == [("ann", 100)]

    successor = task.handed_over(tmp_path / "b", compacted=True)
    assert fired(successor.run([], now=300)) == []
    assert fired(successor.run([], now=6_000)) == [("bob", 5_000)]
    assert fired(successor.run([], now=9_000)) == []
    successor.close()


def test_processing_time_never_goes_back_on_a_new_owner_whose_clock_is_behind(
    tmp_path: Path,
) -> None:
    task = ProcessorTask(tmp_path / "a", reminders())
    task.run([{"user": "ann", "delay": 100}], now=10_000)
    successor = task.handed_over(tmp_path / "b")
    # The new owner's clock says 5 s: the task's time stays at 10 s, the timer at 10.1 s.
    assert fired(successor.run([], now=5_000)) == []
    assert fired(successor.run([], now=10_100)) == [("ann", 10_100)]
    successor.close()


def test_deduplication_forgets_an_id_once_its_ttl_has_passed_on_every_owner(
    tmp_path: Path,
) -> None:
    ttl = deduplicate.TTL_MS
    task = ProcessorTask(tmp_path / "a", deduplicate.pipeline())
    first = task.run([{"id": "x", "payload": "1"}, {"id": "x", "payload": "2"}], now=0)
    assert first.outputs == [("x", {"id": "x", "payload": "1"})]
    assert task.run([{"id": "x", "payload": "3"}], now=ttl - 1).outputs == []

    successor = task.handed_over(tmp_path / "b", compacted=True)
    evicting = successor.run([], now=ttl)
    assert evicting.evicted == 1
    assert not [key for key in successor.contents() if key.startswith(('v"seen"', "x"))]
    again = successor.run([{"id": "x", "payload": "4"}], now=ttl + 1)
    assert again.outputs == [("x", {"id": "x", "payload": "4"})]
    successor.close()


class Tagged(StatefulProcessor):
    """A list and a map with a TTL of 1 s: appends (user, delay) as an element and an entry."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.list = handle.getListState("list", N, 1_000)
        self.map = handle.getMapState("map", N, N, 1_000)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        for frame in rows:
            for n in frame["delay"]:
                self.list.appendValue((int(n),))
                self.map.updateValue((int(n),), (int(n),))
        yield pd.DataFrame(
            {
                "user": [key[0]],
                "at": [len(list(self.list.get())) * 100 + len(list(self.map.keys()))],
            }
        )

    def close(self) -> None:
        pass


def test_list_elements_and_map_entries_expire_one_by_one(tmp_path: Path) -> None:
    pipeline = ProcessorPipeline(
        store="tagged",
        value_schema=EVENTS,
        processor=Tagged(),
        grouping_key="user",
        output_schema=FIRED,
        time_mode="ProcessingTime",
    )
    task = ProcessorTask(tmp_path / "a", pipeline)
    task.run([{"user": "ann", "delay": 1}], now=0)
    assert fired(task.run([{"user": "ann", "delay": 2}], now=500)) == [("ann", 202)]
    # At 1 s the first element and entry expire: unseen at once, evicted at the batch's end.
    outcome = task.run([{"user": "ann", "delay": 3}], now=1_000)
    assert fired(outcome) == [("ann", 202)]
    assert outcome.evicted == 2
    assert task.run([], now=2_000).evicted == 4
    assert not task.contents().keys() - {"w"}
    task.close()


def sessions_of(outcome: Any) -> list[tuple[str, int, int, int]]:
    return [(u, v["start"], v["end"], v["clicks"]) for u, v in outcome.outputs]


def test_a_session_closes_when_the_tasks_watermark_passes_its_timer(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", session_windows.pipeline())
    task.run([{"user": "ann", "ts": at(100)}, {"user": "ann", "ts": at(120)}])
    # The watermark follows the newest event time minus 10 s, one batch behind (as in Spark).
    assert task.run([{"user": "bob", "ts": at(155)}]).watermark == 110_000
    assert sessions_of(task.run([{"user": "bob", "ts": at(170)}])) == []  # watermark 145 s
    closed = task.run([])  # watermark 160 s: ann's timer at 150 s fires
    assert closed.watermark == 160_000
    assert sessions_of(closed) == [("ann", ms(100), ms(120), 2)]
    task.close()


def test_the_watermark_moves_with_the_task_and_late_rows_stay_dropped(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", session_windows.pipeline())
    task.run([{"user": "ann", "ts": at(100)}])
    task.run([{"user": "bob", "ts": at(101)}])  # runs at watermark 90 s

    successor = task.handed_over(tmp_path / "b", compacted=True)
    late = successor.run([{"user": "cat", "ts": at(85)}, {"user": "cat", "ts": at(95)}])
    assert late.late_rows == 1  # 85 s is at or below the 90 s the previous batch ran with
    assert late.watermark == 91_000
    final = successor.run([{"user": "dan", "ts": at(1_000)}])
    final = successor.run([])
    assert sorted(sessions_of(final)) == [
        ("ann", ms(100), ms(100), 1),
        ("bob", ms(101), ms(101), 1),
        ("cat", ms(95), ms(95), 1),
    ]
    successor.close()


def test_each_task_has_its_own_watermark(tmp_path: Path) -> None:
    busy = ProcessorTask(tmp_path / "busy", session_windows.pipeline())
    quiet = ProcessorTask(tmp_path / "quiet", session_windows.pipeline())
    busy.run([{"user": "ann", "ts": at(1_000)}])
    quiet.run([{"user": "bob", "ts": at(10)}])
    assert busy.run([]).watermark == 990_000
    assert quiet.run([{"user": "bob", "ts": at(11)}]).late_rows == 0
    busy.close()
    quiet.close()
