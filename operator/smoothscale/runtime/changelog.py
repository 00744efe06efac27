"""The changelog record format and the rule that restores a task's state from it.

A changelog topic may be compacted, which keeps only the newest record per record key. So
every record key is unique to the writer (`Writer`, one activation of one owner) and batch that
wrote it, and a record is removed only by a Kafka tombstone its writer sends once the record
that superseded it is verified legitimate (docs/runtime.md gives the argument). A record's key
says its kind, writer ("E.S.N") and batch (1, 2, ... per writer):

- `marker`: key `m@E.S.N`, the first record a writer writes on each of its task's changelog
  partitions (value: `{"epoch", "session", "instance"}`);
- `close`: key `c@E.S.N.B`, closes batch B (value: `{"input": {topic: next offset}}`); it
  supersedes the writer's previous closer; batch 0 is the start position of a new task;
- `data`: key `d:<state key>@E.S.N.B`, the key's new state as JSON;
- `delete`: the same key form, value empty (not a Kafka tombstone);
- `tombstone`: key = a superseded record key, value null: lets compaction reclaim it.

Headers carry only what the key cannot: `smoothscale.supersedes` on a data, delete or close
record that replaces another (that record's key), and `smoothscale.writer` on a tombstone (its
key names the record it reclaims, not who wrote it). A restore reads every record, and reading
five headers a record was most of its cost; records of earlier releases, which also carry
`smoothscale.kind`, `smoothscale.epoch` and `smoothscale.batch`, read the same.

Changelogs are written only by smoothscale: a record whose key is not one of these is an error.

A restore folds a partition's records, in offset order, into the changes to write to the store
(`Fold`, in the C module `_changelog`, one per partition; `_changelog.read` feeds it straight
from librdkafka's messages, `add_record` a parsed record):

1. A tombstone takes its record key out of the garbage set. It changes state only for a reader
   of a compacted log that missed what superseded the record (a reclaimed delete, or a record
   read before compaction removed its successors): a key whose entry is still that record is
   forgotten, and a pending record it reclaims is dropped. On the full log neither happens: a
   record is tombstoned only after its successor counts.
2. A record of a writer below W* (the highest writer seen) is skipped: an older owner writing
   after a newer owner's marker.
3. A record of a writer above W* drops W*'s pending batch (never closed) and becomes W*.
4. W*'s batch takes effect only as a whole, when a closer of it or any record of a later batch
   of W* arrives (a writer commits its batches in order and stops at its first failed
   transaction, so a later batch proves the earlier one committed). Its records then apply at
   once, with the closer's input position when the closer is there.

The fold's changes hold the new W*, its closed batch and the position to resume from (the first
pending record's offset, or the offset after the last record read); the pending batch stays in
the fold. `take` moves the changes folded so far into a `StateChanges`: folding many chunks
before taking lets a key updated many times reach the store once.
"""

import functools
import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, NamedTuple

from smoothscale.runtime._changelog import Fold
from smoothscale.runtime.store import StateChanges, TaskState
from smoothscale.runtime.writer import Writer

WRITER_HEADER = "smoothscale.writer"
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


KIND_CODES = (
    RecordKind.MARKER,
    RecordKind.CLOSE,
    RecordKind.DATA,
    RecordKind.DELETE,
    RecordKind.TOMBSTONE,
)
"""The kinds by the numbers `Fold` takes them."""
_KIND_CODE = {kind: code for code, kind in enumerate(KIND_CODES)}
# The kinds as plain names: looking a member up on the enum class costs a Python-level
# attribute lookup each time (a batch builds thousands of records).
_TOMBSTONE, _CLOSE, _DATA = RecordKind.TOMBSTONE, RecordKind.CLOSE, RecordKind.DATA
_DELETE, _MARKER = RecordKind.DELETE, RecordKind.MARKER
_ONLY_SMOOTHSCALE = (
    "the changelog must be written by smoothscale only (is another app using the same topic?)"
)


class ChangelogFormatError(ValueError):
    """A changelog record smoothscale cannot read."""


