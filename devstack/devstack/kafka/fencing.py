"""Producer fencing for the Kafka front, as a real cluster's transaction coordinator does it.

On Kafka, InitProducerId for a transactional.id gives the caller a new producer id or epoch,
and from then on every request of the id's older producers is refused: their Produce
(INVALID_PRODUCER_EPOCH from the partition leader) and their transaction requests
(AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: PRODUCER_FENCED). librdkafka's mock broker hands
out a new producer id at every InitProducerId but never refuses the old ones, so a zombie's
transaction commits (../shared/ENVIRONMENT.md). `ProducerFence` keeps, per transactional.id,
the producer the mock gave out last, and answers for the mock every request of an older one.

`initialised` names the producer a new one fences, so that the front aborts its open
transaction at once, as the coordinator does: the records it wrote before the fence stay in the
mock's log, but the front no longer serves them to read_committed readers (transactions.py).

What it does not do, and Kafka does: write the ABORT markers of that transaction (the front
puts one in a read_committed answer that would end with an aborted batch), and abort the
transaction of a producer that stays silent past its transaction.timeout.ms (here it stays open
until a newer producer of its transactional.id is initialised).
"""

from dataclasses import dataclass

from devstack.kafka.protocol import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    FIRST_FLEXIBLE_REQUEST,
    INIT_PRODUCER_ID,
    PRODUCE,
    Reader,
    RequestHeader,
    Writer,
)

_FIRST_FLEXIBLE_INIT_PRODUCER_ID = FIRST_FLEXIBLE_REQUEST[INIT_PRODUCER_ID]
VERSION_CAPS = {ADD_PARTITIONS_TO_TXN: 2, ADD_OFFSETS_TO_TXN: 2, END_TXN: 2}
"""The highest versions of the transaction requests the front parses (the non-flexible ones)."""

_NONE = 0
_INVALID_PRODUCER_EPOCH = 47
_PRODUCER_FENCED = 90
# In a v2 record batch: base offset (8), length (4), leader epoch (4), magic (1), CRC (4),
# attributes (2), last offset delta (4), first and max timestamps (16), then the producer.
_BATCH_PRODUCER_AT = 43


@dataclass(frozen=True)
class Producer:
    """A producer id and epoch as a broker hands them out."""

    id: int
    epoch: int


class ProducerFence:
    """The newest producer of each transactional.id, and the answers that refuse older ones."""

    def __init__(self) -> None:
        self._newest: dict[str, Producer] = {}

    def transactional_id(self, header: RequestHeader, request: bytes) -> str | None:
        """The transactional.id an InitProducerId request asks for (None: idempotence only)."""
        reader = Reader(request, header.body_offset)
        if header.api_version < _FIRST_FLEXIBLE_INIT_PRODUCER_ID:
            return reader.nullable_string()
        size = reader.unsigned_varint() - 1
        return None if size < 0 else reader.raw(size).decode()

    def initialised(self, transactional_id: str, version: int, response: bytes) -> Producer | None:
        """Note the producer a broker's InitProducerId response (with its correlation id) gave
        `transactional_id`: from now on it is the only one that may write for it. Returns the
        producer it fences (the one that was the newest until now), whose open transaction
        Kafka aborts; None if there is none."""
        reader = Reader(response, 4)
        if version >= _FIRST_FLEXIBLE_INIT_PRODUCER_ID:
            reader.skip_tagged_fields()  # response header v1
        reader.int32()  # throttle time
        if reader.int16() != _NONE:
            return None
        previous = self._newest.get(transactional_id)
        self._newest[transactional_id] = Producer(reader.int64(), reader.int16())
        return previous

    def refusal(self, header: RequestHeader, request: bytes) -> bytes | None:
        """The response body (after the correlation id) that refuses `request` because its
        producer was fenced, or None when the request may go to the broker."""
        api_key, version = header.api_key, header.api_version
        reader = Reader(request, header.body_offset)
        if api_key == PRODUCE and version >= 3:
            return self._refuse_produce(version, reader)
        if api_key in VERSION_CAPS and version <= VERSION_CAPS[api_key]:
            transactional_id = reader.string()
            if not self.is_fenced(transactional_id, Producer(reader.int64(), reader.int16())):
                return None
            if api_key != ADD_PARTITIONS_TO_TXN:
                return Writer().int32(0).int16(_PRODUCER_FENCED).bytes()
            answer = Writer().int32(0)
            topics = reader.array_length()
            answer.int32(topics)
            for _ in range(topics):
                answer.nullable_string(reader.string())
                partitions = reader.array_length()
                answer.int32(partitions)
                for _ in range(partitions):
                    answer.int32(reader.int32()).int16(_PRODUCER_FENCED)
            return answer.bytes()
        return None

    def is_fenced(self, transactional_id: str | None, producer: Producer) -> bool:
        """Whether a newer producer of `transactional_id` than `producer` was initialised."""
        newest = None if transactional_id is None else self._newest.get(transactional_id)
        return newest is not None and producer != newest

    def _refuse_produce(self, version: int, reader: Reader) -> bytes | None:
        """Produce v3-v8: refused as a whole when a record batch's producer is fenced."""
        transactional_id = reader.nullable_string()
        if transactional_id is None or transactional_id not in self._newest:
            return None
        reader.int16()  # acks
        reader.int32()  # timeout
        partitions: list[tuple[str, list[int]]] = []
        fenced = False
        for _ in range(reader.array_length()):
            topic = reader.string()
            indexes = []
            for _ in range(reader.array_length()):
                indexes.append(reader.int32())
                records = reader.nullable_bytes()
                if records is not None and len(records) >= _BATCH_PRODUCER_AT + 10:
                    batch = Reader(records, _BATCH_PRODUCER_AT)
                    producer = Producer(batch.int64(), batch.int16())
                    fenced = fenced or self.is_fenced(transactional_id, producer)
            partitions.append((topic, indexes))
        if not fenced:
            return None
        answer = Writer().int32(len(partitions))
        for topic, indexes in partitions:
            answer.nullable_string(topic).int32(len(indexes))
            for index in indexes:
                answer.int32(index).int16(_INVALID_PRODUCER_EPOCH).int64(-1).int64(-1)
                if version >= 5:
                    answer.int64(-1)  # log start offset
                if version >= 8:
                    answer.int32(0).nullable_string(None)  # record errors, error message
        return answer.int32(0).bytes()  # throttle time
