"""Per-task state on local disk: one RocksDB database per task (via rocksdict).

A task's database has one column family per state store, holding the store's keys and values
(the bytes of the changelog record values), and a `smoothscale` column family for what the
runtime keeps beside them: per store the next changelog offset applied (the restore position)
and the highest ownership epoch seen, and the task's input positions (the next input offset per
input topic). Every change goes through `TaskState.apply` as one RocksDB write batch, so a
crash never leaves a key applied without the position that says so (docs/runtime.md;
docs/decisions/state-store.md says why RocksDB).
"""

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from smoothscale.tasks import TaskId

_META = "smoothscale"
_POSITION = "position/"
_EPOCH = "epoch/"
_INPUT = "input/"


@dataclass
class StateChanges:
    """Changes to apply to a task's state at once."""

    puts: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    """Per store, key -> new value."""
    deletes: dict[str, set[bytes]] = field(default_factory=dict)
    """Per store, keys to delete."""
    positions: dict[str, int] = field(default_factory=dict)
    """Per store, the next changelog offset now applied."""
    epochs: dict[str, int] = field(default_factory=dict)
    """Per store, the highest epoch now seen on its changelog partition."""
    input_positions: dict[str, int] = field(default_factory=dict)
    """Per input topic, the next input offset to process."""

    def put(self, store: str, key: bytes, value: bytes) -> None:
        self.deletes.get(store, set()).discard(key)
        self.puts.setdefault(store, {})[key] = value

    def delete(self, store: str, key: bytes) -> None:
        self.puts.get(store, {}).pop(key, None)
        self.deletes.setdefault(store, set()).add(key)


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
        if _META in self.stores:
            raise ValueError(f"a state store cannot be named {_META!r}: the runtime uses it")
        self.path = task_directory(state_dir, task)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        families = {name: _options() for name in (*self.stores, _META)}
        self._db = Rdict(str(self.path), _options(), column_families=families)
        self._families = {name: self._db.get_column_family(name) for name in families}
        self._handles = {name: self._db.get_column_family_handle(name) for name in families}

    def get(self, store: str, key: bytes) -> bytes | None:
        value = self._families[store].get(key)
        return value if isinstance(value, bytes) else None

    def get_many(self, store: str, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        lookup: list[str | int | float | bytes | bool] = list(keys)
        values = self._families[store].get(lookup)
        return [value if isinstance(value, bytes) else None for value in values or []]

    def items(self, store: str) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._families[store].items():
            if isinstance(key, bytes) and isinstance(value, bytes):
                yield key, value

    def _meta_int(self, key: str, default: int) -> int:
        value = self._families[_META].get(key.encode())
        return int(value) if isinstance(value, bytes) else default

    def position(self, store: str) -> int:
        """The next changelog offset of `store` not yet applied (0: nothing applied)."""
        return self._meta_int(_POSITION + store, 0)

    def positions(self) -> dict[str, int]:
        return {store: self.position(store) for store in self.stores}

    def epoch(self, store: str) -> int:
        """The highest ownership epoch seen on `store`'s changelog partition (-1: none)."""
        return self._meta_int(_EPOCH + store, -1)

    def input_positions(self) -> dict[str, int]:
        """Per input topic, the next offset to process, as of the state applied."""
        prefix = _INPUT.encode()
        positions: dict[str, int] = {}
        for key, value in self._families[_META].items():
            if isinstance(key, bytes) and isinstance(value, bytes) and key.startswith(prefix):
                positions[key[len(prefix) :].decode()] = int(value)
        return positions

    def apply(self, changes: StateChanges) -> None:
        """Apply `changes` atomically (one RocksDB write batch)."""
        batch = WriteBatch(raw_mode=True)
        for store, puts in changes.puts.items():
            for key, value in puts.items():
                batch.put(key, value, self._handles[store])
        for store, keys in changes.deletes.items():
            for key in keys:
                batch.delete(key, self._handles[store])
        meta = self._handles[_META]
        for store, position in changes.positions.items():
            batch.put((_POSITION + store).encode(), str(position).encode(), meta)
        for store, epoch in changes.epochs.items():
            batch.put((_EPOCH + store).encode(), str(epoch).encode(), meta)
        for topic, offset in changes.input_positions.items():
            batch.put((_INPUT + topic).encode(), str(offset).encode(), meta)
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


def positions_reached(state: TaskState, targets: Mapping[str, int]) -> bool:
    """Whether `state` has applied every store's changelog up to its target offset."""
    return all(state.position(store) >= offset for store, offset in targets.items())
