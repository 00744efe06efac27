"""pyspark's StatefulProcessorHandle and state variables, over one task's store.

The method names, arguments and results are pyspark's (pyspark.sql.streaming.stateful_processor,
4.x): `getValueState`, `getListState`, `getMapState` (with `ttlDurationMs`), `registerTimer`,
`deleteTimer`, `listTimers`, `deleteIfExists`; ValueState `exists/get/update/clear`, ListState
`exists/get/put/appendValue/appendList/clear`, MapState `exists/getValue/containsKey/
updateValue/iterator/keys/values/removeKey/clear`. Values are tuples of the variable's schema.

A micro-batch reads the task's store as of its last commit, through the batch's own writes
(`BatchView`); the writes become the batch's state changes, committed with its outputs and
input position in the task's transaction (docs/decisions/stateful-processor.md).
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pyspark.sql.types import DataType, StructType

from smoothscale.runtime.processor import keyspace
from smoothscale.runtime.processor.codec import (
    check_type,
    row_from_json,
    row_to_json,
)
from smoothscale.runtime.store import TaskState

SchemaParser = Callable[[str], DataType]
"""Parses a DDL schema string ("count LONG") into a Spark type."""


class TimeMode(Enum):
    """pyspark's timeMode argument (case-insensitive there too)."""

    NONE = "none"
    PROCESSING_TIME = "processingtime"
    EVENT_TIME = "eventtime"


class ProcessorStateError(RuntimeError):
    """A processor used its handle in a way pyspark does not allow either."""


class Phase(Enum):
    """Where the processor is in a task's micro-batch (pyspark's StatefulProcessorHandleState)."""

    INIT = "init"
    DATA = "handleInputRows"
    TIMERS = "handleExpiredTimer"
    CLOSED = "close"


class BatchView:
    """One task's processor state during one micro-batch: the store as of the task's last
    commit, read through this batch's own writes (a key written None is deleted).

    `begin` opens a journal of the writes of one handler call; `rollback` undoes them (a
    handler that raised leaves the state as it was), `end` keeps them.
    """

    def __init__(self, state: TaskState, store: str) -> None:
        self._state = state
        self._store = store
        self._writes: dict[str, Any] = {}
        self._journal: dict[str, tuple[bool, Any]] | None = None

    def get(self, key: str) -> Any:
        if key in self._writes:
            return self._writes[key]
        raw = self._state.get(self._store, key.encode())
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self._remember(key)
        self._writes[key] = value

    def delete(self, key: str) -> None:
        self._remember(key)
        self._writes[key] = None

    def scan(self, prefix: str) -> Iterator[tuple[str, Any]]:
        """The live keys starting with `prefix` and their values, in key order, as of the
        call (writes made while iterating are not seen)."""
        written = {k: v for k, v in self._writes.items() if k.startswith(prefix)}
        pending = sorted(written)
        index = 0
        for raw_key, raw_value in self._state.scan(self._store, prefix.encode()):
            key = raw_key.decode()
            while index < len(pending) and pending[index] < key:
                if written[pending[index]] is not None:
                    yield pending[index], written[pending[index]]
                index += 1
            if key in written:
                continue
            yield key, json.loads(raw_value)
        for key in pending[index:]:
            if written[key] is not None:
                yield key, written[key]

    def begin(self) -> None:
        self._journal = {}

    def rollback(self) -> None:
        for key, (present, value) in (self._journal or {}).items():
            if present:
                self._writes[key] = value
            else:
                del self._writes[key]
        self._journal = None

    def end(self) -> None:
        self._journal = None

    def _remember(self, key: str) -> None:
        if self._journal is not None and key not in self._journal:
            self._journal[key] = (key in self._writes, self._writes.get(key))

    def changes(self) -> dict[str, Any]:
        """The batch's state changes: key -> new JSON value, or None to delete it; writes
        that change nothing (a value written as it was, a key deleted that is not there)
        are left out."""
        keys = list(self._writes)
        stored = self._state.get_many(self._store, [key.encode() for key in keys])
        changes: dict[str, Any] = {}
        for key, raw in zip(keys, stored, strict=True):
            value = self._writes[key]
            if value is None and raw is None:
                continue
            if raw is not None and value is not None and json.loads(raw) == value:
                continue
            changes[key] = value
        return changes


