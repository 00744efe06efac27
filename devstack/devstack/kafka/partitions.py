"""Partitions added to a topic, on brokers that cannot add any (for the Kafka front).

librdkafka's mock brokers create a topic with a fixed partition count and have no
CreatePartitions. The front grows a topic the only way the mock allows: the partitions added
live in an *extension* topic of the mock (one per growth), named with a character Kafka forbids
in topic names so that no client topic can take the name. `PartitionMap` maps between the
clients' view (topic, partition) and the mock's (topic or extension, partition within it) in
every request and response that names partitions, so a client sees one topic whose new
partitions start empty at offset 0 and work like the others: produce, fetch, list offsets,
group offsets, transactions.

Each API the map rewrites is described once, declaratively (`_SCHEMAS`): where its topic names
and partition indexes sit, in each non-flexible version (the front never advertises a flexible
version of these APIs). One codec walks every schema. A request's topic entry is split into one
entry per topic of the mock it touches; a response's entries of extensions are merged back into
their topic's entry, partitions renumbered.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from devstack.kafka.protocol import (
    ADD_PARTITIONS_TO_TXN,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    TXN_OFFSET_COMMIT,
    Reader,
    Writer,
)

EXTENSION_MARK = "+"
"""Separates a topic's name from its extension's number: `orders+1` holds the partitions the
first growth of `orders` added. Kafka topic names never contain it."""


@dataclass(frozen=True)
class Extension:
    """Partitions [first, first + count) of a topic, kept in the mock's topic `name`."""

    name: str
    first: int
    count: int


# ---- the schemas ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    kind: str
    """int8, int16, int32, int64, string, nullable_string, bytes, nullable_bytes; int32s (an
    array of int32); array or nullable_array (of `fields`); topic (a string: the topic's name);
    partition (an int32: a partition's index); partitions (an array of partition indexes)."""
    since: int = 0
    until: int = 1_000
    fields: tuple["_Field", ...] = ()

    def present(self, version: int) -> bool:
        return self.since <= version <= self.until


def _f(kind: str, since: int = 0, until: int = 1_000) -> _Field:
    return _Field(kind, since, until)


def _array(*fields: _Field, since: int = 0, nullable: bool = False) -> _Field:
    return _Field("nullable_array" if nullable else "array", since, 1_000, fields)


_TOPIC, _PARTITION, _PARTITIONS = _f("topic"), _f("partition"), _f("partitions")

