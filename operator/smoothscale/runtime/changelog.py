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
The restore reads records in runs (`Run`: consecutive records of one kind, writer and batch),
split by the C module `_changelog` and applied by `fold_runs`.
"""

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from smoothscale.runtime._changelog import entries as run_entries
from smoothscale.runtime.store import StateChanges
from smoothscale.runtime.writer import Writer

if TYPE_CHECKING:
    from smoothscale.runtime._changelog import Item

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
"""The kinds by the numbers `_changelog.read` gives them."""
# The kinds a restore tests every run against, as plain names: looking a member up on the
# enum class costs a Python-level attribute lookup each time.
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
    `_changelog.read`, which leaves every record it does not read the same way to this."""
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
    activation) and a restore reads them on every run: parsed once each. The same object each
    time, so the fold compares a run's writer with the highest one by identity first."""
    return Writer.parse(header.decode() if isinstance(header, bytes) else header)


Positioned = tuple[int, ChangelogRecord]
"""A changelog record with its offset."""


class Run(NamedTuple):
    """Consecutive records of one changelog partition of one kind, writer and batch, in offset
    order: what a restore reads at once. A batch's records come in one run, and the fold
    applies a run in bulk; each list holds one entry per record."""

    kind: RecordKind
    writer: Writer
    batch: int | None
    offsets: list[int]
    keys: list[bytes]
    values: list[bytes | None]
    supersedes: list[bytes | None]
    state_keys: list[bytes | None]
    """Each record key's state key (`state_key_of`), None for a record key of no state key."""

    def without(self, record_keys: set[bytes]) -> "Run":
        """This run less the records whose key is in `record_keys`."""
        kept = [i for i, key in enumerate(self.keys) if key not in record_keys]
        if len(kept) == len(self.keys):
            return self
        return self._replace(
            offsets=[self.offsets[i] for i in kept],
            keys=[self.keys[i] for i in kept],
            values=[self.values[i] for i in kept],
            supersedes=[self.supersedes[i] for i in kept],
            state_keys=[self.state_keys[i] for i in kept],
        )


SLOW = -1
"""The kind `_changelog.read` gives a record it leaves to `parse_record`: its item holds
(offset, key, value, headers)."""
ERROR = -2
"""The kind `_changelog.read` gives an error event: its item holds (code, text)."""


def run_of(item: "Item") -> Run:
    """The run an item of `_changelog.read` holds (not a SLOW or ERROR one)."""
    kind, writer, batch = item[2], item[3], item[4]
    return Run(KIND_CODES[kind], _writer(writer), batch, *cast(_Columns, item[5:]))


_Columns = tuple[list[int], list[bytes], list[bytes | None], list[bytes | None], list[bytes | None]]


def runs_of(records: Iterable[Positioned]) -> list[Run]:
    """`records` (in offset order) as runs."""
    found: list[Run] = []
    for offset, record in records:
        kind, writer, key, value, batch, supersedes = record
        last = found[-1] if found else None
        if last is None or (last.kind, last.writer, last.batch) != (kind, writer, batch):
            last = Run(kind, writer, batch, [], [], [], [], [])
            found.append(last)
        last.offsets.append(offset)
        last.keys.append(key)
        last.values.append(value)
        last.supersedes.append(supersedes)
        last.state_keys.append(state_key_of(key))
    return found


@dataclass
class Cursor:
    """Where the fold of one changelog partition stands."""

    writer: Writer | None = None
    """The highest writer seen (W*)."""
    closed: int = -1
    """The batch W* last closed."""
    pending: list[Run] = field(default_factory=list)
    """The data and delete records of W*'s batch not closed yet, in order."""


@dataclass
class RestoreOutcome:
    changes: StateChanges
    cursor: Cursor
    applied: int = 0
    skipped: int = 0
    """Records ignored because a higher writer had already written."""


def fold(
    store: str,
    records: Iterable[Positioned],
    cursor: Cursor,
    next_position: int,
    into: StateChanges | None = None,
) -> RestoreOutcome:
    """`fold_runs` of `records` (in offset order)."""
    return fold_runs(store, runs_of(records), cursor, next_position, into)


def fold_runs(
    store: str,
    runs: Iterable[Run],
    cursor: Cursor,
    next_position: int,
    into: StateChanges | None = None,
) -> RestoreOutcome:
    """The state changes that `store`'s changelog records make, read in runs, in offset order.

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

    Every record of a run has the same kind, writer and batch, so what the rules decide for
    its first record holds for the rest: the rules run once a run, and its records apply in
    bulk. `cursor` is where the previous call stopped, `next_position` the changelog offset
    after these runs. The outcome's changes hold the new W*, its closed batch and the
    position to resume from (the first pending record's offset, or `next_position`); its
    cursor, the pending batch for the next call.

    With `into`, the changes are added to it: changes not yet written that the previous calls
    made (applied one after the other, as if these runs had come in the same call).
    """
    changes = StateChanges() if into is None else into
    entries = changes.entries.setdefault(store, {})
    garbage = changes.garbage.setdefault(store, set())
    pending = list(cursor.pending)
    highest, closed = cursor.writer, cursor.closed
    applied = skipped = 0

    def close() -> None:
        """Apply the pending batch: each data record sets its key, each delete keeps a
        deleted entry, and every record key they supersede is garbage."""
        nonlocal closed
        superseded: set[bytes | None] = set()
        for run in pending:
            # The store's entries (`store.entry`), made in C: one bytes object a record.
            values = cast(list[bytes], run.values) if run.kind is _DATA else None
            made = run_entries(run.keys, values)
            entries.update(zip(cast(list[bytes], run.state_keys), made, strict=True))
            superseded.update(run.supersedes)
        superseded.discard(None)  # of records that supersede nothing
        reclaimable = cast(set[bytes], superseded)
        collected = changes.collected.get(store)
        if collected:
            collected -= reclaimable
        garbage.update(reclaimable)
        closed = _open_batch(pending)
        pending.clear()

    for run in runs:
        kind, writer, batch = run.kind, run.writer, run.batch
        if kind is _TOMBSTONE:
            changes.reclaim(store, run.keys, run.state_keys)
            if pending:
                reclaimed = set(run.keys)
                pending[:] = [kept for held in pending if (kept := held.without(reclaimed)).keys]
            continue
        if writer is not highest:  # most runs are W*'s own: compared by identity
            if highest is not None and writer < highest:
                skipped += len(run.keys)
                continue
            if highest is None or writer > highest:
                pending.clear()
                closed = -1
            highest = writer
        applied += len(run.keys)
        if batch is None or batch <= closed:
            continue
        if pending and _open_batch(pending) < batch:
            close()
        if kind is _CLOSE:
            # The first closer of the run closes the batch; any other is of a batch closed.
            if pending:
                close()
            closed = batch
            positions = json.loads(run.values[0] or b"")["input"]
            changes.input_positions.update({t: int(p) for t, p in positions.items()})
            if run.supersedes[0] is not None:
                changes.supersede(store, run.supersedes[0])
        else:
            pending.append(run)
    position = pending[0].offsets[0] if pending else next_position
    changes.positions[store] = position
    changes.verified[store] = position
    if highest is not None:
        changes.writers[store] = highest
        changes.closed_batches[store] = closed
    return RestoreOutcome(changes, Cursor(highest, closed, pending), applied, skipped)


def _open_batch(pending: list[Run]) -> int:
    """The batch of the pending records (a data or delete run always has one)."""
    batch = pending[0].batch
    if batch is None:
        raise ValueError(f"a pending {pending[0].kind} run without a batch")
    return batch