@dataclass
class Declared:
    kind: str
    schemas: tuple[StructType, ...]
    ttl: int | None


@dataclass
class BatchContext:
    """What a task's handle and state variables share during one micro-batch."""

    view: BatchView | None
    """None while the processor is only checked at start (nothing is read or written)."""
    time_mode: TimeMode
    batch_time: int
    """The batch's processing time in ms (-1 in time mode None)."""
    parse_schema: SchemaParser
    phase: Phase = Phase.INIT
    key: str | None = None
    """The grouping key being processed, as keyspace text (pyspark's implicit key)."""
    declared: dict[str, Declared] = field(default_factory=dict)

    def current_key(self, action: str) -> str:
        if self.key is None:
            raise ProcessorStateError(
                f"{action} needs a grouping key: state is read and written only in "
                "handleInputRows and handleExpiredTimer"
            )
        return self.key

    def store(self) -> BatchView:
        if self.view is None:
            raise ProcessorStateError("state is read and written only while processing rows")
        return self.view

    def expired(self, deadline: int | None) -> bool:
        """pyspark's rule: expired once the batch's processing time reaches the deadline."""
        return deadline is not None and self.batch_time >= deadline

    def deadline(self, ttl: int | None) -> int | None:
        return None if ttl is None else self.batch_time + ttl


class ValueState:
    """pyspark's ValueState: one value (a tuple of the schema's fields) per grouping key."""

    def __init__(self, context: BatchContext, name: str, schema: StructType, ttl: int | None):
        self._context, self._name, self._schema, self._ttl = context, name, schema, ttl

    def _key(self, action: str) -> str:
        return keyspace.variable(keyspace.VALUE, self._name, self._context.current_key(action))

    def _live(self) -> Any:
        record = self._context.store().get(self._key("ValueState.get"))
        if record is None or self._context.expired(record.get("x")):
            return None
        return record["v"]

    def exists(self) -> bool:
        return self._live() is not None

    def get(self) -> tuple[Any, ...] | None:
        value = self._live()
        return None if value is None else row_from_json(self._schema, value)

    def update(self, newValue: tuple[Any, ...]) -> None:
        key = self._key("ValueState.update")
        record: dict[str, Any] = {"v": row_to_json(self._schema, newValue)}
        deadline = self._context.deadline(self._ttl)
        view = self._context.store()
        if deadline is not None:
            record["x"] = deadline
            view.put(keyspace.deadline(deadline, key), 1)
        view.put(key, record)

    def clear(self) -> None:
        self._context.store().delete(self._key("ValueState.clear"))


class ListState:
    """pyspark's ListState: a list of values per grouping key; with TTL, each element expires
    on its own (the time it was put or appended plus the TTL)."""

    def __init__(self, context: BatchContext, name: str, schema: StructType, ttl: int | None):
        self._context, self._name, self._schema, self._ttl = context, name, schema, ttl

    def _key(self, action: str) -> str:
        return keyspace.variable(keyspace.LIST, self._name, self._context.current_key(action))

    def _elements(self, action: str) -> list[list[Any]]:
        stored: list[list[Any]] | None = self._context.store().get(self._key(action))
        return stored or []

    def exists(self) -> bool:
        return any(not self._context.expired(x) for _, x in self._elements("ListState.exists"))

    def get(self) -> Iterator[tuple[Any, ...]]:
        elements = self._elements("ListState.get")
        return iter(
            [row_from_json(self._schema, v) for v, x in elements if not self._context.expired(x)]
        )

    def put(self, newState: list[tuple[Any, ...]]) -> None:
        self._write(self._encode(newState, "put"), "ListState.put")

    def appendValue(self, newState: tuple[Any, ...]) -> None:
        if newState is None:
            raise ProcessorStateError(f"ListState {self._name!r}: cannot append None")
        elements = self._elements("ListState.appendValue")
        self._write([*elements, *self._encode([newState], "appendValue")], "ListState.appendValue")

    def appendList(self, newState: list[tuple[Any, ...]]) -> None:
        elements = self._elements("ListState.appendList")
        self._write([*elements, *self._encode(newState, "appendList")], "ListState.appendList")

    def clear(self) -> None:
        self._context.store().delete(self._key("ListState.clear"))

    def _encode(self, values: list[tuple[Any, ...]], action: str) -> list[list[Any]]:
        if not values or any(value is None for value in values):
            raise ProcessorStateError(
                f"ListState {self._name!r}.{action} needs a non-empty list of values, none "
                "of them None (as in pyspark)"
            )
        deadline = self._context.deadline(self._ttl)
        return [[row_to_json(self._schema, value), deadline] for value in values]

    def _write(self, elements: list[list[Any]], action: str) -> None:
        key = self._key(action)
        view = self._context.store()
        view.put(key, elements)
        deadlines = [x for _, x in elements if x is not None]
        if deadlines:
            view.put(keyspace.deadline(min(deadlines), key), 1)


