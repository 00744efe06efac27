"""Session windows of clicks per user, closed by an event-time timer.

The Spark job it comes from:

    df.withWatermark("ts", "10 seconds").groupBy("user").transformWithStateInPandas(
        Sessions(), OUTPUT_SCHEMA, outputMode="Append", timeMode="EventTime")

A session is a run of a user's clicks with at most GAP_MS between two of them. State per user:
the open session (start, last click, clicks). A timer at last click + GAP_MS closes it: when the
watermark passes it, the session is emitted and forgotten. A click that arrives more than
GAP_MS after the open session's last click while its timer has not fired yet (the watermark
trails the clicks) closes the open session at once and starts a new one, so the sessions do not
depend on how the input was cut into micro-batches.

    spec.pipeline: examples.processors.session_windows:pipeline
"""

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from smoothscale.runtime.processor import ProcessorPipeline

GAP_MS = 30_000

INPUT_SCHEMA = StructType([StructField("user", StringType()), StructField("ts", TimestampType())])
OUTPUT_SCHEMA = StructType(
    [
        StructField("user", StringType()),
        StructField("start", LongType()),
        StructField("end", LongType()),
        StructField("clicks", LongType()),
    ]
)
SESSION_SCHEMA = StructType(
    [
        StructField("start", LongType()),
        StructField("last", LongType()),
        StructField("clicks", LongType()),
    ]
)


class Sessions(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", SESSION_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        clicks = sorted(
            int(ts.value // 1_000_000) for frame in rows for ts in pd.to_datetime(frame["ts"])
        )
        open_session = self.session.get()
        start, last, count = open_session if open_session else (None, None, 0)
        closed = []
        for click in clicks:
            if last is not None and click - last > GAP_MS:
                closed.append((start, last, count))
                start, last, count = None, None, 0
            start = click if start is None else min(start, click)
            last = click if last is None else max(last, click)
            count += 1
        if open_session and open_session[1] != last:
            self.handle.deleteTimer(open_session[1] + GAP_MS)
        if last is not None:
            self.session.update((start, last, count))
            self.handle.registerTimer(last + GAP_MS)
        if closed:
            yield self._rows(key[0], closed)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        session = self.session.get()
        if session is not None:
            self.session.clear()
            yield self._rows(key[0], [session])

    @staticmethod
    def _rows(user: str, sessions: list[tuple[int, int, int]]) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "user": [user] * len(sessions),
                "start": [start for start, _, _ in sessions],
                "end": [last for _, last, _ in sessions],
                "clicks": [clicks for _, _, clicks in sessions],
            }
        )

    def close(self) -> None:
        pass


def pipeline() -> ProcessorPipeline:
    return ProcessorPipeline(
        store="sessions",
        value_schema=INPUT_SCHEMA,
        processor=Sessions(),
        grouping_key="user",
        output_schema=OUTPUT_SCHEMA,
        output_mode="Append",
        time_mode="EventTime",
        event_time_column="ts",
        watermark_delay="10 seconds",
    )
