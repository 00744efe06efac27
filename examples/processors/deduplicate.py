"""Deduplication of events by id, forgetting an id an hour after it was first seen (TTL).

The Spark job it comes from:

    df.groupBy("id").transformWithStateInPandas(
        Deduplicate(), OUTPUT_SCHEMA, outputMode="Append", timeMode="ProcessingTime")

State per id: whether it was seen, a value state with a TTL of TTL_MS. The first event of an id
is emitted; its repeats within the TTL are dropped; once the TTL has passed the id is gone
from the state (on every owner of its task), and an event with it is new again.

    spec.pipeline: examples.processors.deduplicate:pipeline
"""

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BooleanType, StringType, StructField, StructType

from smoothscale.runtime.processor import ProcessorPipeline

TTL_MS = 3_600_000

INPUT_SCHEMA = StructType([StructField("id", StringType()), StructField("payload", StringType())])
OUTPUT_SCHEMA = INPUT_SCHEMA
SEEN_SCHEMA = StructType([StructField("seen", BooleanType())])


class Deduplicate(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.seen = handle.getValueState("seen", SEEN_SCHEMA, TTL_MS)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        if self.seen.exists():
            return
        first = next(rows).head(1)
        self.seen.update((True,))
        yield first[["id", "payload"]]

    def close(self) -> None:
        pass


def pipeline() -> ProcessorPipeline:
    return ProcessorPipeline(
        store="dedup",
        value_schema=INPUT_SCHEMA,
        processor=Deduplicate(),
        grouping_key="id",
        output_schema=OUTPUT_SCHEMA,
        output_mode="Append",
        time_mode="ProcessingTime",
    )
