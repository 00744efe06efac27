"""One task's micro-batch through a StatefulProcessor, on the driver.

The order is Spark's (TransformWithStateExec, one partition): a copy of the processor gets
init(handle); handleInputRows runs once per grouping key of the batch, keys in ascending
order, each with an iterator of its rows in input order (pandas DataFrames for
transformWithStateInPandas, pyspark Rows for transformWithState); then
handleExpiredTimer for each timer due (processing time: at or before the batch's time; event
time: at or before the task's watermark), in time order, each deleted once its handler has
run; then close(); then the values whose TTL has passed are evicted. The result is the
batch's state changes and output records, which the runtime commits in the task's transaction
with its input position, or not at all.
"""

import copy
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import StructType

from smoothscale.runtime.processor import keyspace
from smoothscale.runtime.processor.codec import from_json, output_json, plain, to_json
from smoothscale.runtime.processor.pipeline import PreparedProcessor
from smoothscale.runtime.processor.state import (
    BatchContext,
    BatchView,
    Phase,
    ProcessorHandle,
    TimeMode,
    delete_timer,
)
from smoothscale.runtime.store import TaskState

ROWS_PER_FRAME = 10_000
"""Most rows in one DataFrame handed to handleInputRows (Spark's default
spark.sql.execution.arrow.maxRecordsPerBatch)."""

INITIAL_WATERMARK = 0
"""A task's watermark before it has seen an event time (Spark's first batch has 0)."""

Output = tuple[str, Any]


@dataclass
class ProcessorOutcome:
    """What one task's micro-batch did, for the runtime to commit."""

    changes: dict[str, Any] = field(default_factory=dict)
    """State key -> its new JSON value, or None to delete it."""
    outputs: list[Output] = field(default_factory=list)
    """Output records: the grouping key as text, and a JSON object of the output schema."""
    failed_keys: list[tuple[tuple[Any, ...], BaseException]] = field(default_factory=list)
    """Grouping keys whose handleInputRows raised: their state is as before the batch, and
    their rows are for the dead-letter topic."""
    failed_timers: list[tuple[tuple[Any, ...], int, BaseException]] = field(default_factory=list)
    """Timers whose handleExpiredTimer raised: deleted (a timer fires once), their handler's
    state changes undone."""
    late_rows: int = 0
    """Rows at or below the watermark of the previous batch, dropped as Spark drops them."""
    fired: int = 0
    evicted: int = 0
    """Values, list elements and map entries removed because their TTL passed."""
    watermark: int = -1
    """The task's watermark this batch ran with (-1 outside EventTime)."""


@dataclass(frozen=True)
class Clocks:
    """A task's clocks, kept in its store: they move with the task and never go back."""

    processing_time: int = -1
    max_event_time: int | None = None
    watermark: int = INITIAL_WATERMARK

    def as_json(self) -> dict[str, Any]:
        return {
            "processingTime": self.processing_time,
            "maxEventTime": self.max_event_time,
            "watermark": self.watermark,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any] | None) -> "Clocks":
        if value is None:
            return cls()
        return cls(value["processingTime"], value["maxEventTime"], value["watermark"])


