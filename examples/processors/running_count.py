"""A running count of records per user, as a StatefulProcessor.

The Spark job it comes from:

    df.groupBy("user").transformWithStateInPandas(
        RunningCount(), OUTPUT_SCHEMA, outputMode="Update", timeMode="None")

State per user: the count so far (a value state). Every batch that sees a user emits one row
(user, count) with the new total.

    spec.pipeline: examples.processors.running_count:pipeline

The same processor for the Row-based API (Spark 4.1+), `df.groupBy("user").transformWithState(
RunningCountRows(), OUTPUT_SCHEMA, "Update", "None")`: its handlers take and yield Rows.

    spec.pipeline: examples.processors.running_count:rows_pipeline
"""

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType

from smoothscale.runtime.processor import ProcessorPipeline
from smoothscale.runtime.processor.pipeline import ROW_API

INPUT_SCHEMA = StructType([StructField("user", StringType())])
OUTPUT_SCHEMA = StructType([StructField("user", StringType()), StructField("count", LongType())])
COUNT_SCHEMA = StructType([StructField("count", LongType())])


class RunningCount(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", COUNT_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        current = self.count.get()
        total = (current[0] if current else 0) + sum(len(frame) for frame in rows)
        self.count.update((total,))
        yield pd.DataFrame({"user": [key[0]], "count": [total]})

    def close(self) -> None:
        pass


class RunningCountRows(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", COUNT_SCHEMA)

    def handleInputRows(
        self, key: Any, rows: Iterator[Row], timerValues: TimerValues
    ) -> Iterator[Row]:
        current = self.count.get()
        total = (current[0] if current else 0) + sum(1 for _ in rows)
        self.count.update((total,))
        yield Row(user=key[0], count=total)

    def close(self) -> None:
        pass


def pipeline() -> ProcessorPipeline:
    return ProcessorPipeline(
        store="counts",
        value_schema=INPUT_SCHEMA,
        processor=RunningCount(),
        grouping_key="user",
        output_schema=OUTPUT_SCHEMA,
        output_mode="Update",
        time_mode="None",
    )


def rows_pipeline() -> ProcessorPipeline:
    return ProcessorPipeline(
        store="counts",
        value_schema=INPUT_SCHEMA,
        processor=RunningCountRows(),
        grouping_key="user",
        output_schema=OUTPUT_SCHEMA,
        output_mode="Update",
        time_mode="None",
        api=ROW_API,
    )
