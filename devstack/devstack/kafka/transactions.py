"""Aborted transactions for the Kafka front: the records Kafka never shows read_committed readers.

A Kafka cluster aborts a transaction when its producer aborts it (EndTxn with commit=false) or
when the transaction coordinator fences the producer (a newer InitProducerId for its
transactional.id), and read_committed readers never get the aborted records. librdkafka's mock
broker serves them to every reader: it writes an ABORT marker after a transaction its producer
aborts but lists no aborted transaction in its Fetch answers, and a producer fenced by the front
(fencing.py) leaves its open transaction's records in the log with no marker at all.

`TransactionLog` follows each transactional producer's open transaction through the front: the
record batches of its Produce requests (producer id and epoch from the v2 batch header, the
transactional flag set) at the base offsets the Produce responses give them. An accepted EndTxn
that commits closes the transaction; one that aborts, or the producer being fenced, aborts it,
and its batches' offset ranges are remembered per partition. `without_aborted` takes those
batches out of a read_committed Fetch answer; offsets never change, readers move past the gap.

Not modelled: the last stable offset (the mock's Fetch and ListOffsets answers go to the high
watermark for read_committed readers too, so a transaction's records are served while it is
still open, and a reader that read them before it was aborted keeps them), and the transaction
timeout (a transaction stays open until its producer ends it or is fenced).
"""

from bisect import bisect_right, insort
from collections.abc import Mapping
from dataclasses import dataclass

from devstack.kafka.compaction import Record, RecordBatch, read_batches
from devstack.kafka.fencing import Producer
from devstack.kafka.protocol import Reader, RequestHeader, Writer

TopicPartition = tuple[str, int]

_NONE = 0
_ABORT = 0  # the type of an ABORT marker, in its control record's key
_CONTROL_RECORD_VERSION = 0
_COORDINATOR_EPOCH = 0  # in an ABORT marker's value: no coordinator here


@dataclass(frozen=True)
class TransactionalWrite:
    """What one Produce request writes in a producer's transaction: per partition, how many
    offsets its record batches take (the broker gives them consecutive offsets)."""

    transactional_id: str
    producer: Producer
    offsets_taken: Mapping[TopicPartition, int]


@dataclass(frozen=True)
class TransactionEnd:
    """What an EndTxn request asks: the producer's transaction committed, or aborted."""

    producer: Producer
    committed: bool


class AbortedOffsets:
    """The offset ranges of one partition's aborted record batches (disjoint, sorted)."""

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._ends: dict[int, int] = {}  # first offset -> the offset after the range

    def add(self, offsets: range) -> None:
        insort(self._firsts, offsets.start)
        self._ends[offsets.start] = offsets.stop

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        index = bisect_right(self._firsts, offset) - 1
        return index >= 0 and offset < self._ends[self._firsts[index]]


class TransactionLog:
    """Per transactional producer, the batches of its open transaction; per partition, the
    offsets of the batches of aborted transactions."""

    def __init__(self) -> None:
        self._open: dict[Producer, list[tuple[TopicPartition, range]]] = {}
        self._aborted: dict[TopicPartition, AbortedOffsets] = {}

    def written(
        self, write: TransactionalWrite, base_offsets: Mapping[TopicPartition, int], fenced: bool
    ) -> None:
        """Note the batches of `write` at the `base_offsets` the broker gave them. A producer
        `fenced` meanwhile (its Produce reached the broker before the fence, the response came
        after) wrote them in a transaction that is aborted already."""
        batches = [
            (key, range(base, base + write.offsets_taken[key]))
            for key, base in base_offsets.items()
            if key in write.offsets_taken
        ]
        if fenced:
            self._abort(batches)
        else:
            self._open.setdefault(write.producer, []).extend(batches)

    def ended(self, producer: Producer, committed: bool) -> None:
        """`producer`'s open transaction ended: committed, or aborted (by the producer, or
        because it was fenced)."""
        batches = self._open.pop(producer, [])
        if not committed:
            self._abort(batches)

    def _abort(self, batches: list[tuple[TopicPartition, range]]) -> None:
        for key, offsets in batches:
            self._aborted.setdefault(key, AbortedOffsets()).add(offsets)

    def has_aborted(self) -> bool:
        """Whether any transaction was aborted (until then Fetch answers need no look)."""
        return bool(self._aborted)

    def aborted(self, topic: str, partition: int) -> AbortedOffsets:
        """The offsets of `topic`[`partition`] that aborted transactions wrote."""
        return self._aborted.get((topic, partition), AbortedOffsets())

    def forget_topic(self, topic: str) -> None:
        """Drop what is kept about `topic` (deleted: a new topic of that name starts at 0)."""
        for key in [key for key in self._aborted if key[0] == topic]:
            del self._aborted[key]
        self._open = {
            producer: [(key, offsets) for key, offsets in batches if key[0] != topic]
            for producer, batches in self._open.items()
        }