def run_batch(
    prepared: PreparedProcessor, state: TaskState, rows: pd.DataFrame, now_ms: int
) -> ProcessorOutcome:
    """Run one task's micro-batch: `rows` are its decoded input records in input order (the
    value schema's columns), `now_ms` the driver's clock. Reads `state`, never writes it."""
    pipeline = prepared.pipeline
    view = BatchView(state, pipeline.store)
    clocks = Clocks.from_json(view.get(keyspace.CLOCKS))
    mode = prepared.time_mode
    outcome = ProcessorOutcome()
    batch_time = -1 if mode is TimeMode.NONE else max(now_ms, clocks.processing_time)
    watermark = -1
    max_event_time = clocks.max_event_time
    if mode is TimeMode.EVENT_TIME:
        rows, max_event_time, outcome.late_rows = _drop_late(prepared, rows, clocks)
        watermark = clocks.watermark
        if clocks.max_event_time is not None:
            watermark = max(watermark, clocks.max_event_time - prepared.watermark_delay_ms)
        outcome.watermark = watermark
    context = BatchContext(view, mode, batch_time, prepared.parse_schema)
    timer_values = TimerValues(batch_time, watermark)
    processor: Any = copy.deepcopy(prepared.processor)
    processor.init(ProcessorHandle(context))
    context.phase = Phase.DATA
    for key, frames in _groups(prepared, rows):
        context.key = keyspace.text(to_json(prepared.key_schema, key))
        view.begin()
        try:
            emitted = processor.handleInputRows(key, frames, timer_values)
            outcome.outputs += _outputs(prepared, key, emitted)
        except Exception as error:
            view.rollback()
            outcome.failed_keys.append((key, error))
        else:
            view.end()
    if mode is not TimeMode.NONE:
        context.phase = Phase.TIMERS
        due = batch_time if mode is TimeMode.PROCESSING_TIME else watermark
        _fire_timers(
            prepared=prepared,
            processor=processor,
            context=context,
            view=view,
            due=due,
            timer_values=timer_values,
            outcome=outcome,
        )
    context.phase, context.key = Phase.CLOSED, None
    processor.close()
    if mode is TimeMode.PROCESSING_TIME:
        outcome.evicted = _evict(view, batch_time)
    if mode is not TimeMode.NONE:
        new_clocks = Clocks(batch_time, max_event_time, max(watermark, clocks.watermark))
        view.put(keyspace.CLOCKS, new_clocks.as_json())
    outcome.changes = view.changes()
    return outcome


def due_without_input(prepared: PreparedProcessor, state: TaskState, now_ms: int) -> bool:
    """Whether a batch of the task with no input would do something, so runs at a trigger as
    Spark runs a batch without data: in ProcessingTime, a timer or a TTL deadline is due at
    the batch's time; in EventTime, the watermark would move (the newest event time seen,
    minus the delay, is above the watermark the last batch ran with). (Spark's
    ProcessingTime runs one at every trigger; one where nothing is due changes only the
    task's clock.)"""
    view = BatchView(state, prepared.pipeline.store)
    clocks = Clocks.from_json(view.get(keyspace.CLOCKS))
    if prepared.time_mode is TimeMode.PROCESSING_TIME:
        batch_time = max(now_ms, clocks.processing_time)
        return any(
            _first_time(view, prefix) <= batch_time
            for prefix in (keyspace.TIMER_BY_TIME, keyspace.DEADLINE)
        )
    if prepared.time_mode is TimeMode.EVENT_TIME and clocks.max_event_time is not None:
        return clocks.max_event_time - prepared.watermark_delay_ms > clocks.watermark
    return False


def _first_time(view: BatchView, prefix: str) -> float:
    """The earliest time of the timers (`t`) or deadlines (`x`) of a task; inf if none."""
    for state_key, _ in view.scan(prefix):
        return keyspace.split_timed(state_key)[0]
    return math.inf


def no_rows(prepared: PreparedProcessor) -> pd.DataFrame:
    """The input of a task's batch without data: no rows, the value schema's columns."""
    return pd.DataFrame({name: [] for name in prepared.value_schema.names})


def rows_of_key(
    prepared: PreparedProcessor, rows: pd.DataFrame, key: tuple[Any, ...]
) -> pd.DataFrame:
    """The rows of `rows` whose grouping key is `key` (as handleInputRows got it)."""
    columns = list(prepared.pipeline.grouping_columns)
    for group, part in rows.groupby(columns, sort=False, dropna=False):
        as_tuple = group if isinstance(group, tuple) else (group,)
        if tuple(plain(value) for value in as_tuple) == key:
            return part
    return rows.iloc[0:0]


