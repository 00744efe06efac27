"""A log compaction simulator with the Kafka cleaner's semantics, for changelog tests.

The cleaner cleans a prefix of the partition (up to the cleaning point, never the active
segment): there, a record survives only if it is the newest record of its key within the
prefix; a tombstone survives until delete.retention.ms has passed: the delete horizon, below
which the cleaner drops tombstones too (a reader that stopped before the horizon with records
read but not their tombstones is too slow for the topic: Kafka's rule for compacted topics).
The tail after the cleaning point is untouched, and offsets never change.
"""

from dataclasses import dataclass

from smoothscale.runtime.changelog import ChangelogRecord, Headers, Positioned, parse_record


@dataclass(frozen=True)
class LogRecord:
    offset: int
    key: bytes
    value: bytes | None
    headers: Headers


def as_log(records: list[Positioned]) -> list[LogRecord]:
    return [LogRecord(offset, r.key, r.value, r.headers()) for offset, r in records]


def as_records(log: list[LogRecord]) -> list[tuple[int, ChangelogRecord]]:
    return [(r.offset, parse_record(r.key, r.value, r.headers)) for r in log]


def compact(
    log: list[LogRecord], cleaning_point: int, remove_tombstones: bool, horizon: int | None = None
) -> list[LogRecord]:
    """`log` after one cleaner pass over the offsets below `cleaning_point`; with
    `remove_tombstones`, the tombstones below `horizon` (default: the cleaning point) go."""
    delete_horizon = cleaning_point if horizon is None else min(horizon, cleaning_point)
    newest = {r.key: r.offset for r in log if r.offset < cleaning_point}
    kept: list[LogRecord] = []
    for record in log:
        if record.offset < cleaning_point:
            if newest[record.key] != record.offset:
                continue
            if record.value is None and remove_tombstones and record.offset < delete_horizon:
                continue
        kept.append(record)
    return kept