_SCHEMAS: dict[int, tuple[tuple[_Field, ...], tuple[_Field, ...]]] = {
    # (request fields, response fields), up to the front's version cap of each API.
    PRODUCE: (
        (
            _f("nullable_string", since=3),  # transactional_id
            _f("int16"),  # acks
            _f("int32"),  # timeout_ms
            _array(_TOPIC, _array(_PARTITION, _f("nullable_bytes"))),
        ),
        (
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int16"),  # error_code
                    _f("int64"),  # base_offset
                    _f("int64", since=2),  # log_append_time_ms
                    _f("int64", since=5),  # log_start_offset
                    _array(_f("int32"), _f("nullable_string"), since=8),  # record_errors
                    _f("nullable_string", since=8),  # error_message
                ),
            ),
            _f("int32", since=1),  # throttle_time_ms
        ),
    ),
    FETCH: (
        (
            _f("int32"),  # replica_id
            _f("int32"),  # max_wait_ms
            _f("int32"),  # min_bytes
            _f("int32", since=3),  # max_bytes
            _f("int8", since=4),  # isolation_level
            _f("int32", since=7),  # session_id
            _f("int32", since=7),  # session_epoch
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int32", since=9),  # current_leader_epoch
                    _f("int64"),  # fetch_offset
                    _f("int64", since=5),  # log_start_offset
                    _f("int32"),  # partition_max_bytes
                ),
            ),
            _array(_TOPIC, _PARTITIONS, since=7),  # forgotten_topics_data
            _f("string", since=11),  # rack_id
        ),
        (
            _f("int32", since=1),  # throttle_time_ms
            _f("int16", since=7),  # error_code
            _f("int32", since=7),  # session_id
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int16"),  # error_code
                    _f("int64"),  # high_watermark
                    _f("int64", since=4),  # last_stable_offset
                    _f("int64", since=5),  # log_start_offset
                    _array(_f("int64"), _f("int64"), since=4, nullable=True),  # aborted
                    _f("int32", since=11),  # preferred_read_replica
                    _f("nullable_bytes"),  # records
                ),
            ),
        ),
    ),
    LIST_OFFSETS: (
        (
            _f("int32"),  # replica_id
            _f("int8", since=2),  # isolation_level
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int32", since=4),  # current_leader_epoch
                    _f("int64"),  # timestamp
                    _f("int32", until=0),  # max_num_offsets
                ),
            ),
        ),
        (
            _f("int32", since=2),  # throttle_time_ms
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int16"),  # error_code
                    _f("int64s", until=0),  # old_style_offsets
                    _f("int64", since=1),  # timestamp
                    _f("int64", since=1),  # offset
                    _f("int32", since=4),  # leader_epoch
                ),
            ),
        ),
    ),
    METADATA: (
        (
            _array(_TOPIC, nullable=True),
            _f("int8", since=4),  # allow_auto_topic_creation
            _f("int8", since=8),  # include_cluster_authorized_operations
            _f("int8", since=8),  # include_topic_authorized_operations
        ),
        (
            _f("int32", since=3),  # throttle_time_ms
            _array(_f("int32"), _f("string"), _f("int32"), _f("nullable_string", since=1)),
            _f("nullable_string", since=2),  # cluster_id
            _f("int32", since=1),  # controller_id
            _array(
                _f("int16"),  # error_code
                _TOPIC,
                _f("int8", since=1),  # is_internal
                _array(
                    _f("int16"),  # error_code
                    _PARTITION,
                    _f("int32"),  # leader_id
                    _f("int32", since=7),  # leader_epoch
                    _f("int32s"),  # replica_nodes
                    _f("int32s"),  # isr_nodes
                    _f("int32s", since=5),  # offline_replicas
                ),
                _f("int32", since=8),  # topic_authorized_operations
            ),
            _f("int32", since=8),  # cluster_authorized_operations
        ),
    ),
    OFFSET_COMMIT: (
        (
            _f("string"),  # group_id
            _f("int32", since=1),  # generation_id
            _f("string", since=1),  # member_id
            _f("nullable_string", since=7),  # group_instance_id
            _Field("int64", since=2, until=4),  # retention_time_ms
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int64"),  # committed_offset
                    _f("int32", since=6),  # committed_leader_epoch
                    _Field("int64", since=1, until=1),  # commit_timestamp
                    _f("nullable_string"),  # committed_metadata
                ),
            ),
        ),
        (
            _f("int32", since=3),  # throttle_time_ms
            _array(_TOPIC, _array(_PARTITION, _f("int16"))),
        ),
    ),
    OFFSET_FETCH: (
        (
            _f("string"),  # group_id
            _Field("nullable_array", 0, 1_000, (_TOPIC, _PARTITIONS)),
        ),
        (
            _f("int32", since=3),  # throttle_time_ms
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int64"),  # committed_offset
                    _f("int32", since=5),  # committed_leader_epoch
                    _f("nullable_string"),  # metadata
                    _f("int16"),  # error_code
                ),
            ),
            _f("int16", since=2),  # error_code
        ),
    ),
    OFFSET_FOR_LEADER_EPOCH: (
        (
            _f("int32", since=3),  # replica_id
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int32", since=2),  # current_leader_epoch
                    _f("int32"),  # leader_epoch
                ),
            ),
        ),
        (
            _f("int32", since=2),  # throttle_time_ms
            _array(
                _TOPIC,
                _array(
                    _f("int16"),  # error_code
                    _PARTITION,
                    _f("int32", since=1),  # leader_epoch
                    _f("int64"),  # end_offset
                ),
            ),
        ),
    ),
    TXN_OFFSET_COMMIT: (
        (
            _f("string"),  # transactional_id
            _f("string"),  # group_id
            _f("int64"),  # producer_id
            _f("int16"),  # producer_epoch
            _array(
                _TOPIC,
                _array(
                    _PARTITION,
                    _f("int64"),  # committed_offset
                    _f("int32", since=2),  # committed_leader_epoch
                    _f("nullable_string"),  # committed_metadata
                ),
            ),
        ),
        (
            _f("int32"),  # throttle_time_ms
            _array(_TOPIC, _array(_PARTITION, _f("int16"))),
        ),
    ),
    ADD_PARTITIONS_TO_TXN: (
        (
            _f("string"),  # transactional_id
            _f("int64"),  # producer_id
            _f("int16"),  # producer_epoch
            _array(_TOPIC, _PARTITIONS),
        ),
        (
            _f("int32"),  # throttle_time_ms
            _array(_TOPIC, _array(_PARTITION, _f("int16"))),
        ),
    ),
}

VERSION_CAPS = {
    OFFSET_COMMIT: 7,
    OFFSET_FETCH: 5,
    OFFSET_FOR_LEADER_EPOCH: 3,
    TXN_OFFSET_COMMIT: 2,
}
"""The highest (non-flexible) versions of the APIs this module parses that the front does not
cap already for reasons of its own."""

MAPPED_APIS = frozenset(_SCHEMAS)
"""The APIs whose requests and responses `PartitionMap` rewrites."""


