"""A Kafka-protocol front that makes the embedded (mock) brokers answer like a real cluster.

The operator administers topics with the AdminClient, and must not have a path that only tests
take; librdkafka's mock brokers cannot create topics or describe their configs, create any topic
a client names, and never compact. The front listens on one loopback port per mock broker and
forwards every request to its broker, except that it:

- answers CreateTopics (v0-v4), DescribeConfigs (v0-v1) and IncrementalAlterConfigs (v0) for
  topics itself, creating topics through the EmbeddedKafka and keeping their configs;
- turns off allow_auto_topic_creation in Metadata requests, so an unknown topic is
  UNKNOWN_TOPIC_OR_PARTITION and is not created (auto.create.topics.enable=false);
- rewrites broker addresses in Metadata and FindCoordinator responses to its own listeners, and
  caps the versions it advertises in ApiVersions to non-flexible ones it parses (and below the
  Produce and Fetch versions that carry leader endpoints, KIP-951);
- after `compact`, rewrites Fetch responses of that partition as Kafka's log cleaner leaves the
  log (see compaction.py). Until then Fetch responses are copied untouched;
- answers CreatePartitions (v0-v1) itself: the mock cannot add partitions to a topic, so the
  partitions added live in an extension topic of the mock, and every request and response that
  names partitions (Produce, Fetch, ListOffsets, Metadata, group offsets, transactions) is
  mapped between the clients' view and the mock's (see partitions.py). It applies CreateTopics,
  CreatePartitions and DeleteTopics one at a time, as Kafka's controller does;
- answers DeleteRecords (v0-v1) itself: it keeps each partition's log start offset, which
  ListOffsets answers then never go below, and a Fetch below it is OFFSET_OUT_OF_RANGE, as on a
  cluster whose retention deleted the records;
- fences the older producers of a transactional.id once a newer one is initialised, refusing
  their Produce and transaction requests as Kafka does (see fencing.py), and aborts the open
  transaction of the producer it fences;
- takes the record batches of aborted transactions (aborted by their producer, or by its
  fencing) out of read_committed Fetch responses, as Kafka never serves them to such readers
  (see transactions.py).

It runs an asyncio loop in a background thread of the process that owns the EmbeddedKafka.
"""

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar

from devstack.kafka.compaction import (
    Compaction,
    RecordBatch,
    plan_compaction,
    read_batches,
    rewrite_records,
)
from devstack.kafka.embedded import EmbeddedKafka, EmbeddedKafkaError
from devstack.kafka.fencing import VERSION_CAPS as _TRANSACTION_CAPS
from devstack.kafka.fencing import ProducerFence
from devstack.kafka.partitions import MAPPED_APIS, PartitionMap
from devstack.kafka.partitions import VERSION_CAPS as _PARTITION_CAPS
from devstack.kafka.protocol import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    ALTER_CONFIGS,
    API_VERSIONS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    DESCRIBE_CLUSTER,
    DESCRIBE_CONFIGS,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    Reader,
    RequestHeader,
    Writer,
    frame,
    read_request_header,
)
from devstack.kafka.transactions import (
    TransactionalWrite,
    TransactionEnd,
    TransactionLog,
    produce_base_offsets,
    transaction_end,
    transaction_end_accepted,
    transactional_write,
    without_aborted,
)

T = TypeVar("T")

_log = logging.getLogger(__name__)
# How a pump ends when its peer closes the connection: not worth a log line.
_CONNECTION_CLOSED = (asyncio.IncompleteReadError, ConnectionError)
_CALL_SECONDS = 5.0
_CALL_ATTEMPTS = 3
_RESPONDING: "set[asyncio.Task[None]]" = set()
"""The tasks answering requests the front answers itself, until they are done."""


# Highest version the front lets clients use of the APIs whose responses it parses or that
# carry broker addresses in later versions.
_VERSION_CAPS = {
    PRODUCE: 8,
    FETCH: 11,
    LIST_OFFSETS: 5,
    METADATA: 8,
    FIND_COORDINATOR: 2,
    **_TRANSACTION_CAPS,
    **_PARTITION_CAPS,
}
_FENCEABLE = {PRODUCE, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN}
_ANSWERED_HERE = {
    CREATE_PARTITIONS: (0, 1),
    CREATE_TOPICS: (0, 4),
    DELETE_TOPICS: (0, 3),
    DELETE_RECORDS: (0, 1),
    DESCRIBE_CONFIGS: (0, 1),
    INCREMENTAL_ALTER_CONFIGS: (0, 0),
}
# APIs the mock advertises that would bypass the front's topic configs or leak broker addresses.
_HIDDEN = {ALTER_CONFIGS, DESCRIBE_CLUSTER}

_NONE = 0
_OFFSET_OUT_OF_RANGE = 1
_UNKNOWN_TOPIC_OR_PARTITION = 3
_LATEST = -1  # ListOffsets' timestamp for the high watermark (and DeleteRecords' "all")
_READ_COMMITTED = 1  # Fetch's isolation level
_INVALID_TOPIC_EXCEPTION = 17
_TOPIC_ALREADY_EXISTS = 36
_INVALID_PARTITIONS = 37
_INVALID_REPLICATION_FACTOR = 38
_INVALID_CONFIG = 40
_INVALID_REQUEST = 42

_TOPIC_RESOURCE = 2
_TOPICS_ONLY = "this dev cluster keeps the configs of topics only"
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations
_DYNAMIC_TOPIC_CONFIG = 1
_DEFAULT_CONFIG = 5

_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_DEFAULT_PARTITIONS = 1  # Kafka's num.partitions
_DEFAULT_REPLICATION_FACTOR = 1  # Kafka's default.replication.factor

