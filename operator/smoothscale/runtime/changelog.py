"""The changelog record format and the rule that restores a task's state from it.

Every record of a changelog partition carries two headers: `smoothscale.epoch`, the ownership
epoch of the instance that wrote it, and `smoothscale.kind`, one of

- `data`: key = the state key (UTF-8), value = its new value as JSON, or null to delete it;
- `epoch`: the epoch marker a new owner writes before it processes anything
  (value: `{"epoch": n, "instance": "<id>"}`);
- `input-position`: the task's input position, written in the same transaction as the state
  changes it accounts for (value: `{"<input topic>": <next offset>, ...}`); it lives in the
  changelog of the pipeline's store.

Each micro-batch of a task writes its data records, then its input-position record, which
closes the batch. Restore applies records in offset order, a closed batch at a time, and skips
any record whose epoch is below the highest epoch seen so far on the partition: once a new
owner's marker is in the changelog, whatever an older owner still writes (a zombie the broker
did not fence) is ignored, and a batch its writer never closed is dropped (see `fold`).
Changelogs are written only by smoothscale: a record without its headers is an error.
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
    if EPOCH_HEADER not in fields or KIND_HEADER not in fields:
        raise ChangelogFormatError(
            f"a record without the {EPOCH_HEADER} and {KIND_HEADER} headers: the changelog "
            "must be written by smoothscale only (is another app using the same topic?)"
        )
    try:
        epoch = int(fields[EPOCH_HEADER])
        kind = RecordKind(fields[KIND_HEADER].decode())
    except ValueError as error:
        raise ChangelogFormatError(f"bad smoothscale headers {fields!r}: {error}") from error
    if key is None:
        raise ChangelogFormatError("a changelog record without a key")
    return ChangelogRecord(kind, epoch, key, value)


Positioned = tuple[int, ChangelogRecord]
"""A changelog record with its offset."""


@dataclass
class RestoreOutcome:
    changes: StateChanges
    pending: list[Positioned] = field(default_factory=list)
    """The records of a batch not closed yet (no input-position record seen), in order."""
    applied: int = 0
    skipped: int = 0
    """Records ignored because an owner with a higher epoch had already written."""


def fold(
    store: str,
    records: Iterable[Positioned],
    highest_epoch: int,
    next_position: int,
    pending: Iterable[Positioned] = (),
) -> RestoreOutcome:
    """The state changes a run of `store`'s changelog records makes, in offset order.

    A batch takes effect only as a whole: its data records are held until the input-position
    record that closes it. An unclosed batch is dropped when a record of a higher epoch (a
    new owner's marker) follows it: its writer died before committing, and a broker that shows
    uncommitted records to read_committed readers (the librdkafka mock does) cannot make it
    count. Records below the highest epoch seen are skipped.

    `highest_epoch` is the highest epoch seen before the run, `next_position` the changelog
    offset after it, `pending` the unclosed records carried over from the previous run. The
    outcome's changes include the highest epoch and the position to resume from: the offset
    of the first still-unclosed record, or `next_position`.
    """
    outcome = RestoreOutcome(StateChanges(), pending=list(pending))
    changes = outcome.changes
    for offset, record in records:
        if record.epoch < highest_epoch:
            outcome.skipped += 1
            continue
        if record.epoch > highest_epoch:
            outcome.pending.clear()
            highest_epoch = record.epoch
        outcome.applied += 1
        if record.kind is RecordKind.DATA:
            outcome.pending.append((offset, record))
        elif record.kind is RecordKind.EPOCH:
            outcome.pending.clear()
        else:
            for _offset, held in outcome.pending:
                if held.value is None:
                    changes.delete(store, held.key)
                else:
                    changes.put(store, held.key, held.value)
            outcome.pending.clear()
            if record.value is not None:
                changes.input_positions.update(
                    {topic: int(position) for topic, position in json.loads(record.value).items()}
                )
    changes.positions[store] = outcome.pending[0][0] if outcome.pending else next_position
    changes.epochs[store] = highest_epoch
    return outcome
