"""The restore's per-record work in C (_changelog.c says what it reads and how)."""

from typing import Any

Item = tuple[
    Any,  # topic (str; None for an error event of no topic)
    int,  # partition
    int,  # kind: an index into changelog.KIND_CODES, or SLOW or ERROR (changelog.py)
    Any,  # the writer's text (bytes); SLOW: (offset, key, value, headers); ERROR: (code, text)
    int | None,  # batch
    list[int] | None,  # offsets
    list[bytes] | None,  # keys
    list[bytes | None] | None,  # values
    list[bytes | None] | None,  # the record keys superseded
    list[bytes | None] | None,  # state keys
]

class Handle: ...  # a capsule holding the restore's librdkafka consumer

def open_consumer(settings: dict[str, str]) -> Handle: ...
def assign(consumer: Handle, partitions: list[tuple[str, int, int]], add: bool) -> None: ...
def positions(consumer: Handle, partitions: list[tuple[str, int, int]]) -> list[int]: ...
def cached_watermarks(consumer: Handle, topic: str, partition: int) -> tuple[int, int]: ...
def query_watermarks(
    consumer: Handle, topic: str, partition: int, timeout: float
) -> tuple[int, int, int]: ...
def refresh_metadata(consumer: Handle, topic: str, timeout: float) -> int: ...
def close(consumer: Handle) -> None: ...
def read(consumer: Handle, count: int, timeout: float) -> tuple[int, list[Item]]: ...
