"""A pipeline that is a pyspark StatefulProcessor, and the checks that refuse it at start.

The factory a StreamingApp names returns a `ProcessorPipeline` holding what the user gives
Spark: the processor (the instance passed to transformWithStateInPandas, or to the Row-based
transformWithState), the grouping key (df.groupBy(...)), the output schema
(outputStructType), outputMode, timeMode and, for event time, the event-time column and the
watermark delay (df.withWatermark(column, delay)).
`prepare` checks it once, before any batch, and says which part smoothscale cannot honour.
"""

import copy
import datetime
import functools
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import DataType, StructType, TimestampType

from smoothscale.runtime.decode import RESERVED_COLUMNS
from smoothscale.runtime.pipeline import PipelineError
from smoothscale.runtime.processor.codec import UnsupportedType, check_type
from smoothscale.runtime.processor.state import (
    BatchContext,
    Declared,
    ProcessorHandle,
    ProcessorStateError,
    SchemaParser,
    TimeMode,
)

PANDAS_API = "transformWithStateInPandas"
ROW_API = "transformWithState"


@dataclass(frozen=True)
class ProcessorPipeline:
    """A StatefulProcessor run per task, as transformWithStateInPandas runs it per partition.

    The Spark job `df.withWatermark("ts", "10 seconds").groupBy("user")
    .transformWithStateInPandas(Sessions(), "user STRING, clicks LONG", "Append",
    "EventTime")` is `ProcessorPipeline(store=..., value_schema=<the JSON fields of df>,
    processor=Sessions(), grouping_key="user", output_schema="user STRING, clicks LONG",
    output_mode="Append", time_mode="EventTime", event_time_column="ts",
    watermark_delay="10 seconds")`.
    """

    store: str
    """The state store (a name from the StreamingApp's kafka.stores) that keeps all of it."""
    value_schema: StructType | str
    """The JSON record value's fields: the columns the processor's DataFrames have."""
    processor: StatefulProcessor
    """The processor instance, as given to transformWithStateInPandas. Each task's batch runs
    a copy of it (Spark too gives each partition a copy, through pickling)."""
    grouping_key: str | tuple[str, ...]
    """The column(s) of `value_schema` the processor groups by."""
    output_schema: StructType | str
    """The processor's output rows (outputStructType): each one becomes a record of the
    output topic, its key the grouping key, its value a JSON object of these fields."""
    output_mode: str = "Append"
    """Append or Update (both emit each row the processor yields once, as in Spark)."""
    time_mode: str = "None"
    """None, ProcessingTime (timers on the batch's clock, TTL) or EventTime (timers on the
    task's watermark)."""
    event_time_column: str | None = None
    """For EventTime: the TIMESTAMP field of `value_schema` the watermark follows."""
    watermark_delay: str | datetime.timedelta = datetime.timedelta(0)
    """For EventTime: how far the watermark trails the newest event time (Spark's
    withWatermark delay, e.g. "10 seconds")."""
    api: str = PANDAS_API
    """The method the Spark job calls: transformWithStateInPandas (the handlers take and yield
    pandas DataFrames) or transformWithState (they take and yield pyspark Rows)."""
    initial_state: object = None
    """transformWithState's initialState: refused (see prepare)."""

    @property
    def grouping_columns(self) -> tuple[str, ...]:
        key = self.grouping_key
        return (key,) if isinstance(key, str) else tuple(key)


@dataclass(frozen=True)
class PreparedProcessor:
    """A ProcessorPipeline checked and with its schemas parsed: what a task's batch runs."""

    pipeline: ProcessorPipeline
    value_schema: StructType
    key_schema: StructType
    output_schema: StructType
    time_mode: TimeMode
    watermark_delay_ms: int
    variables: dict[str, Declared]
    parse_schema: SchemaParser

    @property
    def processor(self) -> StatefulProcessor:
        return self.pipeline.processor

    @property
    def takes_rows(self) -> bool:
        """Whether the handlers take and yield Rows (transformWithState), not DataFrames."""
        return self.pipeline.api == ROW_API

    @property
    def store(self) -> str:
        return self.pipeline.store

    @property
    def json_input(self) -> "ProcessorInput":
        """What the runtime decodes the input records with (decode.JsonInput)."""
        ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in self.value_schema)
        return ProcessorInput(self.store, ddl, self.pipeline.grouping_columns[0])


