"""The changelog record format and the rule that restores a task's state from it.

A changelog topic may be compacted, which keeps only the newest record per record key. So
every record key is unique to the writer (`Writer`, one activation of one owner) and batch that
wrote it, and a record is removed only by a Kafka tombstone its writer sends once the record
that superseded it is verified legitimate (docs/runtime.md gives the argument). Every record
carries the headers `smoothscale.kind`, `smoothscale.writer` ("E.S.N"), `smoothscale.epoch`
(for humans) and, for data, delete and close records, `smoothscale.batch` (1, 2, ... per
writer) and `smoothscale.supersedes` (the record key this one replaces, if any):

- `marker`: key `m@E.S.N`, the first record a writer writes on each of its task's changelog
  partitions (value: `{"epoch", "session", "instance"}`);
- `close`: key `c@E.S.N.B`, closes batch B (value: `{"input": {topic: next offset}}`); it
  supersedes the writer's previous closer; batch 0 is the start position of a new task;
- `data`: key `d:<state key>@E.S.N.B`, the key's new state as JSON;
- `delete`: the same key form, value empty (not a Kafka tombstone);
- `tombstone`: key = a superseded record key, value null: lets compaction reclaim it.

Changelogs are written only by smoothscale: a record without its headers is an error.
"""

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from smoothscale.runtime.store import Entry, StateChanges
from smoothscale.runtime.writer import Writer

KIND_HEADER = "smoothscale.kind"
WRITER_HEADER = "smoothscale.writer"
EPOCH_HEADER = "smoothscale.epoch"
BATCH_HEADER = "smoothscale.batch"
SUPERSEDES_HEADER = "smoothscale.supersedes"

_DATA_PREFIX = b"d:"
_DATA_PREFIX_LENGTH = len(_DATA_PREFIX)

Headers = list[tuple[str, str | bytes | None]]


class RecordKind(StrEnum):
    MARKER = "marker"
    CLOSE = "close"
    DATA = "data"
    DELETE = "delete"
    TOMBSTONE = "tombstone"


_BATCHED = {RecordKind.CLOSE, RecordKind.DATA, RecordKind.DELETE}
_CHANGES_STATE = {RecordKind.DATA, RecordKind.DELETE}
# The kinds a restore tests every record against, as plain names: looking a member up on the
# enum class costs a Python-level attribute lookup each time.
_TOMBSTONE, _CLOSE, _DATA = RecordKind.TOMBSTONE, RecordKind.CLOSE, RecordKind.DATA
_DELETE = RecordKind.DELETE


class ChangelogFormatError(ValueError):
    """A changelog record smoothscale cannot read."""


class ChangelogRecord(NamedTuple):
    """One changelog record. A named tuple, not a dataclass: a restore makes one per record
    it reads, and a frozen dataclass's construction costs several times more."""

    kind: RecordKind
    writer: Writer
    key: bytes
    value: bytes | None
    batch: int | None = None
    """The writer's batch (data, delete and close records)."""
    supersedes: bytes | None = None
    """The record key this record replaces: garbage once this record is applied."""

    def headers(self) -> Headers:
        return _with_supersedes(
            _shared_headers(self.kind, self.writer, self.batch), self.supersedes
        )

    def state_key(self) -> bytes:
        """The state key a data or delete record changes."""
        key = state_key_of(self.key)
        if key is None:
            raise ValueError(f"{self.kind} record {self.key!r} changes no state key")
        return key


def _shared_headers(kind: RecordKind, writer: Writer, batch: int | None) -> Headers:
    """The headers every record of one kind, writer and batch has, in their order."""
    headers: Headers = [
        (KIND_HEADER, kind.value.encode()),
        (WRITER_HEADER, str(writer).encode()),
        (EPOCH_HEADER, str(writer.epoch).encode()),
    ]
    if batch is not None:
        headers.append((BATCH_HEADER, str(batch).encode()))
    return headers


def _with_supersedes(shared: Headers, supersedes: bytes | None) -> Headers:
    return shared if supersedes is None else [*shared, (SUPERSEDES_HEADER, supersedes)]


def with_headers(records: Iterable[ChangelogRecord]) -> Iterator[tuple[ChangelogRecord, Headers]]:
    """Each record with its `headers()`, the headers shared by a run of records of one kind,
    writer and batch built once for the run: a micro-batch's commit produces thousands of data
    records of one writer and batch, and building each one's headers anew took 6-9% of the
    commit's time on the driver (profiles, docs/benchmarks/throughput.md)."""
    kind: RecordKind | None = None
    writer: Writer | None = None
    batch: int | None = None
    shared: Headers = []
    for record in records:
        if record.kind is not kind or record.writer is not writer or record.batch != batch:
            kind, writer, batch = record.kind, record.writer, record.batch
            shared = _shared_headers(kind, writer, batch)
        yield record, _with_supersedes(shared, record.supersedes)


