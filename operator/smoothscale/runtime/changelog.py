"""The changelog record format and the rule that restores a task's state from it.

Every record of a changelog partition carries two headers: `smoothscale.epoch`, the ownership
epoch of the instance that wrote it, and `smoothscale.kind`, one of

- `data`: key = the state key (UTF-8), value = its new value as JSON, or null to delete it;
- `epoch`: the epoch marker a new owner writes before it processes anything
  (value: `{"epoch": n, "instance": "<id>"}`);
- `input-position`: the task's input position, written in the same transaction as the state
  changes it accounts for (value: `{"<input topic>": <next offset>, ...}`); it lives in the
  changelog of the pipeline's store.

Restore applies records in offset order and skips any record whose epoch is below the highest
epoch seen so far on the partition: once a new owner's marker is in the changelog, whatever an
older owner still writes (a zombie the broker did not fence) is ignored. Records written by
something else (no epoch header) count as epoch 0 data, so an existing changelog can be adopted.
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from smoothscale.runtime.store import StateChanges

EPOCH_HEADER = "smoothscale.epoch"
KIND_HEADER = "smoothscale.kind"
EPOCH_MARKER_KEY = b"\x00smoothscale.epoch"
INPUT_POSITION_KEY = b"\x00smoothscale.input-position"

Headers = list[tuple[str, str | bytes | None]]


class RecordKind(StrEnum):
    DATA = "data"
    EPOCH = "epoch"
    INPUT_POSITION = "input-position"


class ChangelogFormatError(ValueError):
    """A changelog record smoothscale cannot read."""


@dataclass(frozen=True)
class ChangelogRecord:
    kind: RecordKind
    epoch: int
    key: bytes
    value: bytes | None

    def headers(self) -> Headers:
        return [(EPOCH_HEADER, str(self.epoch).encode()), (KIND_HEADER, self.kind.value.encode())]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def data_record(key: str, value: Any | None, epoch: int) -> ChangelogRecord:
    """A change of state key `key` to `value` (None deletes the key)."""
    encoded = None if value is None else _json(value)
    return ChangelogRecord(RecordKind.DATA, epoch, key.encode(), encoded)


def epoch_marker(epoch: int, instance_id: str) -> ChangelogRecord:
    return ChangelogRecord(
        RecordKind.EPOCH, epoch, EPOCH_MARKER_KEY, _json({"epoch": epoch, "instance": instance_id})
    )


def input_position_record(positions: Mapping[str, int], epoch: int) -> ChangelogRecord:
    """The task's input position: per input topic, the next offset to process."""
    return ChangelogRecord(RecordKind.INPUT_POSITION, epoch, INPUT_POSITION_KEY, _json(positions))


MessageHeaders = list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None


def parse_record(
    key: bytes | None, value: bytes | None, headers: MessageHeaders
) -> ChangelogRecord:
    """The record a changelog message holds (headers as confluent-kafka gives them)."""
    pairs = headers.items() if isinstance(headers, dict) else headers or []
    fields = {
        name: raw.encode() if isinstance(raw, str) else raw
        for name, raw in pairs
        if raw is not None
    }
    try:
        epoch = int(fields.get(EPOCH_HEADER, b"0"))
        kind = RecordKind(fields.get(KIND_HEADER, b"data").decode())
    except ValueError as error:
        raise ChangelogFormatError(f"bad smoothscale headers {fields!r}: {error}") from error
    if key is None:
        raise ChangelogFormatError("a changelog record without a key")
    return ChangelogRecord(kind, epoch, key, value)


@dataclass
class RestoreOutcome:
    changes: StateChanges
    applied: int = 0
    skipped: int = 0
    """Records ignored because an owner with a higher epoch had already written."""


def fold(
    store: str,
    records: Iterable[ChangelogRecord],
    highest_epoch: int,
    next_position: int,
) -> RestoreOutcome:
    """The state changes a run of `store`'s changelog records makes, in offset order.

    `highest_epoch` is the highest epoch seen before the run; `next_position` the changelog
    offset after it. The outcome's changes include the new position and highest epoch.
    """
    outcome = RestoreOutcome(StateChanges())
    changes = outcome.changes
    for record in records:
        if record.epoch < highest_epoch:
            outcome.skipped += 1
            continue
        highest_epoch = record.epoch
        outcome.applied += 1
        if record.kind is RecordKind.DATA:
            if record.value is None:
                changes.delete(store, record.key)
            else:
                changes.put(store, record.key, record.value)
        elif record.kind is RecordKind.INPUT_POSITION and record.value is not None:
            changes.input_positions.update(
                {topic: int(offset) for topic, offset in json.loads(record.value).items()}
            )
    changes.positions[store] = next_position
    changes.epochs[store] = highest_epoch
    return outcome
