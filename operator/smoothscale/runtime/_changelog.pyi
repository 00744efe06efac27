"""The restore's per-record work in C (_changelog.c says what it reads and how)."""

from typing import Any

Item = tuple[
    Any,  # topic (str; anything for a message the fast path leaves to parse_record)
    Any,  # partition (int; likewise)
    int,  # kind: an index into changelog.KIND_CODES, or -1: the message, for parse_record
    Any,  # the writer's text (bytes), or the message
    int | None,  # batch
    list[int] | None,  # offsets
    list[bytes] | None,  # keys
    list[bytes | None] | None,  # values
    list[bytes | None] | None,  # the record keys superseded
    list[bytes | None] | None,  # state keys
]

def runs(messages: list[Any]) -> list[Item]: ...