class MapState:
    """pyspark's MapState: a map from user keys to values per grouping key; with TTL, each
    entry expires on its own."""

    def __init__(
        self,
        context: BatchContext,
        name: str,
        key_schema: StructType,
        value_schema: StructType,
        ttl: int | None,
    ):
        self._context, self._name, self._ttl = context, name, ttl
        self._key_schema, self._value_schema = key_schema, value_schema

    def _prefix(self, action: str) -> str:
        return keyspace.variable(keyspace.MAP, self._name, self._context.current_key(action))

    def _entry(self, user_key: tuple[Any, ...], action: str) -> str:
        encoded = keyspace.text(row_to_json(self._key_schema, user_key))
        return self._prefix(action) + encoded

    def _live(self, action: str) -> Iterator[tuple[str, Any]]:
        prefix = self._prefix(action)
        for key, record in self._context.store().scan(prefix):
            if not self._context.expired(record.get("x")):
                yield key[len(prefix) :], record["v"]

    def exists(self) -> bool:
        return next(self._live("MapState.exists"), None) is not None

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        record = self._context.store().get(self._entry(key, "MapState.getValue"))
        if record is None or self._context.expired(record.get("x")):
            return None
        return row_from_json(self._value_schema, record["v"])

    def containsKey(self, key: tuple[Any, ...]) -> bool:
        return self.getValue(key) is not None

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        entry = self._entry(key, "MapState.updateValue")
        record: dict[str, Any] = {"v": row_to_json(self._value_schema, value)}
        deadline = self._context.deadline(self._ttl)
        view = self._context.store()
        if deadline is not None:
            record["x"] = deadline
            view.put(keyspace.deadline(deadline, entry), 1)
        view.put(entry, record)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        return iter(
            [
                (
                    row_from_json(self._key_schema, json.loads(user_key)),
                    row_from_json(self._value_schema, value),
                )
                for user_key, value in self._live("MapState.iterator")
            ]
        )

    def keys(self) -> Iterator[tuple[Any, ...]]:
        return iter([key for key, _ in self.iterator()])

    def values(self) -> Iterator[tuple[Any, ...]]:
        return iter([value for _, value in self.iterator()])

    def removeKey(self, key: tuple[Any, ...]) -> None:
        self._context.store().delete(self._entry(key, "MapState.removeKey"))

    def clear(self) -> None:
        view = self._context.store()
        for key, _ in list(view.scan(self._prefix("MapState.clear"))):
            view.delete(key)