def _drop_late(
    prepared: PreparedProcessor, rows: pd.DataFrame, clocks: Clocks
) -> tuple[pd.DataFrame, int | None, int]:
    """(rows after the late ones are dropped, newest event time seen, rows dropped). Late is
    at or before the watermark the previous batch ran with (Spark's watermark for late
    events); the newest event time counts every row, late or not, as Spark's does."""
    column = prepared.pipeline.event_time_column
    if column is None or rows.empty:
        return rows, clocks.max_event_time, 0
    times = _epoch_ms(rows[column])
    newest = times.max()
    max_event_time = clocks.max_event_time
    if pd.notna(newest):
        max_event_time = max(
            int(newest), max_event_time if max_event_time is not None else int(newest)
        )
    on_time = ~(times <= clocks.watermark)
    kept = rows[on_time.to_numpy()]
    return kept, max_event_time, len(rows) - len(kept)


def _epoch_ms(times: pd.Series) -> pd.Series:
    """Milliseconds since the epoch of a timestamp column (naive values are UTC, the
    instance's Spark session time zone)."""
    stamps = pd.to_datetime(times)
    if stamps.dt.tz is not None:
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    nanoseconds = stamps.astype("datetime64[ns]").astype("int64")
    return (nanoseconds // 1_000_000).where(stamps.notna())


def _groups(
    prepared: PreparedProcessor, rows: pd.DataFrame
) -> Iterator[tuple[tuple[Any, ...], Iterator[Any]]]:
    """Per grouping key, ascending: the key as a tuple, and its rows (the value schema's
    columns, input order): DataFrames of at most ROWS_PER_FRAME rows, or Rows."""
    if rows.empty:
        return
    columns = list(prepared.pipeline.grouping_columns)
    names = prepared.value_schema.names
    values = rows[names]
    for key, group in values.groupby(columns, sort=True, dropna=False):
        as_tuple = key if isinstance(key, tuple) else (key,)
        grouping = tuple(plain(part) for part in as_tuple)
        if prepared.takes_rows:
            row = Row(*names)
            records = group.astype(object).where(group.notna(), None)
            yield grouping, (row(*map(plain, r)) for r in records.itertuples(index=False))
            continue
        frames = [
            group.iloc[start : start + ROWS_PER_FRAME].reset_index(drop=True)
            for start in range(0, len(group), ROWS_PER_FRAME)
        ]
        yield grouping, iter(frames)


def _fire_timers(
    *,
    prepared: PreparedProcessor,
    processor: Any,
    context: BatchContext,
    view: BatchView,
    due: int,
    timer_values: TimerValues,
    outcome: ProcessorOutcome,
) -> None:
    """Call handleExpiredTimer for every timer at or before `due`, in time order (then by
    grouping key), as registered when timers start firing; each is deleted after its
    handler, as in Spark, even when the handler raised (a timer fires once)."""
    expired: list[tuple[int, str]] = []
    for state_key, _ in view.scan(keyspace.TIMER_BY_TIME):
        expiry, key = keyspace.split_timed(state_key)
        if expiry > due:
            break
        expired.append((expiry, key))
    for expiry, key_text in expired:
        if view.get(keyspace.timer_by_key(key_text, expiry)) is None:
            continue  # deleted by a handler that ran before it
        grouping = tuple(from_json(prepared.key_schema, json.loads(key_text)))
        context.key = key_text
        view.begin()
        try:
            info = ExpiredTimerInfo(expiry)
            emitted = processor.handleExpiredTimer(grouping, timer_values, info)
            outcome.outputs += _outputs(prepared, grouping, emitted)
        except Exception as error:
            view.rollback()
            outcome.failed_timers.append((grouping, expiry, error))
        else:
            view.end()
        delete_timer(view, key_text, expiry)
        outcome.fired += 1


def _evict(view: BatchView, batch_time: int) -> int:
    """Remove what expired by `batch_time` (TTL), in deadline order; returns how many values,
    list elements and map entries went. A deadline entry whose value was written again since
    (a later deadline) or deleted is only dropped."""
    due: list[tuple[str, str]] = []
    for deadline_key, _ in view.scan(keyspace.DEADLINE):
        deadline, target = keyspace.split_timed(deadline_key)
        if deadline > batch_time:
            break
        due.append((deadline_key, target))
    evicted = 0
    for deadline_key, target in due:
        view.delete(deadline_key)
        value = view.get(target)
        if value is None:
            continue
        if target.startswith(keyspace.LIST):
            kept = [element for element in value if not _expired(element[1], batch_time)]
            evicted += len(value) - len(kept)
            if not kept:
                view.delete(target)
            elif len(kept) < len(value):
                view.put(target, kept)
                deadlines = [x for _, x in kept if x is not None]
                if deadlines:
                    view.put(keyspace.deadline(min(deadlines), target), 1)
        elif _expired(value.get("x"), batch_time):
            view.delete(target)
            evicted += 1
    return evicted


def _expired(deadline: int | None, batch_time: int) -> bool:
    return deadline is not None and batch_time >= deadline


def _outputs(prepared: PreparedProcessor, key: tuple[Any, ...], emitted: Any) -> list[Output]:
    """The output records of what a handler returned: an iterator of pandas DataFrames whose
    columns are the output schema's fields, by name, or by position when not named; or, for
    transformWithState, of Rows, by field name (a field a Row lacks is null, as in Spark)."""
    schema = prepared.output_schema
    record_key = output_key(prepared, key)
    rows = _rows(schema, emitted) if prepared.takes_rows else _frame_rows(schema, _frames(emitted))
    return [
        (
            record_key,
            {f.name: output_json(f.dataType, v) for f, v in zip(schema.fields, row, strict=True)},
        )
        for row in rows
    ]


def _frame_rows(schema: StructType, frames: Iterator[pd.DataFrame]) -> Iterator[tuple[Any, ...]]:
    for emitted_frame in frames:
        frame = emitted_frame
        if all(isinstance(column, str) for column in frame.columns):
            missing = [name for name in schema.names if name not in frame.columns]
            if missing:
                raise ValueError(
                    f"an output DataFrame lacks the output schema's field(s) {missing} (it has "
                    f"{list(frame.columns)})"
                )
            frame = frame[schema.names]
        elif len(frame.columns) != len(schema.fields):
            raise ValueError(
                f"an output DataFrame has {len(frame.columns)} columns, the output schema "
                f"{len(schema.fields)}"
            )
        yield from frame.itertuples(index=False, name=None)


def _frames(emitted: Iterable[Any] | None) -> Iterator[pd.DataFrame]:
    for frame in emitted or ():
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(
                f"a handler yielded a {type(frame).__name__}: transformWithStateInPandas "
                "processors yield pandas DataFrames (a transformWithState processor, which "
                "yields Rows, needs api='transformWithState' in its ProcessorPipeline)"
            )
        yield frame


def _rows(schema: StructType, emitted: Iterable[Any] | None) -> Iterator[tuple[Any, ...]]:
    """The values of the output schema's fields, by name, of each Row a handler yielded."""
    for row in emitted or ():
        if not isinstance(row, Row) or not hasattr(row, "__fields__"):
            raise TypeError(
                f"a handler yielded {row!r}: transformWithState processors yield Rows with "
                "field names, e.g. Row(user=key[0], count=n)"
            )
        values = row.asDict(recursive=True)
        yield tuple(values.get(name) for name in schema.names)


def output_key(prepared: PreparedProcessor, key: tuple[Any, ...]) -> str:
    """An output record's key: the grouping key, as its text when it is one string column,
    else as JSON of its values."""
    if len(key) == 1 and isinstance(key[0], str):
        return key[0]
    return keyspace.text(
        [output_json(f.dataType, v) for f, v in zip(prepared.key_schema.fields, key, strict=True)]
    )
