"""Kafka's log cleaner, simulated on record batches (magic v2) for the Kafka front.

No broker here compacts, yet a changelog on a real cluster is compacted, and readers of a
changelog must cope with the gaps that leaves. `plan_compaction` decides, from a partition's
whole log, which offsets the cleaner would remove; `rewrite_records` applies that decision to the
record batches of a Fetch response, the way the cleaner leaves them on disk: the kept records
byte for byte, each batch's base offset and last offset delta preserved (so a consumer's
position moves past removed records), record count and CRC32C recomputed, batches left empty
dropped unless Kafka keeps them (the last batch of an idempotent or transactional producer).

As Kafka's cleaner, it removes the records of aborted transactions (the batches the caller
names) and never lets them supersede an older record of their key. Not modelled: Kafka cleans
no further than the last stable offset; here a transaction still open when the log is cleaned
is cleaned as if committed. Compressed batches are left untouched.
"""

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

from devstack.kafka.protocol import ProtocolError, Reader, Writer, crc32c

_BATCH_HEADER_SIZE = 61
_CRC_START = 21  # the CRC covers the batch from its attributes to its end
_COMPRESSION_MASK = 0x07
_TRANSACTIONAL = 0x10
_CONTROL = 0x20


@dataclass(frozen=True)
class Record:
    offset: int
    key: bytes | None
    is_tombstone: bool
    encoded: bytes  # the record as stored: its length varint and everything after


@dataclass(frozen=True)
class RecordBatch:
    base_offset: int
    encoded: bytes
    attributes: int
    last_offset_delta: int
    producer_id: int
    producer_epoch: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def is_compressed(self) -> bool:
        return bool(self.attributes & _COMPRESSION_MASK)

    def records(self) -> list[Record]:
        """This batch's records (none for a compressed batch, which is not decoded)."""
        if self.is_compressed:
            return []
        reader = Reader(self.encoded, _BATCH_HEADER_SIZE - 4)
        count = reader.int32()
        records = []
        for _ in range(count):
            start = reader.position
            length = reader.varint()
            body = Reader(reader.raw(length))
            body.int8()
            body.varint()
            offset_delta = body.varint()
            key_length = body.varint()
            key = None if key_length < 0 else body.raw(key_length)
            value_length = body.varint()
            records.append(
                Record(
                    self.base_offset + offset_delta,
                    key,
                    value_length < 0,
                    self.encoded[start : reader.position],
                )
            )
        return records

    def with_records(self, records: Sequence[Record], control: bool = False) -> bytes:
        """This batch holding only `records`: same offsets and header, new count, length, CRC;
        made a control batch if `control`."""
        attributes = self.attributes | _CONTROL if control else self.attributes
        after_crc = bytearray(Writer().int16(attributes).bytes())
        after_crc += self.encoded[_CRC_START + 2 : _BATCH_HEADER_SIZE - 4]
        after_crc += Writer().int32(len(records)).bytes()
        for record in records:
            after_crc += record.encoded
        checksum = crc32c(bytes(after_crc))
        prefix = Reader(self.encoded)
        base_offset = prefix.int64()
        prefix.int32()
        leader_epoch = prefix.int32()
        magic = prefix.int8()
        return (
            Writer()
            .int64(base_offset)
            .int32(len(after_crc) + 9)
            .int32(leader_epoch)
            .int8(magic)
            .uint32(checksum)
            .raw(bytes(after_crc))
            .bytes()
        )


def read_batches(records: bytes) -> tuple[list[RecordBatch], bytes]:
    """The complete record batches in `records`, and the trailing bytes of a partial one.

    A broker may cut the last batch of a Fetch response short; the client skips it and fetches
    it again, so a partial batch is passed on untouched.
    """
    batches = []
    position = 0
    while len(records) - position >= _BATCH_HEADER_SIZE:
        reader = Reader(records, position)
        base_offset = reader.int64()
        length = reader.int32()
        end = position + 12 + length
        if end > len(records):
            break
        reader.int32()
        magic = reader.int8()
        if magic != 2:
            raise ProtocolError(f"record batch at offset {base_offset} has magic {magic}, not 2")
        reader.uint32()
        attributes = reader.int16()
        last_offset_delta = reader.int32()
        reader.int64()
        reader.int64()
        producer_id, producer_epoch = reader.int64(), reader.int16()
        batches.append(
            RecordBatch(
                base_offset,
                records[position:end],
                attributes,
                last_offset_delta,
                producer_id,
                producer_epoch,
            )
        )
        position = end
    return batches, records[position:]


@dataclass(frozen=True)
class Compaction:
    """What the cleaner removed from one partition: below `cleaned_through`, the offsets in
    `removed`; `kept_empty` are the base offsets of batches Kafka keeps even when emptied."""

    cleaned_through: int
    removed: frozenset[int]
    kept_empty: frozenset[int]


def plan_compaction(
    batches: Iterable[RecordBatch],
    through_offset: int,
    remove_tombstones: bool,
    previous: Compaction | None,
    aborted: Container[int],
) -> Compaction:
    """The cleaner's result on the prefix [log start, through_offset) of a log of `batches`.

    In the prefix only the newest record of each key is kept; a tombstone is kept too unless
    `remove_tombstones`; the records of the batches whose base offsets are `aborted` go. What
    an earlier compaction removed stays removed.
    """
    all_batches = list(batches)
    newest: dict[bytes, int] = {}
    records: list[Record] = []
    removed = set(previous.removed) if previous else set()
    for batch in all_batches:
        if batch.is_control or batch.base_offset >= through_offset:
            continue
        for record in batch.records():
            if record.offset >= through_offset:
                continue
            if batch.base_offset in aborted:
                removed.add(record.offset)
            elif record.key is not None:
                newest[record.key] = record.offset
                records.append(record)
    for record in records:
        superseded = record.key is not None and newest[record.key] != record.offset
        if superseded or (record.is_tombstone and remove_tombstones):
            removed.add(record.offset)
    last_batch_of_producer: dict[int, int] = {}
    for batch in all_batches:
        if batch.producer_id >= 0:
            last_batch_of_producer[batch.producer_id] = batch.base_offset
    return Compaction(
        max(through_offset, previous.cleaned_through if previous else 0),
        frozenset(removed),
        frozenset(last_batch_of_producer.values()),
    )


def rewrite_records(records: bytes, compaction: Compaction) -> bytes:
    """The record batches of a Fetch response as they read after `compaction`.

    Kafka drops a batch the cleaner emptied and serves the next one; this front cannot fetch
    past the broker's answer, so when every batch of an answer would be dropped it keeps the
    last one empty, which moves the consumer past it just the same.
    """
    batches, partial = read_batches(records)
    rewritten: list[bytes] = []
    last_dropped: RecordBatch | None = None
    for batch in batches:
        if (
            batch.is_control
            or batch.is_compressed
            or batch.base_offset >= compaction.cleaned_through
        ):
            rewritten.append(batch.encoded)
            continue
        all_records = batch.records()
        kept = [record for record in all_records if record.offset not in compaction.removed]
        if len(kept) == len(all_records):
            rewritten.append(batch.encoded)
        elif kept or batch.base_offset in compaction.kept_empty:
            rewritten.append(batch.with_records(kept))
        else:
            last_dropped = batch
    if not rewritten and last_dropped is not None:
        rewritten.append(last_dropped.with_records([]))
    return b"".join(rewritten) + partial