class ProcessorHandle:
    """pyspark's StatefulProcessorHandle, for one task's micro-batch."""

    def __init__(self, context: BatchContext) -> None:
        self._context = context

    def getValueState(
        self,
        stateName: str,
        schema: StructType | str,
        ttlDurationMs: int | None = None,
    ) -> ValueState:
        parsed = self._schema(stateName, schema, "schema")
        ttl = self._declare(stateName, keyspace.VALUE, (parsed,), ttlDurationMs)
        return ValueState(self._context, stateName, parsed, ttl)

    def getListState(
        self,
        stateName: str,
        schema: StructType | str,
        ttlDurationMs: int | None = None,
    ) -> ListState:
        parsed = self._schema(stateName, schema, "schema")
        ttl = self._declare(stateName, keyspace.LIST, (parsed,), ttlDurationMs)
        return ListState(self._context, stateName, parsed, ttl)

    def getMapState(
        self,
        stateName: str,
        userKeySchema: StructType | str,
        valueSchema: StructType | str,
        ttlDurationMs: int | None = None,
    ) -> MapState:
        key_schema = self._schema(stateName, userKeySchema, "userKeySchema")
        value_schema = self._schema(stateName, valueSchema, "valueSchema")
        ttl = self._declare(stateName, keyspace.MAP, (key_schema, value_schema), ttlDurationMs)
        return MapState(self._context, stateName, key_schema, value_schema, ttl)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        key = self._timer_key("registerTimer")
        view = self._context.store()
        by_key = keyspace.timer_by_key(key, expiryTimestampMs)
        if view.get(by_key) is None:
            view.put(by_key, 1)
            view.put(keyspace.timer_by_time(expiryTimestampMs, key), 1)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        delete_timer(self._context.store(), self._timer_key("deleteTimer"), expiryTimestampMs)

    def listTimers(self) -> Iterator[int]:
        prefix = keyspace.TIMER_BY_KEY + self._timer_key("listTimers")
        view = self._context.store()
        return iter([keyspace.time_of(key[len(prefix) :]) for key, _ in view.scan(prefix)])

    def deleteIfExists(self, stateName: str) -> None:
        self._in_init("deleteIfExists")
        view = self._context.view
        if view is None:
            return  # checked at start: nothing to delete
        for kind in (keyspace.VALUE, keyspace.LIST, keyspace.MAP):
            for key, _ in list(view.scan(keyspace.variable_prefix(kind, stateName))):
                view.delete(key)

    def _timer_key(self, action: str) -> str:
        context = self._context
        if context.time_mode is TimeMode.NONE:
            raise ProcessorStateError(
                f"{action}: timers need time mode ProcessingTime or EventTime (this pipeline's "
                "time mode is None)"
            )
        return context.current_key(action)

    def _in_init(self, action: str) -> None:
        if self._context.phase is not Phase.INIT:
            raise ProcessorStateError(
                f"{action} is allowed only in init(), not in {self._context.phase.value}()"
            )

    def _schema(self, name: str, schema: StructType | str, argument: str) -> StructType:
        self._in_init("getting a state variable")
        parsed = self._context.parse_schema(schema) if isinstance(schema, str) else schema
        if not isinstance(parsed, StructType):
            raise ProcessorStateError(
                f"state variable {name!r}: {argument} must be a struct (a StructType, or DDL "
                f"such as 'count LONG'), not {parsed.simpleString()}"
            )
        check_type(parsed, f"state variable {name!r}")
        return parsed

    def _declare(
        self, name: str, kind: str, schemas: tuple[StructType, ...], ttl: int | None
    ) -> int | None:
        if ttl is not None and ttl < 0:
            raise ProcessorStateError(
                f"state variable {name!r}: ttlDurationMs must be positive, not {ttl}"
            )
        ttl = ttl or None  # 0 is no TTL, as in Spark
        if ttl is not None and self._context.time_mode is not TimeMode.PROCESSING_TIME:
            raise ProcessorStateError(
                f"state variable {name!r} has a TTL, which needs time mode ProcessingTime "
                f"(as in Spark); this pipeline's time mode is {self._context.time_mode.name}"
            )
        declared = Declared(kind, schemas, ttl)
        known = self._context.declared.setdefault(name, declared)
        if known != declared:
            raise ProcessorStateError(
                f"state variable {name!r} is declared twice, differently; give each state "
                "variable a name of its own"
            )
        return ttl


def delete_timer(view: BatchView, key: str, expiry: int) -> None:
    """Delete the timer of grouping key `key` (keyspace text) at `expiry`, if registered."""
    by_key = keyspace.timer_by_key(key, expiry)
    if view.get(by_key) is not None:
        view.delete(by_key)
        view.delete(keyspace.timer_by_time(expiry, key))
