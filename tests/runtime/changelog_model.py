"""A model of the changelog protocol for property tests: writers that take over (hand-over,
failover, restart in place, racing activations), zombies that keep committing after a newer
marker, batches left half-written (visible, as on the mock broker), deletes, and tombstones
sent only for garbage whose superseding batch is verified.

Each writer keeps the view an instance would: the state it restored plus the batches it
committed. The owner that counts is the highest writer that wrote a marker; its view is what
every restore of the changelog must give.
"""

import json
import random
from dataclasses import dataclass, field

from smoothscale.runtime.changelog import (
    ChangelogRecord,
    Fold,
    Positioned,
    RecordKind,
    closer,
    data,
    delete,
    marker,
    state_key_of,
    tombstone,
)
from smoothscale.runtime.store import StateChanges, entry, record_key_of, value_of
from smoothscale.runtime.writer import Writer
from tests.runtime.folding import fold

STORE = "counts"
KEYS = ["alice", "bob", "carol", "dave", "a state key whose record keys outgrow a slot of the fold"]
"""State keys; the last makes record keys longer than the fold's garbage table keeps inline."""
INPUT = "clicks"


@dataclass
class View:
    """What a fold of a whole log from nothing gives, as an instance would hold it."""

    entries: dict[bytes, bytes] = field(default_factory=dict)
    """State key -> its entry (`entry`)."""
    garbage: set[bytes] = field(default_factory=set)
    input: dict[str, int] = field(default_factory=dict)

    def visible(self) -> dict[str, object]:
        return {
            key.decode(): json.loads(value)
            for key, kept in self.entries.items()
            if (value := value_of(kept)) is not None
        }


def replay(records: list[Positioned]) -> View:
    """The view a restore from scratch of `records` gives."""
    outcome = fold(STORE, records, Fold(), records[-1][0] + 1 if records else 0)
    return view_of(outcome.changes)


def view_of(changes: StateChanges) -> View:
    entries = {k: e for k, e in changes.entries.get(STORE, {}).items() if e is not None}
    return View(entries, set(changes.garbage.get(STORE, set())), dict(changes.input_positions))


@dataclass
class ModelWriter:
    writer: Writer
    view: View
    inherited: set[bytes]
    """Garbage the restored state held: legitimate by construction."""
    superseded_by: dict[bytes, int] = field(default_factory=dict)
    """Garbage this writer made -> the offset of the closer of the batch that superseded it."""
    batch: int = 0
    last_closer: bytes | None = None
    alive: bool = True