def state_key_of(record_key: bytes) -> bytes | None:
    """The state key of a data or delete record key (None for any other record key)."""
    if not record_key.startswith(_DATA_PREFIX) or b"@" not in record_key:
        return None
    return record_key[_DATA_PREFIX_LENGTH : record_key.rindex(b"@")]


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
"""One encoder for every record: json.dumps with any option builds a new encoder per call, a
third of the time of encoding a small value (a batch encodes one per changed key)."""


def json_bytes(encoder: json.JSONEncoder, value: Any) -> bytes:
    """`value` as `encoder`'s JSON. An int (a count, the commonest state and output) is its own
    JSON text: the same bytes without the encoder's call, which cost more than the rest of
    building a record."""
    if type(value) is int:
        return str(value).encode()
    return encoder.encode(value).encode()


def _json(value: Any) -> bytes:
    return json_bytes(_ENCODER, value)


def marker(writer: Writer, instance_id: str) -> ChangelogRecord:
    value = {"epoch": writer.epoch, "session": writer.session, "instance": instance_id}
    return ChangelogRecord(RecordKind.MARKER, writer, f"m@{writer}".encode(), _json(value))


def closer(
    writer: Writer, batch: int, input_positions: Mapping[str, int], supersedes: bytes | None
) -> ChangelogRecord:
    """Closes `batch`: per input topic, the next offset to process once it is applied."""
    key = f"c@{writer}.{batch}".encode()
    value = _json({"input": dict(input_positions)})
    return ChangelogRecord(RecordKind.CLOSE, writer, key, value, batch, supersedes)


def data(
    writer: Writer, batch: int, state_key: str, value: Any, supersedes: bytes | None
) -> ChangelogRecord:
    """The new state of `state_key` (JSON-able; never None, see `delete`)."""
    return changes(writer, batch, {state_key: value}, [supersedes])[0]


def delete(writer: Writer, batch: int, state_key: str, supersedes: bytes | None) -> ChangelogRecord:
    return changes(writer, batch, {state_key: None}, [supersedes])[0]


def changes(
    writer: Writer, batch: int, changed: Mapping[str, Any], supersedes: Iterable[bytes | None]
) -> list[ChangelogRecord]:
    """The data and delete records of a batch's state changes: `changed` maps each state key to
    its new state (None: deleted), and `supersedes` gives, in the same order, the record key
    each one replaces. The keys' common end (writer and batch) is built once: a micro-batch
    changes thousands of keys."""
    suffix = f"@{writer}.{batch}".encode()
    # tuple.__new__ directly, as in parse_record: the named tuple's own __new__ is a Python
    # function, called once per changed key.
    return [
        tuple.__new__(
            ChangelogRecord,
            (
                _DELETE if value is None else _DATA,
                writer,
                _DATA_PREFIX + key.encode() + suffix,
                b"" if value is None else _json(value),
                batch,
                replaced,
            ),
        )
        for (key, value), replaced in zip(changed.items(), supersedes, strict=True)
    ]


def tombstone(writer: Writer, record_key: bytes) -> ChangelogRecord:
    """Lets compaction remove `record_key`, a record superseded by a verified one."""
    return ChangelogRecord(RecordKind.TOMBSTONE, writer, record_key, None)


MessageHeaders = list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None


def parse_record(
    key: bytes | None, value: bytes | None, headers: MessageHeaders
) -> ChangelogRecord:
    """The record a changelog message holds (headers as confluent-kafka gives them: a list of
    (name, bytes) pairs; a dict, or text values, are read too)."""
    fields = dict(headers) if headers else {}
    writer_header, kind_header = fields.get(WRITER_HEADER), fields.get(KIND_HEADER)
    if writer_header is None or kind_header is None:
        raise ChangelogFormatError(
            f"a record without the {WRITER_HEADER} and {KIND_HEADER} headers: the changelog "
            "must be written by smoothscale only (is another app using the same topic?)"
        )
    try:
        writer = _writer(writer_header)
        kind = _KINDS[kind_header]
        batch = int(fields[BATCH_HEADER] or b"") if kind in _BATCHED else None
    except (ValueError, KeyError, TypeError) as error:
        raise ChangelogFormatError(f"bad smoothscale headers {fields!r}: {error!r}") from error
    if key is None:
        raise ChangelogFormatError("a changelog record without a key")
    if (value is None) != (kind is _TOMBSTONE):
        raise ChangelogFormatError(f"a {kind} record {key!r} with value {value!r}")
    if kind in _CHANGES_STATE and (not key.startswith(_DATA_PREFIX) or b"@" not in key):
        raise ChangelogFormatError(f"a {kind} record with the key {key!r}, not d:<key>@<writer>")
    supersedes = fields.get(SUPERSEDES_HEADER)
    if isinstance(supersedes, str):
        supersedes = supersedes.encode()
    # tuple.__new__ directly: the named tuple's own __new__ is a Python function, and a
    # restore parses every record (a fifth of this function's time).
    return tuple.__new__(ChangelogRecord, (kind, writer, key, value, batch, supersedes))


_KINDS: dict[str | bytes, RecordKind] = {
    **{kind.value.encode(): kind for kind in RecordKind},
    **{kind.value: kind for kind in RecordKind},
}