# Kafka's defaults for the topic configs clients usually read.
TOPIC_CONFIG_DEFAULTS: Mapping[str, str] = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "60000",
    "flush.messages": "9223372036854775807",
    "flush.ms": "9223372036854775807",
    "index.interval.bytes": "4096",
    "max.compaction.lag.ms": "9223372036854775807",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "min.insync.replicas": "1",
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "segment.bytes": "1073741824",
    "segment.ms": "604800000",
    "unclean.leader.election.enable": "false",
}


class KafkaFrontError(RuntimeError):
    """The front could not do what was asked (its message says what and why)."""


@dataclass(frozen=True)
class _Address:
    host: str
    port: int


def _parse_addresses(bootstrap_servers: str) -> list[_Address]:
    addresses = []
    for server in bootstrap_servers.split(","):
        host, _, port = server.rpartition(":")
        addresses.append(_Address(host, int(port)))
    return addresses


@dataclass(frozen=True)
class _Forwarded:
    """A request forwarded to a broker, awaiting its response: what the rewrite needs."""

    answer: "asyncio.Future[bytes]"
    api_key: int
    version: int
    fetch_offsets: Mapping[tuple[str, int], int]
    """For a Fetch: the offset each partition is read from (empty when nothing needs it)."""
    transactional_id: str | None = None
    """For an InitProducerId: the transactional.id it initialises."""
    read_committed: bool = False
    """For a Fetch: whether it reads committed records only (isolation level 1)."""
    transactional_write: TransactionalWrite | None = None
    """For a Produce: what it writes in its producer's transaction, if it is in one."""
    transaction_end: TransactionEnd | None = None
    """For an EndTxn: the transaction it ends, and how."""


@dataclass(frozen=True)
class _TopicLayout:
    partitions: dict[int, _Address]  # partition -> its leader's address


