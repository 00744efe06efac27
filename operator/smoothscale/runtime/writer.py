"""The identity of one writer of a task's changelogs: one activation of one owner.

`Writer(epoch, session, nonce)` is ordered lexicographically. The epoch comes from the
operator's assignment; the session is one more than the highest session the task's changelogs
hold, chosen at each activation, so an instance restarted in place at the same epoch is a new,
higher writer; the nonce (random, 63 bits) only breaks the tie between two activations that
raced to the same session. docs/runtime.md says why every record key carries it.
"""

import secrets
from dataclasses import dataclass
from typing import Self


@dataclass(frozen=True, order=True)
class Writer:
    epoch: int
    session: int
    nonce: int

    def __str__(self) -> str:
        return f"{self.epoch}.{self.session}.{self.nonce}"

    @classmethod
    def parse(cls, text: str) -> Self:
        """The writer `str(writer)` printed; ValueError if `text` is not one."""
        epoch, session, nonce = (int(part) for part in text.split("."))
        return cls(epoch, session, nonce)

    @classmethod
    def next_after(cls, epoch: int, highest: "Writer | None") -> "Writer":
        """A new writer at `epoch`, above `highest` (the highest writer the changelogs hold)."""
        session = 0 if highest is None else highest.session + 1
        return cls(epoch, session, secrets.randbits(63))