@dataclass
class ProtocolModel:
    log: list[Positioned] = field(default_factory=list)
    writers: list[ModelWriter] = field(default_factory=list)
    next_offset: int = 0
    counter: int = 0

    def append(self, records: list[ChangelogRecord], committed: bool = True) -> list[int]:
        offsets = []
        for record in records:
            self.log.append((self.next_offset, record))
            offsets.append(self.next_offset)
            self.next_offset += 1
        if committed:
            self.next_offset += 1  # the transaction's commit marker takes an offset
        return offsets

    def owner(self) -> ModelWriter | None:
        return max(self.writers, key=lambda w: w.writer, default=None)

    def take_over(self, how: str, nonce: int, old_keeps_running: bool) -> None:
        """A new writer activates: it writes its marker (and a start position when the state
        has none), then restores through it."""
        top = self.owner()
        if top is None:
            writer = Writer(1, 0, nonce)
        elif how == "restart":
            writer = Writer(top.writer.epoch, top.writer.session + 1, nonce)
        elif how == "race":
            writer = Writer(top.writer.epoch, top.writer.session, nonce)
        else:
            writer = Writer(top.writer.epoch + 1, top.writer.session + 1, nonce)
        while any(other.writer == writer for other in self.writers):
            # Random 63-bit nonces do not collide; drawn ones may (and stay 63-bit here).
            writer = Writer(writer.epoch, writer.session, (writer.nonce + 1) % 2**63)
        if top is not None and not old_keeps_running:
            top.alive = False
        records = [marker(writer, "pod")]
        if not replay(self.log).input:
            records.append(closer(writer, 0, {INPUT: 0}, None))
        self.append(records)
        view = replay(self.log)
        start = records[-1].key if len(records) == 2 else None
        self.writers.append(ModelWriter(writer, view, set(view.garbage), last_closer=start))

    def commit(
        self,
        author: ModelWriter,
        changes: list[tuple[str, int | None]],
        reclaim: int,
        reclaim_order: int,
        half_written_at: int | None,
        take_over_at: int | None,
        nonce: int,
    ) -> None:
        """One batch of `author`: data and delete records, its closer, then tombstones for up to
        `reclaim` verified garbage records. `half_written_at`: the writer dies after writing
        that many records (visible, never committed); `take_over_at`: a new owner activates
        after that many records were written (its marker lands inside the transaction)."""
        number = author.batch + 1
        records: list[ChangelogRecord] = []
        entries = dict(author.view.entries)
        for key, value in changes:
            old = entries.get(key.encode())
            supersedes = None if old is None else record_key_of(old)
            if value is None:
                record = delete(author.writer, number, key, supersedes)
            else:
                self.counter += 1
                record = data(
                    author.writer, number, key, {"n": value, "c": self.counter}, supersedes
                )
            entries[key.encode()] = entry(record.key, None if value is None else record.value)
            records.append(record)
        self.counter += 1
        position = {INPUT: self.counter}
        records.append(closer(author.writer, number, position, author.last_closer))
        tombstones = self.verified_tombstones(author, reclaim, reclaim_order)
        if author.alive is False:
            return
        records.extend(tombstones)
        if half_written_at is not None and half_written_at < len(changes) + 1:
            self.append(records[:half_written_at], committed=False)
            author.alive = False
            return
        if take_over_at is not None and take_over_at < len(records):
            written = self.append(records[:take_over_at], committed=False)
            self.take_over("failover", nonce, old_keeps_running=True)
            offsets = [*written, *self.append(records[take_over_at:])]
        else:
            offsets = self.append(records)
        closer_offset = offsets[len(records) - len(tombstones) - 1]
        author.view.entries = entries
        for record in records:
            if record.kind is RecordKind.TOMBSTONE:
                author.view.garbage.discard(record.key)
                author.inherited.discard(record.key)
                deleted = state_key_of(record.key)
                if deleted is not None and entries.get(deleted) == entry(record.key, None):
                    del entries[deleted]
            elif record.supersedes is not None:
                author.view.garbage.add(record.supersedes)
                author.superseded_by[record.supersedes] = closer_offset
        author.view.input = position
        author.batch = number
        author.last_closer = records[len(records) - len(tombstones) - 1].key

    def verified_tombstones(
        self, author: ModelWriter, limit: int, order: int
    ) -> list[ChangelogRecord]:
        """Tombstones for up to `limit` garbage records (picked in an order `order` seeds) whose
        superseding batch is verified: no higher writer's record precedes its closer. A higher
        one fences the author."""
        chosen: list[ChangelogRecord] = []
        candidates = sorted(author.view.garbage)
        random.Random(order).shuffle(candidates)
        for garbage in candidates[:limit]:
            if garbage not in author.inherited:
                closer_offset = author.superseded_by[garbage]
                if any(o < closer_offset and r.writer > author.writer for o, r in self.log):
                    author.alive = False
                    return []
            chosen.append(tombstone(author.writer, garbage))
        reclaimed = {t.key for t in chosen}
        remaining = author.view.garbage - reclaimed
        deletes: set[bytes] = set()
        for record in list(chosen):
            key = state_key_of(record.key)
            if key is None or key in deletes:
                continue
            kept = author.view.entries.get(key)
            prefix = b"d:" + key + b"@"
            if (
                kept is not None
                and value_of(kept) is None
                and not any(g.startswith(prefix) for g in remaining)
            ):
                deletes.add(key)
                chosen.append(tombstone(author.writer, record_key_of(kept)))
        return chosen