def transactional_write(header: RequestHeader, request: bytes) -> TransactionalWrite | None:
    """What a Produce request (v3-v8) writes in a transaction; None when it is no transaction's
    (no transactional.id, or no batch with the transactional flag)."""
    if header.api_version < 3:
        return None
    reader = Reader(request, header.body_offset)
    transactional_id = reader.nullable_string()
    if transactional_id is None:
        return None
    reader.int16()  # acks
    reader.int32()  # timeout
    producer = None
    offsets_taken: dict[TopicPartition, int] = {}
    for _ in range(reader.array_length()):
        topic = reader.string()
        for _ in range(reader.array_length()):
            partition = reader.int32()
            batches, _partial = read_batches(reader.nullable_bytes() or b"")
            for batch in batches:
                if batch.is_transactional:
                    producer = Producer(batch.producer_id, batch.producer_epoch)
                    key = (topic, partition)
                    offsets_taken[key] = offsets_taken.get(key, 0) + batch.last_offset_delta + 1
    if producer is None:
        return None
    return TransactionalWrite(transactional_id, producer, offsets_taken)


def produce_base_offsets(version: int, response: bytes) -> dict[TopicPartition, int]:
    """Per partition a Produce response (v3-v8, with its correlation id) accepted, the offset
    the broker gave the first record it wrote."""
    reader = Reader(response, 4)
    base_offsets = {}
    for _ in range(reader.array_length()):
        topic = reader.string()
        for _ in range(reader.array_length()):
            partition, error_code, base_offset = reader.int32(), reader.int16(), reader.int64()
            reader.int64()  # log append time
            if version >= 5:
                reader.int64()  # log start offset
            if version >= 8:
                for _ in range(max(reader.array_length(), 0)):
                    reader.int32()  # batch index
                    reader.nullable_string()  # its error message
                reader.nullable_string()  # error message
            if error_code == _NONE:
                base_offsets[(topic, partition)] = base_offset
    return base_offsets


def transaction_end(header: RequestHeader, request: bytes) -> TransactionEnd:
    """The transaction an EndTxn request (v0-v2) ends, and how."""
    reader = Reader(request, header.body_offset)
    reader.string()  # transactional.id
    producer = Producer(reader.int64(), reader.int16())
    return TransactionEnd(producer, reader.boolean())


def transaction_end_accepted(response: bytes) -> bool:
    """Whether an EndTxn response (v0-v2, with its correlation id) says the transaction ended."""
    reader = Reader(response, 4)
    reader.int32()  # throttle time
    return reader.int16() == _NONE


def without_aborted(records: bytes, aborted: AbortedOffsets) -> bytes:
    """The record batches of a Fetch answer without those aborted transactions wrote, as Kafka
    serves a read_committed reader.

    A reader's position (librdkafka's `position()`) moves past a record it is given or a
    control record, not past a batch it skips. On Kafka an ABORT marker follows every aborted
    transaction; the mock writes none for a fenced producer, and answers one batch at a time.
    So when an answer ends with an aborted batch, an ABORT marker takes its place, at its last
    offset: the reader moves past it, and gets none of its records.
    """
    batches, partial = read_batches(records)
    kept = [batch.encoded for batch in batches if batch.base_offset not in aborted]
    if len(kept) == len(batches):
        return records
    if batches[-1].base_offset in aborted:
        kept.append(_abort_marker(batches[-1]))
    return b"".join(kept) + partial


def _abort_marker(batch: RecordBatch) -> bytes:
    """`batch` made an ABORT control batch: its offsets, producer and timestamps kept, and one
    control record at its last offset."""
    key = Writer().int16(_CONTROL_RECORD_VERSION).int16(_ABORT).bytes()
    value = Writer().int16(_CONTROL_RECORD_VERSION).int32(_COORDINATOR_EPOCH).bytes()
    record = (
        Writer()
        .int8(0)  # attributes
        .varint(0)  # timestamp delta
        .varint(batch.last_offset_delta)
        .varint(len(key))
        .raw(key)
        .varint(len(value))
        .raw(value)
        .varint(0)  # headers
        .bytes()
    )
    encoded = Writer().varint(len(record)).raw(record).bytes()
    return batch.with_records([Record(batch.last_offset, key, False, encoded)], control=True)