@dataclass(frozen=True)
class ProcessorInput:
    """A processor pipeline's input as decoding sees it: the value schema as DDL, and a
    grouping column (a field of the value, never the record key)."""

    store: str
    value_schema: str
    key_column: str


class ProcessorRefused(PipelineError):
    """A processor pipeline smoothscale cannot run; the message says which part and why."""


@functools.cache
def spark_schema(ddl: str) -> DataType:
    """Parse DDL with Spark (once per text: init() runs at every batch), which needs a
    session: the worker loads its pipeline before it starts its query, so a processor that
    declares a schema as DDL starts the instance's session here (the query then runs in it)."""
    from pyspark.sql import SparkSession

    from smoothscale.runtime.spark import local_session

    if SparkSession.getActiveSession() is None:
        local_session("smoothscale-worker")
    return DataType.fromDDL(ddl)


def prepare(
    pipeline: ProcessorPipeline, parse_schema: SchemaParser = spark_schema
) -> PreparedProcessor:
    """Check `pipeline` and parse its schemas; raise ProcessorRefused saying what is wrong.

    Beside the arguments, this runs the processor's init() once against a handle that only
    records the state variables it declares (Spark does the same on its driver), so a TTL in
    the wrong time mode, a schema that does not parse or a type smoothscale cannot keep is
    refused before any batch.
    """
    what: object = pipeline.processor
    if not isinstance(what, StatefulProcessor):
        hint = (
            " (pass an instance, as to transformWithStateInPandas)"
            if isinstance(what, type)
            else ""
        )
        raise ProcessorRefused(
            f"processor is a {type(what).__name__}, not a pyspark StatefulProcessor instance{hint}"
        )
    if pipeline.api not in (PANDAS_API, ROW_API):
        raise ProcessorRefused(
            f"api {pipeline.api!r}: name the method the Spark job calls, {PANDAS_API!r} or "
            f"{ROW_API!r}"
        )
    if pipeline.initial_state is not None:
        raise ProcessorRefused(
            "initial_state (the initialState of transformWithState) is not supported: a grouping "
            "key's state lives in the task of the Kafka partition its records arrive on, which "
            "initial-state rows do not say. Write the initial state to the input topic as "
            "records the processor folds in, keyed as the input is"
        )
    time_mode = _time_mode(pipeline.time_mode)
    if pipeline.output_mode.lower() not in {"append", "update"}:
        raise ProcessorRefused(
            f"output mode {pipeline.output_mode!r}: a StatefulProcessor runs in Append or Update "
            "mode (Spark refuses Complete too)"
        )
    value_schema = _struct(pipeline.value_schema, "value schema", parse_schema)
    output_schema = _struct(pipeline.output_schema, "output schema", parse_schema)
    columns = pipeline.grouping_columns
    missing = [c for c in columns if c not in value_schema.names]
    if not columns or missing:
        raise ProcessorRefused(
            f"grouping key {pipeline.grouping_key!r}: name one or more fields of the value "
            f"schema ({', '.join(value_schema.names)})"
        )
    clashes = sorted(set(value_schema.names) & set(RESERVED_COLUMNS))
    if clashes:
        raise ProcessorRefused(
            f"value schema field(s) {', '.join(clashes)}: the decoded input rows use "
            f"{', '.join(RESERVED_COLUMNS)} for the record's own; rename those fields"
        )
    key_schema = StructType([value_schema[c] for c in columns])
    delay = _event_time(pipeline, time_mode, value_schema)
    try:
        copy.deepcopy(pipeline.processor)
    except Exception as error:
        raise ProcessorRefused(
            f"the processor cannot be copied ({type(error).__name__}: {error}); each task runs "
            "its own copy, as Spark pickles it to each partition: keep clients and open "
            "resources out of its fields until init()"
        ) from error
    variables = _declared_variables(pipeline.processor, time_mode, parse_schema)
    return PreparedProcessor(
        pipeline, value_schema, key_schema, output_schema, time_mode, delay, variables, parse_schema
    )