# ---- the codec --------------------------------------------------------------------------------

_Struct = list[Any]
"""A decoded struct: the values of its fields present in the version, in order."""

_READ: dict[str, Callable[[Reader], Any]] = {
    "int8": Reader.int8,
    "int16": Reader.int16,
    "int32": Reader.int32,
    "int64": Reader.int64,
    "string": Reader.string,
    "nullable_string": Reader.nullable_string,
    "nullable_bytes": Reader.nullable_bytes,
    "topic": Reader.string,
    "partition": Reader.int32,
}
_WRITE: dict[str, Callable[[Writer, Any], Writer]] = {
    "int8": Writer.int8,
    "int16": Writer.int16,
    "int32": Writer.int32,
    "int64": Writer.int64,
    "string": Writer.nullable_string,
    "nullable_string": Writer.nullable_string,
    "nullable_bytes": Writer.nullable_bytes,
    "topic": Writer.nullable_string,
    "partition": Writer.int32,
}
_NUMBER_ARRAYS = {"int32s": (Reader.int32, Writer.int32), "int64s": (Reader.int64, Writer.int64)}
_NUMBER_ARRAYS["partitions"] = _NUMBER_ARRAYS["int32s"]


def _present(fields: tuple[_Field, ...], version: int) -> list[_Field]:
    return [field for field in fields if field.present(version)]


def _decode(reader: Reader, fields: list[_Field], version: int) -> _Struct:
    values: _Struct = []
    for field in fields:
        if field.kind in _READ:
            values.append(_READ[field.kind](reader))
        elif field.kind in _NUMBER_ARRAYS:
            read = _NUMBER_ARRAYS[field.kind][0]
            count = reader.array_length()
            values.append(None if count < 0 else [read(reader) for _ in range(count)])
        else:
            count = reader.array_length()
            inner = _present(field.fields, version)
            values.append(
                None if count < 0 else [_decode(reader, inner, version) for _ in range(count)]
            )
    return values


def _encode(writer: Writer, fields: list[_Field], version: int, values: _Struct) -> None:
    for field, value in zip(fields, values, strict=True):
        if field.kind in _WRITE:
            _WRITE[field.kind](writer, value)
        elif field.kind in _NUMBER_ARRAYS:
            write = _NUMBER_ARRAYS[field.kind][1]
            writer.int32(-1 if value is None else len(value))
            for number in value or ():
                write(writer, number)
        else:
            writer.int32(-1 if value is None else len(value))
            inner = _present(field.fields, version)
            for item in value or ():
                _encode(writer, inner, version, item)


def _kinds(fields: list[_Field]) -> list[str]:
    return [field.kind for field in fields]


# ---- the map ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """Where a topic entry (its fields present in a version) keeps its name and partitions."""

    topic: int
    partitions: int | None
    """The field listing its partitions (None: it has none, as in a Metadata request)."""
    index: int | None
    """Within a partition's struct, its index field (None: the partitions are plain indexes)."""

    @classmethod
    def of(cls, fields: list[_Field], version: int) -> "_Layout":
        kinds = _kinds(fields)
        for at, field in enumerate(fields):
            if field.kind == "partitions":
                return cls(kinds.index("topic"), at, None)
            if field.kind in ("array", "nullable_array"):
                inner = _kinds(_present(field.fields, version))
                if "partition" in inner:
                    return cls(kinds.index("topic"), at, inner.index("partition"))
        return cls(kinds.index("topic"), None, None)

    def items(self, entry: _Struct) -> list[Any]:
        return [] if self.partitions is None else list(entry[self.partitions] or [])

    def partition(self, item: Any) -> int:
        return int(item if self.index is None else item[self.index])

    def renumbered(self, item: Any, partition: int) -> Any:
        return partition if self.index is None else _with(item, self.index, partition)