class ChangelogRecord(NamedTuple):
    """One changelog record. A named tuple, not a dataclass: tests and tools make many."""

    kind: RecordKind
    writer: Writer
    key: bytes
    value: bytes | None
    batch: int | None = None
    """The writer's batch (data, delete and close records)."""
    supersedes: bytes | None = None
    """The record key this record replaces: garbage once this record is applied."""

    def headers(self) -> Headers | None:
        """What the key does not say (see the module's documentation); None: no headers."""
        if self.kind is _TOMBSTONE:
            return [(WRITER_HEADER, str(self.writer).encode())]
        return None if self.supersedes is None else [(SUPERSEDES_HEADER, self.supersedes)]

    def state_key(self) -> bytes:
        """The state key a data or delete record changes."""
        key = state_key_of(self.key)
        if key is None:
            raise ValueError(f"{self.kind} record {self.key!r} changes no state key")
        return key


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
    # tuple.__new__ directly: the named tuple's own __new__ is a Python function, called once
    # per changed key.
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
    (name, bytes) pairs; a dict, or text values, are read too).

    This is the definition of the format; the restore reads the same records faster with
    `_changelog.read`, which leaves every record it does not read the same way to this (and
    `add_record`)."""
    if key is None:
        raise ChangelogFormatError("a changelog record without a key")
    fields = dict(headers) if headers else {}
    if value is None:
        writer_header = fields.get(WRITER_HEADER)
        if writer_header is None:
            raise ChangelogFormatError(
                f"a tombstone of {key!r} without the {WRITER_HEADER} header: {_ONLY_SMOOTHSCALE}"
            )
        try:
            writer = _writer(writer_header)
        except ValueError as error:
            raise ChangelogFormatError(
                f"a tombstone of {key!r} with the {WRITER_HEADER} header {writer_header!r}, "
                f"not a writer: {error}"
            ) from error
        return tuple.__new__(ChangelogRecord, (_TOMBSTONE, writer, key, None, None, None))
    at = key.rfind(b"@")
    if key.startswith(_DATA_PREFIX) and at >= _DATA_PREFIX_LENGTH:
        kind = _DATA if value else _DELETE
    elif at == 1 and key[:1] == b"c":
        kind = _CLOSE
    elif at == 1 and key[:1] == b"m":
        kind = _MARKER
    else:
        raise ChangelogFormatError(
            f"a record with the key {key!r}, not m@<writer>, c@<writer>.<batch> or "
            f"d:<state key>@<writer>.<batch>: {_ONLY_SMOOTHSCALE}"
        )
    try:
        writer, batch = _writer_and_batch(key[at + 1 :], batched=kind is not _MARKER)
    except ValueError as error:
        raise ChangelogFormatError(
            f"a {kind} record with the key {key!r}, whose writer or batch is not one: {error}"
        ) from error
    supersedes = fields.get(SUPERSEDES_HEADER)
    if isinstance(supersedes, str):
        supersedes = supersedes.encode()
    # tuple.__new__ directly: the named tuple's own __new__ is a Python function.
    return tuple.__new__(ChangelogRecord, (kind, writer, key, value, batch, supersedes))


@functools.lru_cache(maxsize=4096)
def _writer_and_batch(suffix: bytes, batched: bool) -> tuple[Writer, int | None]:
    """The writer and batch a record key's end names (`E.S.N.B`, or `E.S.N` for a marker)."""
    if not batched:
        return _writer(suffix), None
    writer, dot, batch = suffix.rpartition(b".")
    if not dot:
        raise ValueError(f"{suffix!r} has no batch")
    return _writer(writer), int(batch)


@functools.lru_cache(maxsize=1024)
def _writer(header: bytes | str) -> Writer:
    """The writer a record key or header names. A changelog holds few writers (one per
    activation) and parse_record reads one a record: each parsed once."""
    return Writer.parse(header.decode() if isinstance(header, bytes) else header)


Positioned = tuple[int, ChangelogRecord]
"""A changelog record with its offset."""


def resume(state: TaskState, store: str) -> Fold:
    """The fold of `store`'s changelog partition that goes on from where the task's stored
    state stands (its W*, the batch W* closed, and its restore position)."""
    writer = state.writer(store)
    return Fold(
        None if writer is None else (writer.epoch, writer.session, writer.nonce),
        state.closed_batch(store),
        state.position(store),
    )


def add_record(fold: Fold, offset: int, record: ChangelogRecord) -> None:
    """Fold `record`, at `offset` of the fold's partition. A writer or batch out of the fold's
    range (64-bit numbers: smoothscale's writers are far inside it) is a format error."""
    kind, writer, key, value, batch, supersedes = record
    try:
        fold.add(
            offset,
            _KIND_CODE[kind],
            (writer.epoch, writer.session, writer.nonce),
            batch,
            key,
            value,
            supersedes,
        )
    except OverflowError as error:
        raise ChangelogFormatError(
            f"a {kind} record {key!r} whose writer {writer} or batch {batch} is out of range "
            f"(64-bit numbers): {_ONLY_SMOOTHSCALE}"
        ) from error


def take(fold: Fold, store: str, into: StateChanges) -> None:
    """Move the changes `fold` (of `store`'s changelog partition) made since it was last taken
    into `into`, with the position to resume from, W* and its closed batch."""
    entries, reclaimed, garbage, collected, closers, position, writer, closed = fold.take()
    into.entries[store] = entries
    into.reclaimed[store] = reclaimed
    into.garbage[store] = garbage
    into.collected[store] = collected
    for value in closers:
        positions = json.loads(value)["input"]
        into.input_positions.update({topic: int(p) for topic, p in positions.items()})
    into.positions[store] = position
    into.verified[store] = position
    if writer is not None:
        into.writers[store] = Writer(*writer)
        into.closed_batches[store] = closed