def _time_mode(name: str) -> TimeMode:
    for mode in TimeMode:
        if name.lower() == mode.value:
            return mode
    raise ProcessorRefused(f"time mode {name!r}: use None, ProcessingTime or EventTime")


def _struct(schema: StructType | str, what: str, parse_schema: SchemaParser) -> StructType:
    try:
        parsed = parse_schema(schema) if isinstance(schema, str) else schema
    except Exception as error:
        raise ProcessorRefused(f"{what} {schema!r} does not parse: {error}") from error
    if not isinstance(parsed, StructType) or not parsed.fields:
        raise ProcessorRefused(f"{what} {schema!r} must list fields, e.g. 'user STRING, n LONG'")
    try:
        check_type(parsed, what)
    except UnsupportedType as error:
        raise ProcessorRefused(str(error)) from error
    return parsed


def _event_time(pipeline: ProcessorPipeline, mode: TimeMode, schema: StructType) -> int:
    column = pipeline.event_time_column
    delay = _delay_ms(pipeline.watermark_delay)
    if mode is not TimeMode.EVENT_TIME:
        if column is not None or delay:
            raise ProcessorRefused(
                "an event-time column and a watermark delay are used in time mode EventTime "
                f"only; this pipeline's time mode is {pipeline.time_mode!r}"
            )
        return 0
    if column is None:
        raise ProcessorRefused(
            "time mode EventTime needs an event-time column (the column of "
            "df.withWatermark(column, delay)) and a watermark delay"
        )
    if column not in schema.names or not isinstance(schema[column].dataType, TimestampType):
        raise ProcessorRefused(
            f"event-time column {column!r} must be a TIMESTAMP field of the value schema"
        )
    return delay


_UNITS_MS = {
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}


def _delay_ms(delay: str | datetime.timedelta) -> int:
    """A watermark delay in ms: a timedelta, or Spark's interval text ("10 seconds",
    "1 minute 30 seconds", optionally after "interval")."""
    if isinstance(delay, datetime.timedelta):
        milliseconds = delay // datetime.timedelta(milliseconds=1)
    else:
        words = delay.lower().split()
        if words[:1] == ["interval"]:
            words = words[1:]
        pairs = list(zip(words[::2], words[1::2], strict=False))
        valid = bool(pairs) and len(words) % 2 == 0
        if not valid or any(
            not n.isdigit() or u.removesuffix("s") not in _UNITS_MS for n, u in pairs
        ):
            raise ProcessorRefused(
                f"watermark delay {delay!r}: write it as Spark does, e.g. '10 seconds' or "
                "'1 minute 30 seconds' (milliseconds to weeks), or give a timedelta"
            )
        milliseconds = sum(int(n) * _UNITS_MS[u.removesuffix("s")] for n, u in pairs)
    if milliseconds < 0:
        raise ProcessorRefused(f"watermark delay {delay!r} is negative")
    return milliseconds


def _declared_variables(
    processor: StatefulProcessor, time_mode: TimeMode, parse_schema: SchemaParser
) -> dict[str, Declared]:
    context = BatchContext(view=None, time_mode=time_mode, batch_time=-1, parse_schema=parse_schema)
    checked: Any = copy.deepcopy(processor)
    try:
        checked.init(ProcessorHandle(context))
        checked.close()
    except (ProcessorStateError, UnsupportedType) as error:
        raise ProcessorRefused(f"the processor's init(): {error}") from error
    return context.declared
