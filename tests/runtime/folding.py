"""The restore's fold (`changelog.Fold`, in C) over parsed records, as tests use it: a fold
of records, its changes taken at once."""

from collections.abc import Iterable
from dataclasses import dataclass

from smoothscale.runtime.changelog import Fold, Positioned, add_record, take
from smoothscale.runtime.store import StateChanges


@dataclass
class FoldOutcome:
    changes: StateChanges
    """What the records changed, with the position to resume from, W* and its closed batch."""
    cursor: Fold
    """The fold, to go on from (its open batch kept)."""
    applied: int
    skipped: int
    """Records ignored because a higher writer had already written."""


def feed(cursor: Fold, records: Iterable[Positioned], next_position: int) -> None:
    """Fold `records` (in offset order); `next_position` is the offset after them."""
    for offset, record in records:
        add_record(cursor, offset, record)
    cursor.advance(next_position)


def taken(cursor: Fold, store: str) -> StateChanges:
    changes = StateChanges()
    take(cursor, store, changes)
    return changes


def fold(
    store: str, records: Iterable[Positioned], cursor: Fold, next_position: int
) -> FoldOutcome:
    """Fold `records` into `cursor` and take the changes they make to `store`."""
    applied, skipped = cursor.applied, cursor.skipped
    feed(cursor, records, next_position)
    changes = taken(cursor, store)
    return FoldOutcome(changes, cursor, cursor.applied - applied, cursor.skipped - skipped)
