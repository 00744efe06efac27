"""The restore's per-record work in C (_changelog.c says what it reads and how)."""

from collections.abc import Callable
from typing import Any

class Handle: ...  # a capsule holding the restore's librdkafka consumer

class Fold:
    """The fold of one changelog partition (changelog.py gives the rule)."""

    def __init__(
        self, writer: tuple[int, int, int] | None = None, closed: int = -1, position: int = 0
    ) -> None: ...
    def add(
        self,
        offset: int,
        kind: int,
        writer: tuple[int, int, int],
        batch: int | None,
        key: bytes,
        value: bytes | None,
        supersedes: bytes | None,
    ) -> None: ...
    def advance(self, position: int) -> None: ...
    def take(
        self,
    ) -> tuple[
        dict[bytes, bytes | None],  # state key -> entry, or None to forget it
        dict[bytes, set[bytes]],  # state key -> record keys tombstoned
        set[bytes],  # garbage: record keys superseded
        set[bytes],  # collected: record keys tombstoned, out of the stored garbage set
        list[bytes],  # the values of the closers applied, in order
        int,  # the position to resume from
        tuple[int, int, int] | None,  # W*
        int,  # the batch W* last closed
    ]: ...
    @property
    def position(self) -> int: ...
    @property
    def read_to(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def changed(self) -> bool: ...
    @property
    def writer(self) -> tuple[int, int, int] | None: ...
    @property
    def closed(self) -> int: ...
    @property
    def pending(self) -> list[int]: ...
    @property
    def applied(self) -> int: ...
    @property
    def skipped(self) -> int: ...

Slow = Callable[[Fold, str, int, tuple[int, bytes | None, bytes | None, Any]], bool]
"""slow(fold, topic, partition, (offset, key, value, headers)) -> whether the record was folded."""

def open_consumer(settings: dict[str, str]) -> Handle: ...
def assign(consumer: Handle, partitions: list[tuple[str, int, int]], add: bool) -> None: ...
def positions(consumer: Handle, partitions: list[tuple[str, int, int]]) -> list[int]: ...
def cached_watermarks(consumer: Handle, topic: str, partition: int) -> tuple[int, int]: ...
def query_watermarks(
    consumer: Handle, topic: str, partition: int, timeout: float
) -> tuple[int, int, int]: ...
def refresh_metadata(consumer: Handle, topic: str, timeout: float) -> int: ...
def close(consumer: Handle) -> None: ...
def wake(consumer: Handle) -> None: ...
def read(
    consumer: Handle,
    count: int,
    timeout: float,
    folds: dict[tuple[str, int], Fold],
    slow: Slow,
) -> tuple[int, dict[int, int], list[tuple[str | None, int, int, str]]]: ...
def forget_reclaimed(
    entries: dict[bytes, bytes | None], record_keys: list[bytes], state_keys: list[bytes | None]
) -> list[int]: ...
