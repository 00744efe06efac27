"""What smoothscale refuses of a processor pipeline at start, and the message that says which
part (everything here is checked before the first batch, without Spark)."""

import datetime
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest
from examples.processors import running_count, session_windows
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    CalendarIntervalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from smoothscale.runtime.processor import ProcessorPipeline, ProcessorRefused, prepare

EVENTS = StructType([StructField("user", StringType()), StructField("ts", TimestampType())])
OUT = StructType([StructField("user", StringType())])
N = StructType([StructField("n", LongType())])


class WithTTL(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.seen = handle.getValueState("seen", N, 60_000)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        return iter([])


class Twice(WithTTL):
    def init(self, handle: StatefulProcessorHandle) -> None:
        handle.getValueState("n", N)
        handle.getListState("n", N)


class Interval(WithTTL):
    def init(self, handle: StatefulProcessorHandle) -> None:
        handle.getValueState("n", StructType([StructField("i", CalendarIntervalType())]))


class HoldsALock(WithTTL):
    def __init__(self) -> None:
        self.lock = threading.Lock()


def pipeline(processor: Any = None, **changes: Any) -> ProcessorPipeline:
    return ProcessorPipeline(
        **{
            "store": "s",
            "value_schema": EVENTS,
            "processor": WithTTL() if processor is None else processor,
            "grouping_key": "user",
            "output_schema": OUT,
            "time_mode": "ProcessingTime",
            **changes,
        }
    )


def test_the_examples_are_accepted() -> None:
    assert prepare(running_count.pipeline()).time_mode.name == "NONE"
    assert prepare(running_count.rows_pipeline()).takes_rows
    prepared = prepare(session_windows.pipeline())
    assert prepared.watermark_delay_ms == 10_000
    assert set(prepared.variables) == {"session"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"processor": WithTTL}, "pass an instance"),
        ({"processor": "WithTTL"}, "not a pyspark StatefulProcessor"),
        ({"time_mode": "Wallclock"}, "time mode 'Wallclock'"),
        ({"output_mode": "Complete"}, "Append or Update"),
        ({"grouping_key": "account"}, "grouping key 'account'"),
        ({"grouping_key": ()}, "grouping key ()"),
        ({"time_mode": "None"}, "needs time mode ProcessingTime"),
        ({"time_mode": "EventTime", "event_time_column": "ts"}, "needs time mode ProcessingTime"),
        ({"processor": Twice()}, "declared twice"),
        ({"processor": Interval()}, "cannot keep"),
        ({"processor": HoldsALock()}, "cannot be copied"),
        ({"output_schema": StructType([])}, "must list fields"),
        ({"event_time_column": "ts"}, "EventTime only"),
        ({"time_mode": "EventTime"}, "needs an event-time column"),
        ({"time_mode": "EventTime", "event_time_column": "user"}, "must be a TIMESTAMP"),
        ({"api": "applyInPandasWithState"}, "api 'applyInPandasWithState'"),
        ({"initial_state": object()}, "initial_state .* is not supported"),
    ],
)
def test_a_part_smoothscale_cannot_honour_is_refused_and_named(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ProcessorRefused, match=message):
        prepare(pipeline(**changes))


@pytest.mark.parametrize(
    ("delay", "milliseconds"),
    [
        ("10 seconds", 10_000),
        ("1 minute 30 seconds", 90_000),
        ("interval 2 hours", 7_200_000),
        ("500 milliseconds", 500),
        (datetime.timedelta(minutes=1), 60_000),
    ],
)
def test_a_watermark_delay_is_read_as_spark_writes_it(delay: Any, milliseconds: int) -> None:
    prepared = prepare(replace(session_windows.pipeline(), watermark_delay=delay))
    assert prepared.watermark_delay_ms == milliseconds


@pytest.mark.parametrize("delay", ["10", "ten seconds", "10 fortnights", "1 month", "-5 seconds"])
def test_a_watermark_delay_spark_would_not_read_is_refused(delay: str) -> None:
    with pytest.raises(ProcessorRefused, match="watermark delay"):
        prepare(replace(session_windows.pipeline(), watermark_delay=delay))
