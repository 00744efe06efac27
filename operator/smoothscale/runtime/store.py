"""Per-task state on local disk: one RocksDB database per task (via rocksdict).

A task's database has, per state store, one column family with one entry per state key: the
changelog record key that holds its current value and that value (the bytes of the record's
value), or the record key of its delete, which is kept (reading as absent) until that delete
record itself is reclaimed. One entry, not one for the value and one for the record key: a
restore and a batch insert each key once (docs/decisions/state-store.md). A `smoothscale`
column family keeps
what the runtime needs beside them: per store the next changelog offset applied (the restore
position), the highest writer seen and the batch it last closed, the garbage set (record keys
superseded and not yet reclaimed by a tombstone), the task's input positions (the next
input offset per input topic), and when the state was last written. Every change goes through
`TaskState.apply` as one RocksDB write batch, so a crash never leaves a key applied without the
position that says so (docs/runtime.md; docs/decisions/state-store.md says why RocksDB).
"""

import json
import logging
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rocksdict import Options, Rdict, WriteBatch

from smoothscale.runtime._changelog import forget_reclaimed
from smoothscale.runtime.writer import Writer
from smoothscale.tasks import TaskId

log = logging.getLogger(__name__)

_META = "smoothscale"
_RECORDS = ".records"
"""The end of the names of the column families of record keys that stores written before
2026-11-28 had beside each store's (`_retired`); no store may be named so."""
LOOKUP_CHUNK = 500
"""State keys read from RocksDB at a time (`TaskState.entries`)."""
_ENTRY_HEAD = struct.Struct(">I")
"""An entry starts with its record key's length; the top bit set: a delete (no value)."""
_DELETED = 1 << 31
_POSITION = "position/"
_WRITER = "writer/"
_CLOSED = "closed/"
_VERIFIED = "verified/"
_GARBAGE = "garbage/"
_INPUT = "input/"
_WRITTEN_AT = "written-at"


def entry(record_key: bytes, value: bytes | None) -> bytes:
    """A state key's entry, as changes hold it and its store keeps it: the changelog record
    key that holds its current value and that value (None: the record is a delete).

    Bytes, not a tuple: a restore makes one per record it applies, and as many tuples kept
    alive made Python's garbage collector more than half of the fold's time (measured)."""
    if value is None:
        return _ENTRY_HEAD.pack(len(record_key) | _DELETED) + record_key
    return b"".join((_ENTRY_HEAD.pack(len(record_key)), record_key, value))


def value_of(entry: bytes) -> bytes | None:
    """An entry's value (None: a delete)."""
    (head,) = _ENTRY_HEAD.unpack_from(entry)
    return None if head & _DELETED else entry[_ENTRY_HEAD.size + head :]


def record_key_of(entry: bytes) -> bytes:
    """An entry's changelog record key."""
    (head,) = _ENTRY_HEAD.unpack_from(entry)
    return entry[_ENTRY_HEAD.size : _ENTRY_HEAD.size + (head & ~_DELETED)]


@dataclass
class StateChanges:
    """Changes to apply to a task's state at once."""

    entries: dict[str, dict[bytes, bytes | None]] = field(default_factory=dict)
    """Per store, state key -> its new entry (`entry`), or None to forget the key entirely."""
    reclaimed: dict[str, dict[bytes, set[bytes]]] = field(default_factory=dict)
    """Per store, state key -> record keys reclaimed: forget the key if its stored entry is
    still one of those records."""
    garbage: dict[str, set[bytes]] = field(default_factory=dict)
    """Per store, record keys superseded, to reclaim."""
    collected: dict[str, set[bytes]] = field(default_factory=dict)
    """Per store, record keys reclaimed (tombstoned): out of the garbage set."""
    positions: dict[str, int] = field(default_factory=dict)
    """Per store, the next changelog offset now applied."""
    verified: dict[str, int] = field(default_factory=dict)
    """Per store, the changelog offset up to which no higher writer has written."""
    writers: dict[str, Writer] = field(default_factory=dict)
    """Per store, the highest writer now seen on its changelog partition."""
    closed_batches: dict[str, int] = field(default_factory=dict)
    """Per store, the batch the highest writer last closed."""
    input_positions: dict[str, int] = field(default_factory=dict)
    """Per input topic, the next input offset to process."""

    def put(self, store: str, key: bytes, record_key: bytes, value: bytes) -> None:
        self.entries.setdefault(store, {})[key] = entry(record_key, value)

    def delete(self, store: str, key: bytes, record_key: bytes) -> None:
        self.entries.setdefault(store, {})[key] = entry(record_key, None)

    def supersede(self, store: str, record_key: bytes) -> None:
        collected = self.collected.get(store)
        if collected:
            collected.discard(record_key)
        self.garbage.setdefault(store, set()).add(record_key)

    def reclaim(self, store: str, record_keys: list[bytes], state_keys: list[bytes | None]) -> None:
        """`record_keys` were tombstoned (each of `state_keys`, for a data or delete record;
        None for another): out of the garbage set, and a key whose entry is still one of those
        records is forgotten (a reader of a compacted log can miss the records that superseded
        it: reclaimed deletes).

        A record key superseded in these same changes (in `garbage`: a restore read its
        tombstone in the same chunk as its successor) is only taken out of them: it never
        reached the store's garbage set, so it needs no delete there (on a changelog with a
        tombstone after every data record, a quarter of a restore's RocksDB entries)."""
        garbage = self.garbage.get(store)
        collected = self.collected.setdefault(store, set())
        if garbage:
            reclaimed_here = garbage.intersection(record_keys)
            garbage.difference_update(reclaimed_here)
            collected.update(record_keys)  # (a key in the garbage set is not in collected)
            collected.difference_update(reclaimed_here)
        else:
            collected.update(record_keys)
        elsewhere = forget_reclaimed(self.entries.setdefault(store, {}), record_keys, state_keys)
        if elsewhere:  # state keys these changes do not hold: the stored entry decides
            reclaimed = self.reclaimed.setdefault(store, {})
            for index in elsewhere:
                reclaimed.setdefault(cast(bytes, state_keys[index]), set()).add(record_keys[index])