class PartitionMap:
    """The grown topics and their extensions, and the rewrites between clients and the mock."""

    def __init__(self) -> None:
        self._extensions: dict[str, list[Extension]] = {}
        self._owners: dict[str, tuple[str, Extension]] = {}

    def __bool__(self) -> bool:
        return bool(self._extensions)

    def grow(self, topic: str, partitions: int, total: int) -> Extension:
        """Record that `topic`, with `partitions` partitions now (its extensions included),
        grows to `total`: the extension that holds the new ones (the caller creates it)."""
        extensions = self._extensions.setdefault(topic, [])
        extension = Extension(
            f"{topic}{EXTENSION_MARK}{len(extensions) + 1}", partitions, total - partitions
        )
        extensions.append(extension)
        self._owners[extension.name] = (topic, extension)
        return extension

    def extensions(self, topic: str) -> list[Extension]:
        """The extensions of `topic`, oldest first."""
        return list(self._extensions.get(topic, ()))

    def forget(self, topic: str) -> list[Extension]:
        """`topic` is deleted: its extensions (for the caller to delete)."""
        extensions = self._extensions.pop(topic, [])
        for extension in extensions:
            del self._owners[extension.name]
        return extensions

    def forget_extension(self, extension: Extension) -> None:
        """`extension` could not be created: the topic stays as it was."""
        extensions = self._extensions[self._owners.pop(extension.name)[0]]
        extensions.remove(extension)

    def is_extension(self, name: str) -> bool:
        return name in self._owners

    def to_mock(self, topic: str, partition: int) -> tuple[str, int]:
        """Where the client's `partition` of `topic` lives in the mock."""
        for extension in self._extensions.get(topic, ()):
            if extension.first <= partition < extension.first + extension.count:
                return extension.name, partition - extension.first
        return topic, partition

    def to_client(self, name: str, partition: int) -> tuple[str, int]:
        """The client's (topic, partition) of the mock's `partition` of `name`."""
        owned = self._owners.get(name)
        if owned is None:
            return name, partition
        topic, extension = owned
        return topic, extension.first + partition

    def request(self, api_key: int, version: int, body: bytes) -> bytes:
        """A request body of `api_key` in the mock's view: each topic entry split into one per
        topic of the mock its partitions live in; a Metadata request for a grown topic asks
        for its extensions too."""
        return self._rewrite_message(api_key, version, body, 0, self._split)

    def response(self, api_key: int, version: int, body: bytes) -> bytes:
        """A response body of `api_key` in the client's view: entries of extensions merged
        into their topic's, partitions renumbered."""
        return self._rewrite_message(api_key, version, body, 1, self._merge)

    def _rewrite_message(
        self,
        api_key: int,
        version: int,
        body: bytes,
        side: int,
        entries: Callable[[_Layout, list[_Struct]], list[_Struct]],
    ) -> bytes:
        fields = _present(_SCHEMAS[api_key][side], version)
        reader = Reader(body)
        values = _decode(reader, fields, version)
        values = self._rewrite(fields, version, values, entries)
        writer = Writer()
        _encode(writer, fields, version, values)
        return writer.raw(reader.rest()).bytes()

    def _rewrite(
        self,
        fields: list[_Field],
        version: int,
        values: _Struct,
        entries: Callable[[_Layout, list[_Struct]], list[_Struct]],
    ) -> _Struct:
        """`values` with every array of topic entries passed through `entries`."""
        rewritten = list(values)
        for at, field in enumerate(fields):
            if field.kind not in ("array", "nullable_array") or values[at] is None:
                continue
            inner = _present(field.fields, version)
            if "topic" in _kinds(inner):
                rewritten[at] = entries(_Layout.of(inner, version), values[at])
            else:
                rewritten[at] = [
                    self._rewrite(inner, version, item, entries) for item in values[at]
                ]
        return rewritten

    def _split(self, layout: _Layout, topics: list[_Struct]) -> list[_Struct]:
        result: list[_Struct] = []
        for entry in topics:
            topic = entry[layout.topic]
            extensions = self._extensions.get(topic)
            if not extensions:
                result.append(entry)
            elif layout.partitions is None:  # a Metadata request: the topic and its extensions
                result.append(entry)
                result.extend(_with(entry, layout.topic, e.name) for e in extensions)
            else:
                by_name: dict[str, list[Any]] = {topic: []}
                for item in layout.items(entry):
                    name, partition = self.to_mock(topic, layout.partition(item))
                    by_name.setdefault(name, []).append(layout.renumbered(item, partition))
                for name, items in by_name.items():
                    if items or (name == topic and len(by_name) == 1):
                        result.append(
                            _with(_with(entry, layout.topic, name), layout.partitions, items)
                        )
        return result

    def _merge(self, layout: _Layout, topics: list[_Struct]) -> list[_Struct]:
        """One entry per client topic: its own entry's fields (the first entry's when it has
        none) with the partitions of every entry of the topic and its extensions."""
        own: dict[str, _Struct] = {}
        partitions: dict[str, list[Any]] = {}
        for entry in topics:
            name = entry[layout.topic]
            topic, _ = self.to_client(name, 0)
            if name == topic or topic not in own:
                own[topic] = _with(entry, layout.topic, topic)
            partitions.setdefault(topic, []).extend(
                layout.renumbered(item, self.to_client(name, layout.partition(item))[1])
                for item in layout.items(entry)
            )
        if layout.partitions is None:
            return list(own.values())
        return [
            _with(entry, layout.partitions, partitions[topic])
            if entry[layout.partitions] is not None or partitions[topic]
            else entry
            for topic, entry in own.items()
        ]


def _with(values: _Struct, index: int, value: Any) -> _Struct:
    copy = list(values)
    copy[index] = value
    return copy
