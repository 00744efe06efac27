"""The few pieces of the Kafka wire protocol the Kafka front (front.py) reads and writes.

Only non-flexible message versions are parsed (the front caps the versions it advertises so
clients never pick a flexible one), except ApiVersions, whose response the front must rewrite
in whatever version the client asked for.
"""

import struct
from dataclasses import dataclass

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT64 = struct.Struct(">q")


class ProtocolError(ValueError):
    """Bytes that do not parse as the Kafka message they should be."""


class Reader:
    """Reads big-endian Kafka primitives from `data`, starting at `position`."""

    def __init__(self, data: bytes, position: int = 0) -> None:
        self.data = data
        self.position = position

    def _take(self, size: int) -> bytes:
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise ProtocolError(f"message too short: wanted {size} bytes at {self.position}")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def int8(self) -> int:
        value: int = _INT8.unpack(self._take(1))[0]
        return value

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def uint32(self) -> int:
        value: int = _UINT32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack(self._take(8))[0]
        return value

    def boolean(self) -> bool:
        return self.int8() != 0

    def nullable_string(self) -> str | None:
        size = self.int16()
        return None if size < 0 else self._take(size).decode()

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ProtocolError("a non-nullable string is null")
        return value

    def nullable_bytes(self) -> bytes | None:
        size = self.int32()
        return None if size < 0 else self._take(size)

    def array_length(self) -> int:
        """The element count of an array; -1 for a null array."""
        return self.int32()

    def unsigned_varint(self) -> int:
        shift = value = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def varint(self) -> int:
        """A zigzag-encoded signed varint (record fields)."""
        raw = self.unsigned_varint()
        return (raw >> 1) ^ -(raw & 1)

    def raw(self, size: int) -> bytes:
        return self._take(size)

    def rest(self) -> bytes:
        return self._take(len(self.data) - self.position)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.unsigned_varint()):
            self.unsigned_varint()
            self._take(self.unsigned_varint())


class Writer:
    """Builds a Kafka message from big-endian primitives."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def int8(self, value: int) -> "Writer":
        self.buffer += _INT8.pack(value)
        return self

    def int16(self, value: int) -> "Writer":
        self.buffer += _INT16.pack(value)
        return self

    def int32(self, value: int) -> "Writer":
        self.buffer += _INT32.pack(value)
        return self

    def uint32(self, value: int) -> "Writer":
        self.buffer += _UINT32.pack(value)
        return self

    def int64(self, value: int) -> "Writer":
        self.buffer += _INT64.pack(value)
        return self

    def boolean(self, value: bool) -> "Writer":
        return self.int8(1 if value else 0)

    def nullable_string(self, value: str | None) -> "Writer":
        if value is None:
            return self.int16(-1)
        encoded = value.encode()
        self.int16(len(encoded))
        self.buffer += encoded
        return self

    def nullable_bytes(self, value: bytes | None) -> "Writer":
        if value is None:
            return self.int32(-1)
        self.int32(len(value))
        self.buffer += value
        return self

    def unsigned_varint(self, value: int) -> "Writer":
        while value >= 0x80:
            self.buffer.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buffer.append(value)
        return self

    def varint(self, value: int) -> "Writer":
        return self.unsigned_varint((value << 1) ^ (value >> 63))

    def raw(self, data: bytes) -> "Writer":
        self.buffer += data
        return self

    def bytes(self) -> bytes:
        return bytes(self.buffer)


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the body starts in the request (after the size prefix)


# API keys.
PRODUCE, FETCH, LIST_OFFSETS, METADATA, FIND_COORDINATOR, API_VERSIONS = 0, 1, 2, 3, 10, 18
CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, INIT_PRODUCER_ID = 19, 20, 21, 22
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 24, 25, 26
DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CLUSTER = 32, 33, 44, 60
OFFSET_COMMIT, OFFSET_FETCH, OFFSET_FOR_LEADER_EPOCH, TXN_OFFSET_COMMIT = 8, 9, 23, 28
CREATE_PARTITIONS = 37

# The first flexible version of the request APIs whose header the front must read past.
FIRST_FLEXIBLE_REQUEST = {
    PRODUCE: 9,
    FETCH: 12,
    METADATA: 9,
    FIND_COORDINATOR: 3,
    API_VERSIONS: 3,
    CREATE_TOPICS: 5,
    INIT_PRODUCER_ID: 2,
    DESCRIBE_CONFIGS: 4,
    INCREMENTAL_ALTER_CONFIGS: 1,
}


def read_request_header(request: bytes) -> RequestHeader:
    """The header of `request` (without its size prefix).

    Request header v2 (flexible versions) adds tagged fields after the client id. The front
    needs the body offset only for APIs it parses, whose flexible versions it never advertises,
    so an unknown API's tagged header fields are left unread.
    """
    reader = Reader(request)
    api_key, api_version, correlation_id = reader.int16(), reader.int16(), reader.int32()
    client_id = reader.nullable_string()
    flexible_from = FIRST_FLEXIBLE_REQUEST.get(api_key)
    if flexible_from is not None and api_version >= flexible_from:
        reader.skip_tagged_fields()
    return RequestHeader(api_key, api_version, correlation_id, client_id, reader.position)


def frame(payload: bytes) -> bytes:
    """`payload` with its int32 size prefix."""
    return _INT32.pack(len(payload)) + payload


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for index in range(256):
        crc = index
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of Kafka record batches.

    Pure Python: the front computes it only for the batches it rewrites after a compaction,
    which tests make rarely and small, so a C extension is not worth a dependency.
    """
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