def _retired(path: Path) -> bool:
    """Whether the database at `path` is in the format of before 2026-11-28 (a column family
    of record keys per store): it is restored from scratch (stores are caches of the
    changelog)."""
    if not (path / "CURRENT").exists():
        return False
    return any(name.endswith(_RECORDS) for name in Rdict.list_cf(str(path), _options()))


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return options


def task_directory(state_dir: Path, task: TaskId) -> Path:
    return state_dir / f"task-{task}"


class TaskState:
    """One task's state stores and runtime metadata, in one RocksDB database on local disk.

    Not thread-safe: one owner (the restore loop or the driver) uses it at a time.
    """

    def __init__(self, state_dir: Path, task: TaskId, stores: Iterable[str]) -> None:
        self.task = task
        self.stores = tuple(stores)
        for store in self.stores:
            if store == _META or store.endswith(_RECORDS):
                raise ValueError(
                    f"a state store cannot be named {store!r}: the runtime uses {_META!r} and "
                    f"names ending in {_RECORDS!r}"
                )
        self.path = task_directory(state_dir, task)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if _retired(self.path):
            log.info("task %d: the local store is in an older format: restoring it", task)
            Rdict.destroy(str(self.path), _options())
        names = (*self.stores, _META)
        families = {name: _options() for name in names}
        self._db = Rdict(str(self.path), _options(), column_families=families)
        self._families = {name: self._db.get_column_family(name) for name in families}
        self._handles = {name: self._db.get_column_family_handle(name) for name in families}

    def get(self, store: str, key: bytes) -> bytes | None:
        entry = self._families[store].get(key)
        return value_of(entry) if isinstance(entry, bytes) else None

    def get_many(self, store: str, keys: list[bytes]) -> list[bytes | None]:
        return [None if entry is None else value_of(entry) for entry in self.entries(store, keys)]

    def record_keys(self, store: str, keys: list[bytes]) -> list[bytes | None]:
        """Per state key, the changelog record key of its current value or delete (None:
        the key has no record)."""
        entries = self.entries(store, keys)
        return [None if entry is None else record_key_of(entry) for entry in entries]

    def deletes(self, store: str, keys: list[bytes]) -> list[bytes | None]:
        """Per state key, the changelog record key of the delete its entry is (None: the key has
        no entry, or its entry is a value)."""
        return [
            None if entry is None or value_of(entry) is not None else record_key_of(entry)
            for entry in self.entries(store, keys)
        ]

    def entries(self, store: str, keys: list[bytes]) -> list[bytes | None]:
        """Per state key, its entry (`entry`; None: the key has none), LOOKUP_CHUNK keys a
        read: RocksDB holds the GIL through a read, and the micro-batch's thread waits for it
        (a task's 3,000 keys in one read held it for about 2.5 ms)."""
        family = self._families[store]
        found: list[bytes | None] = []
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk: list[str | int | float | bytes | bool] = list(keys[start : start + LOOKUP_CHUNK])
            entries = family.get(chunk) or []
            found += [entry if isinstance(entry, bytes) else None for entry in entries]
        return found

    def items(self, store: str) -> Iterator[tuple[bytes, bytes]]:
        for key, entry in self._families[store].items():
            if isinstance(key, bytes) and isinstance(entry, bytes):
                value = value_of(entry)
                if value is not None:
                    yield key, value

    def scan(self, store: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The live keys of `store` that start with `prefix`, with their values, in key order
        (a range read: the processor state's timers, TTL deadlines and map entries)."""
        for key, entry in self._families[store].items(from_key=prefix):
            if not isinstance(key, bytes) or not key.startswith(prefix):
                break
            value = value_of(entry) if isinstance(entry, bytes) else None
            if value is not None:
                yield key, value

    def _meta(self, key: str) -> bytes | None:
        value = self._families[_META].get(key.encode())
        return value if isinstance(value, bytes) else None

    def _meta_int(self, key: str, default: int) -> int:
        value = self._meta(key)
        return default if value is None else int(value)

    def position(self, store: str) -> int:
        """The next changelog offset of `store` not yet applied (0: nothing applied)."""
        return self._meta_int(_POSITION + store, 0)

    def positions(self) -> dict[str, int]:
        return {store: self.position(store) for store in self.stores}

    def verified(self, store: str) -> int:
        """The changelog offset up to which the state is known to hold no record of a writer
        above the store's own (what restore applied is verified by construction)."""
        return self._meta_int(_VERIFIED + store, 0)

    def writer(self, store: str) -> Writer | None:
        """The highest writer seen on `store`'s changelog partition (None: none yet)."""
        value = self._meta(_WRITER + store)
        return None if value is None else Writer.parse(value.decode())

    def highest_writer(self) -> Writer | None:
        writers = [writer for store in self.stores if (writer := self.writer(store))]
        return max(writers, default=None)

    def epoch(self, store: str) -> int:
        """The epoch of the highest writer seen on `store`'s changelog partition (-1: none)."""
        writer = self.writer(store)
        return -1 if writer is None else writer.epoch

    def closed_batch(self, store: str) -> int:
        """The batch the highest writer last closed on `store`'s changelog (-1: none)."""
        return self._meta_int(_CLOSED + store, -1)

    def garbage(self, store: str, limit: int, key_prefix: bytes = b"") -> list[bytes]:
        """Up to `limit` superseded record keys of `store`'s changelog still to reclaim (only
        those starting with `key_prefix`). Each one's successor is known to count."""
        base = (_GARBAGE + store + "/").encode()
        prefix = base + key_prefix
        found: list[bytes] = []
        for key in self._families[_META].keys(from_key=prefix):
            if not isinstance(key, bytes) or not key.startswith(prefix) or len(found) >= limit:
                break
            found.append(key[len(base) :])
        return found

    def last_written(self) -> float | None:
        """When the state was last changed (seconds since the epoch, this machine's clock);
        None for a new store."""
        value = self._meta(_WRITTEN_AT)
        return None if value is None else float(value)

    def input_positions(self) -> dict[str, int]:
        """Per input topic, the next offset to process, as of the state applied."""
        prefix = _INPUT.encode()
        positions: dict[str, int] = {}
        for key, value in self._families[_META].items(from_key=prefix):
            if not isinstance(key, bytes) or not key.startswith(prefix):
                break
            if isinstance(value, bytes):
                positions[key[len(prefix) :].decode()] = int(value)
        return positions

    def apply(self, changes: StateChanges) -> None:
        """Apply `changes` atomically (one RocksDB write batch)."""
        batch = WriteBatch(raw_mode=True)
        meta = self._handles[_META]
        for store, reclaimed in changes.reclaimed.items():
            keys = list(reclaimed)
            for key, current in zip(keys, self.record_keys(store, keys), strict=True):
                if current in reclaimed[key]:
                    batch.delete(key, self._handles[store])
        put, delete = batch.put, batch.delete
        for store, entries in changes.entries.items():
            family = self._handles[store]
            for key, new in entries.items():
                if new is None:
                    delete(key, family)
                else:
                    put(key, new, family)
        for store, record_keys in changes.garbage.items():
            garbage = (_GARBAGE + store + "/").encode()
            for record_key in record_keys:
                put(garbage + record_key, b"", meta)
        for store, record_keys in changes.collected.items():
            garbage = (_GARBAGE + store + "/").encode()
            for record_key in record_keys:
                delete(garbage + record_key, meta)
        numbers = {
            _POSITION: changes.positions,
            _VERIFIED: changes.verified,
            _CLOSED: changes.closed_batches,
        }
        for prefix, values_by_store in numbers.items():
            for store, number in values_by_store.items():
                batch.put((prefix + store).encode(), str(number).encode(), meta)
        for store, writer in changes.writers.items():
            batch.put((_WRITER + store).encode(), str(writer).encode(), meta)
        for topic, offset in changes.input_positions.items():
            batch.put((_INPUT + topic).encode(), str(offset).encode(), meta)
        batch.put(_WRITTEN_AT.encode(), repr(time.time()).encode(), meta)
        self._db.write(batch)

    def snapshot(self, store: str) -> dict[str, Any]:
        """The store's content decoded (keys as text, values as JSON), for checks and tools."""
        return {key.decode(): json.loads(value) for key, value in self.items(store)}

    def close(self) -> None:
        for family in self._families.values():
            family.close()
        self._families.clear()
        self._handles.clear()
        self._db.close()

    def destroy(self) -> None:
        """Close the state and delete it from disk (a stale store to restore from scratch)."""
        self.close()
        Rdict.destroy(str(self.path), _options())