@functools.lru_cache(maxsize=1024)
def _writer(header: bytes | str) -> Writer:
    """The writer a header names. A changelog holds few writers (one per activation) and a
    restore reads each one's name on every record: parsed once each (restore profile: a
    quarter of the time went to parsing headers). The same object each time, so the fold
    compares a record's writer with the highest one by identity first."""
    return Writer.parse(header.decode() if isinstance(header, bytes) else header)


Positioned = tuple[int, ChangelogRecord]
"""A changelog record with its offset."""

Held = tuple[int, bytes, bytes | None, bytes | None, int]
"""A data or delete record of W*'s batch not closed yet: (offset, record key, value (None: a
delete), the record key it supersedes, batch). A plain tuple of bytes and numbers, not a record:
Python's garbage collector stops tracking such a tuple (it never traverses it again), and a
restore holds up to a whole batch of them per task while it reads the batch (measured: with
records held, a quarter of a restore's time went to full collections)."""


@dataclass
class Cursor:
    """Where the fold of one changelog partition stands."""

    writer: Writer | None = None
    """The highest writer seen (W*)."""
    closed: int = -1
    """The batch W* last closed."""
    pending: list[Held] = field(default_factory=list)
    """The records of W*'s batch not closed yet, in order."""


@dataclass
class RestoreOutcome:
    changes: StateChanges
    cursor: Cursor
    applied: int = 0
    skipped: int = 0
    """Records ignored because a higher writer had already written."""


def fold(
    store: str, records: Iterable[Positioned], cursor: Cursor, next_position: int
) -> RestoreOutcome:
    """The state changes a run of `store`'s changelog records makes, in offset order.

    1. A tombstone takes its record key out of the garbage set. It changes state only for a
       reader of a compacted log that missed what superseded the record (a reclaimed delete,
       or a record read before compaction removed its successors): a key whose entry is
       still that record is forgotten, and a pending record it reclaims is dropped. On the
       full log neither happens: a record is tombstoned only after its successor counts.
    2. A record of a writer below W* (the highest writer seen) is skipped: an older owner
       writing after a newer owner's marker.
    3. A record of a writer above W* drops W*'s pending batch (never closed) and becomes W*.
    4. W*'s batch takes effect only as a whole, when a closer of it or any record of a later
       batch of W* arrives (a writer commits its batches in order and stops at its first
       failed transaction, so a later batch proves the earlier one committed). Its records
       then apply at once, with the closer's input position when the closer is there.

    `cursor` is where the previous run stopped, `next_position` the changelog offset after
    this run. The outcome's changes hold the new W*, its closed batch and the position to
    resume from (the first pending record's offset, or `next_position`); its cursor, the
    pending batch for the next run.

    The loop is a restore's hot path, one pass per record: the cursor's fields are local
    variables, each record is unpacked once, and a closed batch goes to the changes in bulk.
    """
    changes = StateChanges()
    entries = changes.entries.setdefault(store, {})
    garbage = changes.garbage.setdefault(store, set())
    pending = list(cursor.pending)
    highest, closed = cursor.writer, cursor.closed
    applied = skipped = 0

    def close() -> None:
        """Apply the pending batch: each data record sets its key, each delete keeps a
        deleted entry, and every record key they supersede is garbage."""
        nonlocal closed
        entries.update(
            [
                (key[_DATA_PREFIX_LENGTH : key.rindex(b"@")], tuple.__new__(Entry, (key, value)))
                for _offset, key, value, _superseded, _batch in pending
            ]
        )
        superseded = {held[3] for held in pending if held[3] is not None}
        collected = changes.collected.get(store)
        if collected:
            collected -= superseded
        garbage.update(superseded)
        closed = pending[0][4]
        pending.clear()

    for offset, (kind, writer, key, value, batch, supersedes) in records:
        if kind is _TOMBSTONE:
            changes.reclaim(store, key, state_key_of(key))
            if pending:
                pending[:] = [held for held in pending if held[1] != key]
            continue
        if writer is not highest:  # most records are W*'s own: compared by identity
            if highest is not None and writer < highest:
                skipped += 1
                continue
            if highest is None or writer > highest:
                pending.clear()
                closed = -1
            highest = writer
        applied += 1
        if batch is None or batch <= closed:
            continue
        if pending and pending[0][4] < batch:
            close()
        if kind is _CLOSE:
            if pending:
                close()
            if value is not None:
                closed = batch
                positions = json.loads(value)["input"]
                changes.input_positions.update({t: int(p) for t, p in positions.items()})
                if supersedes is not None:
                    changes.supersede(store, supersedes)
        else:
            pending.append((offset, key, value if kind is _DATA else None, supersedes, batch))
    position = pending[0][0] if pending else next_position
    changes.positions[store] = position
    changes.verified[store] = position
    if highest is not None:
        changes.writers[store] = highest
        changes.closed_batches[store] = closed
    return RestoreOutcome(changes, Cursor(highest, closed, pending), applied, skipped)
