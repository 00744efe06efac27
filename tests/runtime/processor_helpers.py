"""A task running a StatefulProcessor the way an instance runs it, without Spark or Kafka.

`ProcessorTask` keeps a task's store and its changelog as a list of records: each batch's
state changes are written as the instance writes them (data and delete records superseding the
key's previous record, then the closer) and applied to the store by `changelog.Fold`, the rule
restore uses; the superseded records are tombstoned. `handed_over` builds another owner's store
from that log (optionally compacted first), at a higher epoch: a hand-over.
"""

import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from smoothscale.runtime.changelog import (
    ChangelogRecord,
    Fold,
    Positioned,
    closer,
    data,
    delete,
    marker,
    tombstone,
)
from smoothscale.runtime.processor import (
    PreparedProcessor,
    ProcessorOutcome,
    ProcessorPipeline,
    prepare,
    run_batch,
)
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.writer import Writer
from tests.runtime.compaction import as_log, as_records, compact
from tests.runtime.folding import fold

INPUT = "events"


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def at(seconds: float) -> datetime.datetime:
    """A timestamp `seconds` after the epoch (naive UTC, as the instance's Spark gives it)."""
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds)


class ProcessorTask:
    """One task of a processor pipeline: its store, its changelog, and its owner's writer."""

    def __init__(
        self,
        directory: Path,
        pipeline: ProcessorPipeline,
        log: list[Positioned] | None = None,
        epoch: int = 1,
    ) -> None:
        self.prepared: PreparedProcessor = prepare(pipeline)
        self.store = pipeline.store
        self.state = TaskState(directory, 0, [self.store])
        self.log: list[Positioned] = list(log or [])
        self.cursor = Fold()
        self._restore(self.log)
        self.writer = Writer(epoch, 1, 0)
        self.batch = 0
        self.last_closer: bytes | None = None
        self.offset = 0
        self._append([marker(self.writer, "test")])

    def run(self, rows: list[dict[str, Any]], now: int = 0) -> ProcessorOutcome:
        """One micro-batch of `rows` (value-schema dicts) at `now` (ms): run, then commit."""
        frame = pd.DataFrame(rows, columns=self.prepared.value_schema.names)
        outcome = run_batch(self.prepared, self.state, frame, now)
        self.offset += len(rows)
        self._commit(outcome.changes)
        return outcome

    def _commit(self, changes: dict[str, Any]) -> None:
        self.batch += 1
        names = list(changes)
        olds = self.state.record_keys(self.store, [name.encode() for name in names])
        records: list[ChangelogRecord] = [
            delete(self.writer, self.batch, name, old)
            if changes[name] is None
            else data(self.writer, self.batch, name, changes[name], old)
            for name, old in zip(names, olds, strict=True)
        ]
        closing = closer(self.writer, self.batch, {INPUT: self.offset}, self.last_closer)
        self.last_closer = closing.key
        superseded = [r.supersedes for r in [*records, closing] if r.supersedes is not None]
        reclaim = [tombstone(self.writer, key) for key in superseded]
        self._append([*records, closing, *reclaim])

    def _append(self, records: list[ChangelogRecord]) -> None:
        start = self.log[-1][0] + 1 if self.log else 0
        positioned = [(start + i, record) for i, record in enumerate(records)]
        self.log += positioned
        self._restore(positioned)

    def _restore(self, records: list[Positioned]) -> None:
        if not records:
            return
        outcome = fold(self.store, records, self.cursor, records[-1][0] + 1)
        self.state.apply(outcome.changes)
        self.cursor = outcome.cursor

    def contents(self) -> dict[str, Any]:
        """The store's live keys and values (keyspace text -> JSON)."""
        return self.state.snapshot(self.store)

    def handed_over(self, directory: Path, *, compacted: bool = False) -> "ProcessorTask":
        """The task's next owner: a new store restored from the changelog (compacted the way
        the cleaner leaves it, tombstones removed, when asked), writing at a higher epoch."""
        log = self.log
        if compacted:
            cleaned = compact(as_log(log), cleaning_point=len(log), remove_tombstones=True)
            log = as_records(cleaned)
        self.state.close()
        return ProcessorTask(
            directory, self.prepared.pipeline, log=log, epoch=self.writer.epoch + 1
        )

    def close(self) -> None:
        self.state.close()