class KafkaFront:
    """One loopback listener per broker of `kafka`, in front of it (see the module docstring).

    `bootstrap_servers` is what clients use; `kafka` is the cluster behind the front (create
    topics there directly, or inject faults). Use it as a context manager, or call `close()`.
    """

    def __init__(self, kafka: EmbeddedKafka, host: str = "127.0.0.1", port: int = 0) -> None:
        """`port`: where the first broker's listener binds, the others on the next ports
        (0: free ones)."""
        self.kafka = kafka
        self._brokers = _parse_addresses(kafka.bootstrap_servers)
        self._configs: dict[str, dict[str, str]] = {}
        self._compactions: dict[tuple[str, int], Compaction] = {}
        self._log_starts: dict[tuple[str, int], int] = {}
        self._partitions = PartitionMap()
        self._controller = asyncio.Lock()
        """Held while a request changes the topics (creates, grows or deletes one): Kafka's
        controller applies such requests one at a time, each to the topics the previous left."""
        self._fence = ProducerFence()
        self._transactions = TransactionLog()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kafka-front", daemon=True
        )
        self._thread.start()
        self._servers: list[asyncio.Server] = []
        self._to_front: dict[_Address, _Address] = {}
        try:
            for number, broker in enumerate(self._brokers):
                server = self._run(self._listen(host, port + number if port else 0, broker))
                bound = server.sockets[0].getsockname()[1]
                self._servers.append(server)
                self._to_front[broker] = _Address(host, bound)
        except BaseException:
            self.close()
            raise
        self.bootstrap_servers = ",".join(
            f"{front.host}:{front.port}" for front in self._to_front.values()
        )

    def _run(self, coroutine: Awaitable[T], timeout: float = 30.0) -> T:
        future: ThreadFuture[T] = asyncio.run_coroutine_threadsafe(
            _as_coroutine(coroutine), self._loop
        )
        return future.result(timeout)

    async def _listen(self, host: str, port: int, broker: _Address) -> asyncio.Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._serve_connection(broker, reader, writer)

        return await asyncio.start_server(serve, host, port)

    # ---- compaction -------------------------------------------------------------------------

    def compact(
        self,
        topic: str,
        partition: int | None = None,
        through_offset: int | None = None,
        remove_tombstones: bool = False,
    ) -> None:
        """From now on, Fetch responses of `topic` (one `partition`, or all) read as Kafka's log
        cleaner leaves the log after cleaning [log start, `through_offset`) (None: up to the high
        watermark). Repeated calls compact more; offsets never change."""
        self._run(self._compact(topic, partition, through_offset, remove_tombstones))

    async def _compact(
        self, topic: str, partition: int | None, through_offset: int | None, remove_tombstones: bool
    ) -> None:
        layouts = await self._topic_layouts()
        layout = layouts.get(topic)
        if layout is None:
            raise KafkaFrontError(f"cannot compact topic {topic!r}: it does not exist")
        if partition is not None and partition not in layout.partitions:
            raise KafkaFrontError(
                f"cannot compact partition {partition} of topic {topic!r}: it has partitions "
                f"0..{len(layout.partitions) - 1}"
            )
        partitions = sorted(layout.partitions) if partition is None else [partition]
        for index in partitions:
            batches, high_watermark = await self._read_log(topic, index, layout.partitions[index])
            key = (topic, index)
            self._compactions[key] = plan_compaction(
                batches,
                high_watermark if through_offset is None else through_offset,
                remove_tombstones,
                self._compactions.get(key),
                self._transactions.aborted(topic, index),
            )

    async def _read_log(
        self, topic: str, partition: int, broker: _Address
    ) -> tuple[list[RecordBatch], int]:
        """Every record batch of a partition, from offset 0 to the high watermark, and that."""
        topic, partition = self._partitions.to_mock(topic, partition)
        batches: list[RecordBatch] = []
        offset, high_watermark = 0, 1
        while offset < high_watermark:
            request = (
                Writer()
                .int32(-1)
                .int32(0)
                .int32(1)
                .int32(64 * 1024 * 1024)
                .int8(0)
                .int32(1)
                .nullable_string(topic)
                .int32(1)
                .int32(partition)
                .int64(offset)
                .int32(64 * 1024 * 1024)
                .bytes()
            )
            reader = Reader(await _call(broker, FETCH, 4, request))
            reader.int32()
            reader.array_length()
            reader.string()
            reader.array_length()
            reader.int32()
            error_code = reader.int16()
            if error_code != _NONE:
                raise KafkaFrontError(
                    f"cannot read partition {partition} of topic {topic!r} to compact it: "
                    f"Kafka error {error_code}"
                )
            high_watermark = reader.int64()
            reader.int64()
            for _ in range(max(reader.array_length(), 0)):
                reader.int64()
                reader.int64()
            fetched, _partial = read_batches(reader.nullable_bytes() or b"")
            if not fetched:
                break
            batches.extend(fetched)
            offset = fetched[-1].last_offset + 1
        return batches, high_watermark

    # ---- topics -----------------------------------------------------------------------------

    async def _topic_layouts(self) -> dict[str, _TopicLayout]:
        """Every topic of the cluster and its partitions' leaders (Metadata v4, all topics),
        from the first broker that answers (a test may have taken some down)."""
        request = Writer().int32(-1).boolean(False).bytes()
        reader = Reader(await self._call_any_broker(METADATA, 4, request))
        reader.int32()
        brokers = {}
        for _ in range(reader.array_length()):
            node_id = reader.int32()
            brokers[node_id] = _Address(reader.string(), reader.int32())
            reader.nullable_string()
        reader.nullable_string()
        reader.int32()
        layouts = {}
        for _ in range(reader.array_length()):
            error_code = reader.int16()
            name = reader.string()
            reader.boolean()
            partitions = {}
            for _ in range(reader.array_length()):
                reader.int16()
                index = reader.int32()
                leader = reader.int32()
                if leader in brokers:
                    partitions[index] = brokers[leader]
                for _ in range(2):
                    for _ in range(reader.array_length()):
                        reader.int32()
            if error_code == _NONE:
                layouts[name] = _TopicLayout(partitions)
        return self._grown_layouts(layouts)

    def _grown_layouts(self, layouts: dict[str, _TopicLayout]) -> dict[str, _TopicLayout]:
        """The mock's topic layouts as clients see them: a grown topic with the partitions of
        its extensions, and no extension as a topic of its own."""
        if not self._partitions:
            return layouts
        seen = {}
        for name, layout in layouts.items():
            if self._partitions.is_extension(name):
                continue
            partitions = dict(layout.partitions)
            for extension in self._partitions.extensions(name):
                grown = layouts.get(extension.name)
                for index, leader in (grown.partitions if grown else {}).items():
                    partitions[extension.first + index] = leader
            seen[name] = _TopicLayout(partitions)
        return seen

    async def _call_any_broker(self, api_key: int, version: int, body: bytes) -> bytes:
        failures = []
        for broker in self._brokers:
            try:
                return await _call(broker, api_key, version, body)
            except OSError as error:
                failures.append(f"{broker.host}:{broker.port}: {error}")
        raise KafkaFrontError(f"no broker answers: {'; '.join(failures)}")

    async def _create_topics(self, version: int, body: Reader) -> bytes:
        requests = []
        for _ in range(body.array_length()):
            name = body.string()
            partitions = body.int32()
            replication_factor = body.int16()
            assignments = body.array_length()
            for _ in range(max(assignments, 0)):
                body.int32()
                for _ in range(body.array_length()):
                    body.int32()
            configs: dict[str, str | None] = {}
            for _ in range(max(body.array_length(), 0)):
                config_name = body.string()
                configs[config_name] = body.nullable_string()
            requests.append((name, partitions, replication_factor, assignments > 0, configs))
        body.int32()
        validate_only = body.boolean() if version >= 1 else False
        existing = set(await self._topic_layouts())
        names = [request[0] for request in requests]
        answer = Writer()
        if version >= 2:
            answer.int32(0)
        answer.int32(len(requests))
        for name, partitions, replication_factor, assigned, configs in requests:
            error_code, message = self._check_new_topic(
                name=name,
                partitions=partitions,
                replication_factor=replication_factor,
                assigned=assigned,
                configs=configs,
                existing=existing,
                names=names,
            )
            if error_code == _NONE and not validate_only:
                error_code, message = self._create_topic(
                    name, partitions, replication_factor, configs
                )
            answer.nullable_string(name).int16(error_code)
            if version >= 1:
                answer.nullable_string(message)
        return answer.bytes()

    def _check_new_topic(
        self,
        *,
        name: str,
        partitions: int,
        replication_factor: int,
        assigned: bool,
        configs: Mapping[str, str | None],
        existing: set[str],
        names: list[str],
    ) -> tuple[int, str | None]:
        if not _LEGAL_TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            return _INVALID_TOPIC_EXCEPTION, (
                f"topic name {name!r} is illegal: use 1 to 249 of the characters "
                "[a-zA-Z0-9._-], and not '.' or '..'"
            )
        if names.count(name) > 1:
            return _INVALID_REQUEST, f"topic {name!r} appears more than once in the request"
        if name in existing:
            return _TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists."
        if assigned:
            return _INVALID_REQUEST, "this dev cluster does not take manual replica assignments"
        if partitions != -1 and partitions < 1:
            return _INVALID_PARTITIONS, "Number of partitions must be larger than 0."
        brokers = len(self._brokers)
        if replication_factor != -1 and not 1 <= replication_factor <= brokers:
            return _INVALID_REPLICATION_FACTOR, (
                f"Replication factor: {replication_factor} larger than available brokers: "
                f"{brokers}."
                if replication_factor > brokers
                else "Replication factor must be larger than 0."
            )
        for config, value in configs.items():
            problem = _config_problem(config, value)
            if problem is not None:
                return _INVALID_CONFIG, problem
        return _NONE, None

    def _create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str | None],
    ) -> tuple[int, str | None]:
        try:
            self.kafka.create_topic(
                name,
                _DEFAULT_PARTITIONS if partitions == -1 else partitions,
                _DEFAULT_REPLICATION_FACTOR if replication_factor == -1 else replication_factor,
            )
        except EmbeddedKafkaError as error:
            return _INVALID_REQUEST, str(error)
        self._configs[name] = {k: v for k, v in configs.items() if v is not None}
        return _NONE, None

    async def _create_partitions(self, _version: int, body: Reader) -> bytes:
        """CreatePartitions v0-v1: a topic grows to the count asked; its new partitions are an
        extension topic of the mock (see partitions.py), empty, starting at offset 0."""
        requests = []
        for _ in range(body.array_length()):
            name = body.string()
            count = body.int32()
            assignments = body.array_length()
            for _ in range(max(assignments, 0)):
                for _ in range(body.array_length()):
                    body.int32()
            requests.append((name, count, assignments > 0))
        body.int32()  # timeout_ms: growth is immediate here
        validate_only = body.boolean()
        layouts = await self._topic_layouts()
        names = [request[0] for request in requests]
        answer = Writer().int32(0).int32(len(requests))
        for name, count, assigned in requests:
            layout = layouts.get(name)
            message: str | None = None
            if layout is None:
                error_code, message = _UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist."
            elif names.count(name) > 1:
                error_code = _INVALID_REQUEST
                message = f"topic {name!r} appears more than once in the request"
            elif assigned:
                error_code = _INVALID_REQUEST
                message = "this dev cluster does not take manual replica assignments"
            elif count <= len(layout.partitions):
                error_code = _INVALID_PARTITIONS  # in the words of Kafka's controller
                message = (
                    f"The topic {name} currently has {len(layout.partitions)} partition(s); "
                    f"{count} would not be an increase."
                    if count < len(layout.partitions)
                    else f"Topic already has {count} partition(s)."
                )
            else:
                error_code = _NONE
                if not validate_only:
                    error_code, message = self._grow(name, len(layout.partitions), count)
            answer.nullable_string(name).int16(error_code).nullable_string(message)
        return answer.bytes()

    def _grow(self, topic: str, partitions: int, count: int) -> tuple[int, str | None]:
        extension = self._partitions.grow(topic, partitions, count)
        try:
            self.kafka.create_topic(extension.name, extension.count)
        except EmbeddedKafkaError as error:
            self._partitions.forget_extension(extension)
            return _INVALID_REQUEST, str(error)
        return _NONE, None

    async def _incremental_alter_configs(self, _version: int, body: Reader) -> bytes:
        """IncrementalAlterConfigs v0 for topics: SET, DELETE (back to the default), APPEND and
        SUBTRACT (list configs such as cleanup.policy); each resource all or nothing."""
        resources = []
        for _ in range(body.array_length()):
            resource_type = body.int8()
            name = body.string()
            operations = []
            for _ in range(max(body.array_length(), 0)):
                config = body.string()
                operations.append((config, body.int8(), body.nullable_string()))
            resources.append((resource_type, name, operations))
        validate_only = body.boolean()
        existing = await self._topic_layouts()
        answer = Writer().int32(0).int32(len(resources))
        for resource_type, name, operations in resources:
            message: str | None
            if resource_type != _TOPIC_RESOURCE:
                error_code, message = _INVALID_REQUEST, _TOPICS_ONLY
            elif name not in existing:
                error_code, message = _UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist."
            else:
                error_code, message = self._alter_topic_configs(name, operations, validate_only)
            answer.int16(error_code).nullable_string(message)
            answer.int8(resource_type).nullable_string(name)
        return answer.bytes()

    def _alter_topic_configs(
        self, topic: str, operations: list[tuple[str, int, str | None]], validate_only: bool
    ) -> tuple[int, str | None]:
        configs = dict(self._configs.get(topic, {}))
        for config, operation, value in operations:
            if operation == _DELETE:
                configs.pop(config, None)
                continue
            if operation not in (_SET, _APPEND, _SUBTRACT) or value is None:
                return _INVALID_REQUEST, f"config {config}: operation {operation} needs a value"
            if operation == _SET:
                configs[config] = value
            else:
                items = configs.get(config, TOPIC_CONFIG_DEFAULTS.get(config, "")).split(",")
                items = [item for item in items if item and item != value]
                if operation == _APPEND:
                    items.append(value)
                configs[config] = ",".join(items)
            problem = _config_problem(config, configs[config])
            if problem is not None:
                return _INVALID_CONFIG, problem
        if not validate_only:
            self._configs[topic] = configs
        return _NONE, None

    async def _describe_configs(self, version: int, body: Reader) -> bytes:
        resources = []
        for _ in range(body.array_length()):
            resource_type = body.int8()
            name = body.string()
            count = body.array_length()
            keys = None if count < 0 else {body.string() for _ in range(count)}
            resources.append((resource_type, name, keys))
        existing = await self._topic_layouts()
        answer = Writer().int32(0).int32(len(resources))
        for resource_type, name, keys in resources:
            if resource_type != _TOPIC_RESOURCE:
                answer.int16(_INVALID_REQUEST).nullable_string(_TOPICS_ONLY)
                answer.int8(resource_type).nullable_string(name).int32(0)
                continue
            if name not in existing:
                answer.int16(_UNKNOWN_TOPIC_OR_PARTITION).nullable_string(
                    f"Topic '{name}' does not exist."
                )
                answer.int8(resource_type).nullable_string(name).int32(0)
                continue
            given = self._configs.get(name, {})
            entries = [
                (config, given.get(config, default), config in given)
                for config, default in sorted(TOPIC_CONFIG_DEFAULTS.items())
                if keys is None or config in keys
            ]
            answer.int16(_NONE).nullable_string(None).int8(resource_type).nullable_string(name)
            answer.int32(len(entries))
            for config, value, is_set in entries:
                answer.nullable_string(config).nullable_string(value).boolean(False)
                if version == 0:
                    answer.boolean(not is_set)
                else:
                    answer.int8(_DYNAMIC_TOPIC_CONFIG if is_set else _DEFAULT_CONFIG)
                answer.boolean(False)
                if version >= 1:
                    answer.int32(0)
        return answer.bytes()

    async def _delete_topics(self, version: int, body: Reader) -> bytes:
        """DeleteTopics v0-v3: each named topic goes, with its records and everything the front
        kept about it (configs, log starts, compactions)."""
        names = [body.string() for _ in range(body.array_length())]
        body.int32()  # timeout_ms: deletion is immediate here
        existing = set(await self._topic_layouts())
        answer = Writer()
        if version >= 1:
            answer.int32(0)
        answer.int32(len(names))
        for name in names:
            error_code = _UNKNOWN_TOPIC_OR_PARTITION
            if name in existing:
                try:
                    self.kafka.delete_topic(name)
                    for extension in self._partitions.forget(name):
                        self.kafka.delete_topic(extension.name)
                except EmbeddedKafkaError:
                    error_code = _INVALID_REQUEST
                else:
                    error_code = _NONE
                    self._forget_topic(name)
            answer.nullable_string(name).int16(error_code)
        return answer.bytes()

    def _forget_topic(self, name: str) -> None:
        self._configs.pop(name, None)
        for key in [key for key in self._log_starts if key[0] == name]:
            del self._log_starts[key]
        for key in [key for key in self._compactions if key[0] == name]:
            del self._compactions[key]
        self._transactions.forget_topic(name)

    # ---- retention --------------------------------------------------------------------------

    async def _delete_records(self, _version: int, body: Reader) -> bytes:
        """DeleteRecords v0-v1: each partition's log start moves up to the given offset (-1: the
        high watermark), as retention moves it. The broker behind keeps the records; the front
        hides them (ListOffsets, Fetch)."""
        requests = []
        for _ in range(body.array_length()):
            topic = body.string()
            offsets = [(body.int32(), body.int64()) for _ in range(body.array_length())]
            requests.append((topic, offsets))
        layouts = await self._topic_layouts()
        answer = Writer().int32(0).int32(len(requests))
        for topic, offsets in requests:
            answer.nullable_string(topic).int32(len(offsets))
            layout = layouts.get(topic)
            for partition, requested in offsets:
                broker = None if layout is None else layout.partitions.get(partition)
                if broker is None:
                    answer.int32(partition).int64(-1).int16(_UNKNOWN_TOPIC_OR_PARTITION)
                    continue
                high_watermark = await _high_watermark(
                    broker, *self._partitions.to_mock(topic, partition)
                )
                before = high_watermark if requested == _LATEST else requested
                if not 0 <= before <= high_watermark:
                    answer.int32(partition).int64(-1).int16(_OFFSET_OUT_OF_RANGE)
                    continue
                key = (topic, partition)
                self._log_starts[key] = max(self._log_starts.get(key, 0), before)
                answer.int32(partition).int64(self._log_starts[key]).int16(_NONE)
        return answer.bytes()

    # ---- the proxy --------------------------------------------------------------------------

    async def _serve_connection(
        self,
        broker: _Address,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
    ) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection(broker.host, broker.port)
        except OSError:
            client_writer.close()
            return
        answers: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()
        awaited: dict[int, _Forwarded] = {}
        tasks = [
            asyncio.create_task(
                self._pump_requests(client_reader, broker_writer, answers, awaited)
            ),
            asyncio.create_task(self._pump_responses(broker_reader, awaited)),
            asyncio.create_task(_write_answers(answers, client_writer)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is not None and not isinstance(error, _CONNECTION_CLOSED):
                    _log.error("closing a client connection after: %r", error)
        finally:
            for task in tasks:
                task.cancel()
            for forwarded in awaited.values():
                forwarded.answer.cancel()
            for writer in (client_writer, broker_writer):
                writer.close()

    async def _pump_requests(
        self,
        client: asyncio.StreamReader,
        broker: asyncio.StreamWriter,
        answers: "asyncio.Queue[asyncio.Future[bytes]]",
        awaited: dict[int, _Forwarded],
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            request = await _read_frame(client)
            header = read_request_header(request)
            answer: asyncio.Future[bytes] = loop.create_future()
            handler = self._handler(header.api_key)
            if handler is not None:
                answers.put_nowait(answer)
                body = Reader(request, header.body_offset)
                _settle(answer, header.correlation_id, handler(header.api_version, body))
                continue
            answered = not (header.api_key == PRODUCE and _acks(request, header) == 0)
            if header.api_key in _FENCEABLE:
                refusal = self._fence.refusal(header, request)
                if refusal is not None:
                    if answered:
                        reply = Writer().int32(header.correlation_id).raw(refusal).bytes()
                        answer.set_result(frame(reply))
                        answers.put_nowait(answer)
                    continue
            if header.api_key == METADATA and header.api_version >= 4:
                request = _without_auto_creation(request, header.body_offset)
            if answered:
                awaited[header.correlation_id] = self._forwarded_request(answer, header, request)
                answers.put_nowait(answer)
            if self._partitions and header.api_key in MAPPED_APIS:
                mapped = self._partitions.request(
                    header.api_key, header.api_version, request[header.body_offset :]
                )
                request = request[: header.body_offset] + mapped
            broker.write(frame(request))
            await broker.drain()

    def _forwarded_request(
        self, answer: "asyncio.Future[bytes]", header: RequestHeader, request: bytes
    ) -> _Forwarded:
        """What the rewrite of `request`'s response will need to know of the request."""
        api_key = header.api_key
        return _Forwarded(
            answer,
            api_key,
            header.api_version,
            fetch_offsets=(
                _fetch_offsets(request, header) if api_key == FETCH and self._log_starts else {}
            ),
            transactional_id=(
                self._fence.transactional_id(header, request)
                if api_key == INIT_PRODUCER_ID
                else None
            ),
            read_committed=api_key == FETCH and _reads_committed(request, header),
            transactional_write=(
                transactional_write(header, request) if api_key == PRODUCE else None
            ),
            transaction_end=transaction_end(header, request) if api_key == END_TXN else None,
        )

    def _handler(self, api_key: int) -> Callable[[int, Reader], Awaitable[bytes]] | None:
        if api_key == CREATE_TOPICS:
            return self._one_at_a_time(self._create_topics)
        if api_key == CREATE_PARTITIONS:
            return self._one_at_a_time(self._create_partitions)
        if api_key == DELETE_TOPICS:
            return self._one_at_a_time(self._delete_topics)
        if api_key == DELETE_RECORDS:
            return self._delete_records
        if api_key == DESCRIBE_CONFIGS:
            return self._describe_configs
        if api_key == INCREMENTAL_ALTER_CONFIGS:
            return self._incremental_alter_configs
        return None

    def _one_at_a_time(
        self, handler: Callable[[int, Reader], Awaitable[bytes]]
    ) -> Callable[[int, Reader], Awaitable[bytes]]:
        """`handler` holding the controller lock: two growths of a topic read its partition count
        one after the other, so their extensions never claim the same partitions."""

        async def handle(version: int, body: Reader) -> bytes:
            async with self._controller:
                return await handler(version, body)

        return handle

    async def _pump_responses(
        self,
        broker: asyncio.StreamReader,
        awaited: dict[int, _Forwarded],
    ) -> None:
        while True:
            response = await _read_frame(broker)
            forwarded = awaited.pop(Reader(response).int32())
            forwarded.answer.set_result(frame(self._rewrite_response(forwarded, response)))

    def _rewrite_response(self, request: _Forwarded, response: bytes) -> bytes:
        version = request.version
        if self._partitions and request.api_key in MAPPED_APIS:
            # Into the clients' view first: the rewrites below all work in it.
            mapped = self._partitions.response(request.api_key, version, response[4:])
            response = response[:4] + mapped
        if request.api_key == API_VERSIONS:
            return _rewrite_api_versions(version, response)
        if request.api_key == METADATA:
            return self._rewrite_metadata(version, response)
        if request.api_key == FIND_COORDINATOR:
            return self._rewrite_find_coordinator(version, response)
        if request.api_key == LIST_OFFSETS and self._log_starts:
            return self._rewrite_list_offsets(version, response)
        if request.api_key == FETCH and (
            self._compactions
            or self._log_starts
            or (request.read_committed and self._transactions.has_aborted())
        ):
            return self._rewrite_fetch(version, response, request)
        if request.api_key == INIT_PRODUCER_ID and request.transactional_id is not None:
            fenced = self._fence.initialised(request.transactional_id, version, response)
            if fenced is not None:
                self._transactions.ended(fenced, committed=False)
        write = request.transactional_write
        if write is not None:
            self._transactions.written(
                write,
                produce_base_offsets(version, response),
                fenced=self._fence.is_fenced(write.transactional_id, write.producer),
            )
        end = request.transaction_end
        if end is not None and transaction_end_accepted(response):
            self._transactions.ended(end.producer, end.committed)
        return response

    def _front_of(self, host: str, port: int) -> _Address:
        return self._to_front.get(_Address(host, port), _Address(host, port))

    def _rewrite_metadata(self, version: int, response: bytes) -> bytes:
        reader = Reader(response, 4)
        answer = Writer().raw(response[:4])
        if version >= 3:
            answer.int32(reader.int32())
        count = reader.array_length()
        answer.int32(count)
        node_ids = []
        for _ in range(count):
            node_id = reader.int32()
            node_ids.append(node_id)
            front = self._front_of(reader.string(), reader.int32())
            answer.int32(node_id).nullable_string(front.host).int32(front.port)
            if version >= 1:
                answer.nullable_string(reader.nullable_string())
        if version >= 2:
            answer.nullable_string(reader.nullable_string())
        if version >= 1:
            # The mock names controller 0, which is no broker: admin clients would wait forever
            # for it. The front answers the controller's requests on every listener.
            controller_id = reader.int32()
            if controller_id not in node_ids and node_ids:
                controller_id = min(node_ids)
            answer.int32(controller_id)
        return answer.raw(reader.rest()).bytes()

    def _rewrite_find_coordinator(self, version: int, response: bytes) -> bytes:
        reader = Reader(response, 4)
        answer = Writer().raw(response[:4])
        if version >= 1:
            answer.int32(reader.int32())
        answer.int16(reader.int16())
        if version >= 1:
            answer.nullable_string(reader.nullable_string())
        answer.int32(reader.int32())
        front = self._front_of(reader.string(), reader.int32())
        return answer.nullable_string(front.host).int32(front.port).raw(reader.rest()).bytes()

    def _rewrite_list_offsets(self, version: int, response: bytes) -> bytes:
        """A ListOffsets answer (v1-v5) that never names an offset below a log start."""
        if version < 1:
            return response
        reader = Reader(response, 4)
        answer = Writer().raw(response[:4])
        if version >= 2:
            answer.int32(reader.int32())
        topics = reader.array_length()
        answer.int32(topics)
        for _ in range(topics):
            topic = reader.string()
            partitions = reader.array_length()
            answer.nullable_string(topic).int32(partitions)
            for _ in range(partitions):
                partition, error_code = reader.int32(), reader.int16()
                timestamp, offset = reader.int64(), reader.int64()
                log_start = self._log_starts.get((topic, partition))
                if error_code == _NONE and log_start is not None and offset >= 0:
                    offset = max(offset, log_start)
                answer.int32(partition).int16(error_code).int64(timestamp).int64(offset)
                if version >= 4:
                    answer.int32(reader.int32())
        return answer.raw(reader.rest()).bytes()

    def _rewrite_fetch(self, version: int, response: bytes, request: _Forwarded) -> bytes:
        """A Fetch answer (v0-v11) as Kafka would give it after `compact`, DeleteRecords and
        aborted transactions: a compacted partition's records as the cleaner leaves them; a read
        below a partition's log start OFFSET_OUT_OF_RANGE without records; the log start offset
        never below it; for a read_committed request, no batch of an aborted transaction."""
        reader = Reader(response, 4)
        answer = Writer().raw(response[:4])
        if version >= 1:
            answer.int32(reader.int32())
        if version >= 7:
            answer.int16(reader.int16()).int32(reader.int32())
        topics = reader.array_length()
        answer.int32(topics)
        for _ in range(topics):
            topic = reader.string()
            partitions = reader.array_length()
            answer.nullable_string(topic).int32(partitions)
            for _ in range(partitions):
                partition, error_code, high_watermark = (
                    reader.int32(),
                    reader.int16(),
                    reader.int64(),
                )
                last_stable = reader.int64() if version >= 4 else -1
                log_start = reader.int64() if version >= 5 else -1
                aborted = reader.array_length() if version >= 4 else 0
                aborted_transactions = reader.raw(16 * aborted) if aborted > 0 else b""
                preferred_read_replica = reader.int32() if version >= 11 else -1
                records = reader.nullable_bytes()
                key = (topic, partition)
                deleted_before = self._log_starts.get(key)
                if deleted_before is not None:
                    log_start = max(log_start, deleted_before)
                    offset = request.fetch_offsets.get(key)
                    if error_code == _NONE and offset is not None and offset < deleted_before:
                        error_code, aborted, aborted_transactions = _OFFSET_OUT_OF_RANGE, 0, b""
                        records = b""
                aborted_offsets = self._transactions.aborted(topic, partition)
                if request.read_committed and aborted_offsets and records:
                    records = without_aborted(records, aborted_offsets)
                compaction = self._compactions.get(key)
                if compaction is not None and records:
                    records = rewrite_records(records, compaction)
                answer.int32(partition).int16(error_code).int64(high_watermark)
                if version >= 4:
                    answer.int64(last_stable)
                if version >= 5:
                    answer.int64(log_start)
                if version >= 4:
                    answer.int32(aborted).raw(aborted_transactions)
                if version >= 11:
                    answer.int32(preferred_read_replica)
                answer.nullable_bytes(records)
        return answer.raw(reader.rest()).bytes()

    def close(self) -> None:
        """Stop listening, drop every connection and stop the loop; calling it again does
        nothing. The EmbeddedKafka behind the front stays up."""
        if not self._loop.is_running():
            return

        async def stop() -> None:
            for server in self._servers:
                server.close()
            current = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not current:
                    task.cancel()

        self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KafkaFront({self.bootstrap_servers} -> {self.kafka.bootstrap_servers})"


def _config_problem(config: str, value: str | None) -> str | None:
    """Why Kafka would refuse topic config `config`=`value`, or None."""
    if config not in TOPIC_CONFIG_DEFAULTS:
        return f"Unknown topic config name: {config}"
    if value is None:
        return f"Null value not supported for topic config {config}"
    if config == "cleanup.policy" and not set(value.split(",")) <= {"compact", "delete"}:
        return (
            f"Invalid value {value} for configuration cleanup.policy: use compact, delete or "
            "compact,delete"
        )
    return None


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _settle(answer: "asyncio.Future[bytes]", correlation_id: int, body: Awaitable[bytes]) -> None:
    """Resolve `answer` with the response of a request the front answers itself."""

    async def respond() -> None:
        try:
            answer.set_result(frame(Writer().int32(correlation_id).raw(await body).bytes()))
        except Exception as error:  # a broken request closes the client connection, as Kafka does
            answer.set_exception(error)

    task = asyncio.get_running_loop().create_task(respond())
    # The loop keeps only a weak reference to a task: one collected while it waits would never
    # answer, and every later response on the client's connection would wait behind it.
    _RESPONDING.add(task)
    task.add_done_callback(_RESPONDING.discard)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = Reader(await reader.readexactly(4)).int32()
    return await reader.readexactly(size)


async def _write_answers(
    answers: "asyncio.Queue[asyncio.Future[bytes]]", client: asyncio.StreamWriter
) -> None:
    """Write responses in request order, as a Kafka broker does."""
    while True:
        answer = await answers.get()
        client.write(await answer)
        await client.drain()


async def _call(broker: _Address, api_key: int, version: int, body: bytes) -> bytes:
    """One read-only request (Metadata, ListOffsets, Fetch) to a mock broker on a connection of
    its own; the response body. A broker that does not answer within _CALL_SECONDS is asked
    again on a new connection, up to _CALL_ATTEMPTS times in all: the request that waits for
    this answer holds back every later response to its client."""
    for attempt in range(1, _CALL_ATTEMPTS + 1):
        try:
            return await asyncio.wait_for(_call_once(broker, api_key, version, body), _CALL_SECONDS)
        except TimeoutError:
            _log.warning(
                "mock broker %s:%d did not answer request %d in %s s (attempt %d of %d)",
                broker.host,
                broker.port,
                api_key,
                _CALL_SECONDS,
                attempt,
                _CALL_ATTEMPTS,
            )
    raise KafkaFrontError(
        f"mock broker {broker.host}:{broker.port} did not answer request {api_key} "
        f"{_CALL_ATTEMPTS} times"
    )


async def _call_once(broker: _Address, api_key: int, version: int, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(broker.host, broker.port)
    try:
        header = Writer().int16(api_key).int16(version).int32(1).nullable_string("kafka-front")
        writer.write(frame(header.raw(body).bytes()))
        await writer.drain()
        return (await _read_frame(reader))[4:]
    finally:
        writer.close()


async def _high_watermark(broker: _Address, topic: str, partition: int) -> int:
    """A partition's high watermark, from its leader (ListOffsets v1)."""
    request = Writer().int32(-1).int32(1).nullable_string(topic)
    request.int32(1).int32(partition).int64(_LATEST)
    reader = Reader(await _call(broker, LIST_OFFSETS, 1, request.bytes()))
    reader.array_length()
    reader.string()
    reader.array_length()
    reader.int32()
    error_code = reader.int16()
    if error_code != _NONE:
        raise KafkaFrontError(
            f"cannot read the end of {topic}[{partition}]: Kafka error {error_code}"
        )
    reader.int64()
    return reader.int64()


def _fetch_offsets(request: bytes, header: RequestHeader) -> dict[tuple[str, int], int]:
    """Per partition, the offset a Fetch request (v0-v11) reads from."""
    version = header.api_version
    reader = Reader(request, header.body_offset)
    reader.raw(12)  # replica id, max wait, min bytes
    if version >= 3:
        reader.int32()  # max bytes
    if version >= 4:
        reader.int8()  # isolation level
    if version >= 7:
        reader.raw(8)  # fetch session id and epoch
    offsets = {}
    for _ in range(reader.array_length()):
        topic = reader.string()
        for _ in range(reader.array_length()):
            partition = reader.int32()
            if version >= 9:
                reader.int32()  # current leader epoch
            offsets[(topic, partition)] = reader.int64()
            if version >= 5:
                reader.int64()  # the follower's log start
            reader.int32()  # partition max bytes
    return offsets


def _reads_committed(request: bytes, header: RequestHeader) -> bool:
    """Whether a Fetch request (v4-v11) reads committed records only."""
    if header.api_version < 4:
        return False
    # After replica id, max wait, min bytes and max bytes: the isolation level.
    return Reader(request, header.body_offset + 16).int8() == _READ_COMMITTED


def _without_auto_creation(request: bytes, body_offset: int) -> bytes:
    """A Metadata request (v4-v8) with allow_auto_topic_creation false."""
    reader = Reader(request, body_offset)
    for _ in range(max(reader.array_length(), 0)):
        reader.string()
    flag = reader.position
    return request[:flag] + b"\x00" + request[flag + 1 :]


def _acks(request: bytes, header: RequestHeader) -> int:
    """The acks of a Produce request: with 0 the broker sends no response."""
    reader = Reader(request, header.body_offset)
    if header.api_version >= 3:
        reader.nullable_string()
    return reader.int16()


def _rewrite_api_versions(version: int, response: bytes) -> bytes:
    """The broker's ApiVersions answer with the front's caps, own APIs and hidden APIs."""
    reader = Reader(response, 4)
    error_code = reader.int16()
    if error_code != _NONE:
        return response
    flexible = version >= 3
    count = reader.unsigned_varint() - 1 if flexible else reader.array_length()
    versions: dict[int, tuple[int, int]] = {}
    for _ in range(count):
        api_key, lowest, highest = reader.int16(), reader.int16(), reader.int16()
        if flexible:
            reader.skip_tagged_fields()
        versions[api_key] = (lowest, highest)
    for api_key, cap in _VERSION_CAPS.items():
        if api_key in versions:
            lowest, highest = versions[api_key]
            versions[api_key] = (lowest, min(highest, cap))
    for api_key in _HIDDEN:
        versions.pop(api_key, None)
    versions.update(_ANSWERED_HERE)
    answer = Writer().raw(response[:4]).int16(error_code)
    if flexible:
        answer.unsigned_varint(len(versions) + 1)
    else:
        answer.int32(len(versions))
    for api_key, (lowest, highest) in sorted(versions.items()):
        answer.int16(api_key).int16(lowest).int16(highest)
        if flexible:
            answer.unsigned_varint(0)
    return answer.raw(reader.rest()).bytes()
