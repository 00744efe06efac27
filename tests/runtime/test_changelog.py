"""Restoring state from a changelog: the record format, batches that count only when closed,
and the writer rule that ignores zombies."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smoothscale.runtime.changelog import (
    ChangelogFormatError,
    ChangelogRecord,
    Fold,
    add_record,
    changes,
    closer,
    data,
    delete,
    marker,
    parse_record,
    resume,
    tombstone,
)
from smoothscale.runtime.store import TaskState, value_of
from smoothscale.runtime.writer import Writer
from tests.runtime.folding import fold, taken

STORE = "counts"
A, B = Writer(1, 0, 7), Writer(2, 1, 3)


def restore(records: list[ChangelogRecord]) -> dict[str, object]:
    outcome = fold(STORE, list(enumerate(records)), Fold(), next_position=len(records))
    entries = outcome.changes.entries.get(STORE, {})
    return {
        "state": {
            key.decode(): json.loads(value)
            for key, entry in entries.items()
            if entry is not None and (value := value_of(entry)) is not None
        },
        "deleted": sorted(k.decode() for k, e in entries.items() if e and value_of(e) is None),
        "garbage": outcome.changes.garbage.get(STORE, set()),
        "input": outcome.changes.input_positions,
        "writer": outcome.changes.writers.get(STORE),
        "position": outcome.changes.positions[STORE],
        "pending": outcome.cursor.pending,
        "skipped": outcome.skipped,
    }


EVERY_KIND = (
    data(A, 3, "alice", {"count": 3}, b"d:alice@1.0.7.2"),
    delete(A, 4, "alice", None),
    closer(A, 4, {"clicks": 9}, b"c@1.0.7.3"),
    marker(A, "pod-a"),
    tombstone(B, b"d:alice@1.0.7.2"),
)


def test_records_round_trip_through_message_fields() -> None:
    for record in EVERY_KIND:
        assert parse_record(record.key, record.value, record.headers()) == record


def test_record_keys_are_unique_per_writer_and_batch() -> None:
    assert data(A, 3, "al@ice", 1, None).key == b"d:al@ice@1.0.7.3"
    assert data(A, 3, "al@ice", 1, None).state_key() == b"al@ice"
    assert closer(A, 3, {}, None).key == b"c@1.0.7.3"
    assert marker(A, "pod-a").key == b"m@1.0.7"


def test_a_batchs_changes_keep_the_record_format_byte_for_byte() -> None:
    # Restore and compaction depend on these bytes: building a batch's records at once (the
    # commit's fast path) must give exactly what the one-record constructors give.
    changed = {"alice": 5, "bob": None, "carol": {"n": 2, "at": [1.5, True]}, "dave": False}
    supersedes = [b"d:alice@1.0.7.2", b"d:bob@1.0.7.1", None, None]
    records = changes(A, 3, changed, supersedes)
    assert [(r.key, r.value) for r in records] == [
        (b"d:alice@1.0.7.3", b"5"),
        (b"d:bob@1.0.7.3", b""),
        (b"d:carol@1.0.7.3", b'{"at":[1.5,true],"n":2}'),
        (b"d:dave@1.0.7.3", b"false"),
    ]
    assert records == [
        data(A, 3, "alice", 5, supersedes[0]),
        delete(A, 3, "bob", supersedes[1]),
        data(A, 3, "carol", {"n": 2, "at": [1.5, True]}, None),
        data(A, 3, "dave", False, None),
    ]
    assert [r.headers() for r in records] == [
        [("smoothscale.supersedes", b"d:alice@1.0.7.2")],
        [("smoothscale.supersedes", b"d:bob@1.0.7.1")],
        None,
        None,
    ]


def test_only_what_a_key_cannot_say_goes_in_headers() -> None:
    assert marker(A, "pod-a").headers() is None
    assert closer(A, 3, {}, None).headers() is None
    assert closer(A, 3, {}, b"c@1.0.7.2").headers() == [("smoothscale.supersedes", b"c@1.0.7.2")]
    # A tombstone's key is the record it reclaims, of another writer maybe: it names its own.
    assert tombstone(B, b"d:alice@1.0.7.2").headers() == [("smoothscale.writer", b"2.1.3")]


def test_records_of_earlier_releases_read_the_same() -> None:
    # Until 2026-11-27 every record also carried its kind, writer, epoch and batch as headers.
    def earlier(record: ChangelogRecord) -> list[tuple[str, bytes]]:
        headers = [
            ("smoothscale.kind", record.kind.value.encode()),
            ("smoothscale.writer", str(record.writer).encode()),
            ("smoothscale.epoch", str(record.writer.epoch).encode()),
        ]
        if record.batch is not None:
            headers.append(("smoothscale.batch", str(record.batch).encode()))
        if record.supersedes is not None:
            headers.append(("smoothscale.supersedes", record.supersedes))
        return headers

    for record in EVERY_KIND:
        assert parse_record(record.key, record.value, earlier(record)) == record


def test_a_record_smoothscale_did_not_write_is_refused() -> None:
    for foreign in (b"bob", b"d:bob", b"bob@1.0.7.3", b"x@1.0.7", b"cc@1.0.7.3"):
        with pytest.raises(ChangelogFormatError, match="written by smoothscale only"):
            parse_record(foreign, b"5", None)
    for bad_writer_or_batch in (b"d:bob@1.0.7", b"c@1.0.7", b"m@1.0.7.3", b"d:bob@1.x.7.3"):
        with pytest.raises(ChangelogFormatError, match="whose writer or batch is not one"):
            parse_record(bad_writer_or_batch, b"5", None)
    with pytest.raises(ChangelogFormatError, match=r"without the smoothscale\.writer header"):
        parse_record(b"bob", None, None)
    with pytest.raises(ChangelogFormatError, match="not a writer"):
        parse_record(b"d:bob@1.0.7.3", None, [("smoothscale.writer", b"bob")])
    with pytest.raises(ChangelogFormatError, match="without a key"):
        parse_record(None, b"5", None)


def test_restore_applies_closed_batches_in_order() -> None:
    alice1 = data(A, 1, "alice", 1, None)
    bob1 = data(A, 1, "bob", 1, None)
    restored = restore(
        [
            marker(A, "pod-a"),
            alice1,
            bob1,
            closer(A, 1, {"clicks": 2}, None),
            data(A, 2, "alice", 2, alice1.key),
            delete(A, 2, "bob", bob1.key),
            closer(A, 2, {"clicks": 3}, b"c@1.0.7.1"),
        ]
    )
    assert restored["state"] == {"alice": 2}
    assert restored["deleted"] == ["bob"]
    assert restored["garbage"] == {alice1.key, bob1.key, b"c@1.0.7.1"}
    assert restored["input"] == {"clicks": 3}
    assert (restored["writer"], restored["position"]) == (A, 7)


def test_an_unclosed_batch_waits_and_keeps_the_position_before_it() -> None:
    restored = restore(
        [
            data(A, 1, "alice", 1, None),
            closer(A, 1, {"clicks": 1}, None),
            data(A, 2, "alice", 2, None),
        ]
    )
    assert restored["state"] == {"alice": 1}
    assert restored["pending"] == [2]
    assert restored["position"] == 2, "a restart must read the open batch again"


def test_a_tombstone_drops_the_pending_record_it_reclaims_and_only_that() -> None:
    """On a compacted log a record of the open batch can be tombstoned (its successor
    verified, its closer compacted away): it is dropped, and the position moves past it."""
    alice, bob = data(A, 2, "alice", 2, None), data(A, 2, "bob", 2, None)
    restored = restore(
        [
            data(A, 1, "carol", 1, None),
            alice,
            bob,
            tombstone(A, data(A, 1, "carol", 1, None).key),  # of batch 1: closed, not pending
            tombstone(A, data(B, 2, "alice", 2, None).key),  # another writer's record
            tombstone(A, alice.key),
        ]
    )
    assert restored["pending"] == [2]
    assert restored["position"] == 2
    assert restored["state"] == {}  # batch 1 closed by batch 2, carol then forgotten


ALICE_1 = data(A, 1, "alice", 1, None)


@pytest.mark.parametrize(
    ("tombstoned", "pending", "state"),
    [
        (ALICE_1.key, [2, 3], {"alice": 2, "bob": 2}),
        (data(A, 3, "alice", 3, None).key, [2, 3], {"alice": 2, "bob": 2}),
        (data(Writer(1, 0, 6), 2, "alice", 2, None).key, [2, 3], {"alice": 2, "bob": 2}),
        (data(A, 2, "carol", 2, None).key, [2, 3], {"alice": 2, "bob": 2}),
        (data(A, 2, "alice", 2, None).key, [3], {"alice": 1, "bob": 2}),
    ],
    ids=[
        "W*-closed-batch",
        "W*-later-batch",
        "other-writer-same-batch",
        "open-batch-other-key",
        "the-pending-record",
    ],
)
def test_a_tombstone_leaves_the_open_batch_whole_unless_it_names_one_of_its_records(
    tombstoned: bytes, pending: list[int], state: dict[str, object]
) -> None:
    """A tombstone drops from W*'s open batch only the record whose key it is. A key that
    differs from a pending record's in one part only (its batch, before or after the open one;
    its writer; its state key) leaves every pending record to take effect when the batch
    closes. The last case, the open batch's own alice, is dropped: alice stays at batch 1."""
    records = [
        ALICE_1,
        closer(A, 1, {"clicks": 1}, None),
        data(A, 2, "alice", 2, ALICE_1.key),
        data(A, 2, "bob", 2, None),
        tombstone(A, tombstoned),
    ]
    assert restore(records)["pending"] == pending
    closed = restore([*records, closer(A, 2, {"clicks": 2}, b"c@1.0.7.1")])
    assert (closed["state"], closed["pending"], closed["input"]) == (state, [], {"clicks": 2})


@given(seed=st.integers(0, 2**32 - 1), keys=st.integers(1, 400), steps=st.integers(1, 3000))
@settings(max_examples=30, deadline=None)
def test_the_garbage_set_changes_are_those_of_its_additions_and_removals_in_order(
    seed: int, keys: int, steps: int
) -> None:
    """Superseded record keys enter the garbage set, a tombstone takes its key out (and one not
    in it is collected, out of the stored set): the fold keeps these in a table of its own,
    thousands of keys coming and going between two takes; what it takes is what two sets
    would hold, taken at any point."""
    rng = random.Random(seed)
    pool = [b"c@1.0.7.%d" % n + b"x" * rng.randrange(0, 40) for n in range(keys)]
    cursor = Fold()
    expected: dict[bytes, bool] = {}  # record key -> in the garbage set (else collected)
    batch = 0
    for offset in range(steps):
        key = rng.choice(pool)
        if rng.random() < 0.5:
            batch += 1
            add_record(cursor, offset, closer(A, batch, {"clicks": batch}, key))
            expected[key] = True
        else:
            add_record(cursor, offset, tombstone(A, key))
            if expected.get(key):
                del expected[key]
            else:
                expected[key] = False
        if rng.random() < 0.01 or offset == steps - 1:
            changes = taken(cursor, STORE)
            assert changes.garbage.get(STORE, set()) == {k for k, g in expected.items() if g}
            assert changes.collected.get(STORE, set()) == {k for k, g in expected.items() if not g}
            expected.clear()


def test_a_later_batch_of_the_same_writer_closes_the_pending_one() -> None:
    """Its closer may have been reclaimed: the writer only went on after it committed."""
    restored = restore(
        [data(A, 1, "alice", 1, None), data(A, 2, "bob", 1, None), closer(A, 2, {"c": 2}, None)]
    )
    assert restored["state"] == {"alice": 1, "bob": 1}
    assert restored["input"] == {"c": 2}


def test_an_unclosed_batch_of_a_dead_owner_is_dropped_at_the_new_owners_marker() -> None:
    restored = restore(
        [
            data(A, 1, "alice", 1, None),
            closer(A, 1, {"clicks": 1}, None),
            # The owner died in the middle of its next transaction, and a broker that shows
            # uncommitted records (the librdkafka mock) delivers what it had written.
            data(A, 2, "alice", 2, None),
            marker(B, "pod-b"),
            data(B, 1, "alice", 5, None),
            closer(B, 1, {"clicks": 4}, None),
        ]
    )
    assert restored["state"] == {"alice": 5}
    assert restored["input"] == {"clicks": 4}
    assert restored["pending"] == []


def test_a_zombies_writes_after_the_new_owners_marker_are_skipped() -> None:
    restored = restore(
        [
            data(A, 1, "alice", 1, None),
            closer(A, 1, {"clicks": 1}, None),
            marker(B, "pod-b"),
            # The old owner was not fenced and commits one more batch.
            data(A, 2, "alice", 99, None),
            closer(A, 2, {"clicks": 50}, None),
            data(B, 1, "alice", 2, None),
            closer(B, 1, {"clicks": 2}, None),
        ]
    )
    assert restored["state"] == {"alice": 2}
    assert restored["input"] == {"clicks": 2}
    assert restored["skipped"] == 2
    assert restored["writer"] == B


def test_a_restart_in_place_is_a_higher_writer_at_the_same_epoch() -> None:
    restarted = Writer.next_after(1, A)
    assert (restarted.epoch, restarted.session) == (1, 1)
    assert restarted > A
    restored = restore(
        [
            data(A, 1, "alice", 1, None),
            closer(A, 1, {"clicks": 1}, None),
            data(A, 2, "alice", 2, None),
            marker(restarted, "pod-a"),
        ]
    )
    assert restored["state"] == {"alice": 1}


def test_tombstones_change_no_state_and_reclaim_a_delete() -> None:
    alice1 = data(A, 1, "alice", 1, None)
    gone = delete(A, 2, "alice", alice1.key)
    restored = restore(
        [
            alice1,
            closer(A, 1, {"clicks": 1}, None),
            gone,
            closer(A, 2, {"clicks": 2}, None),
            tombstone(A, alice1.key),
            tombstone(A, data(A, 9, "bob", 1, None).key),
        ]
    )
    assert restored["state"] == {}
    assert restored["deleted"] == ["alice"]
    assert restored["garbage"] == set()
    reclaimed = restore([gone, closer(A, 2, {}, None), tombstone(A, gone.key)])
    assert reclaimed["deleted"] == []


def test_a_batch_split_across_restore_runs_applies_once_closed(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 0, [STORE])
    try:
        first = fold(STORE, [(0, data(A, 1, "alice", 1, None))], Fold(), 1)
        state.apply(first.changes)
        assert state.get(STORE, b"alice") is None
        assert state.position(STORE) == 0
        second = fold(STORE, [(1, closer(A, 1, {"clicks": 1}, None))], first.cursor, 2)
        state.apply(second.changes)
        assert state.snapshot(STORE) == {"alice": 1}
        assert state.record_keys(STORE, [b"alice"]) == [b"d:alice@1.0.7.1"]
        assert (state.position(STORE), state.input_positions()) == (2, {"clicks": 1})
    finally:
        state.close()


def test_the_highest_writer_persists_across_restore_runs(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 0, [STORE])
    try:
        state.apply(fold(STORE, [(0, marker(B, "pod-b"))], Fold(), 1).changes)
        stale = [(1, data(A, 1, "alice", 99, None)), (2, closer(A, 1, {"c": 9}, None))]
        second = fold(STORE, stale, resume(state, STORE), 3)
        state.apply(second.changes)
        assert second.skipped == 2
        assert state.get(STORE, b"alice") is None
        assert (state.writer(STORE), state.epoch(STORE), state.position(STORE)) == (B, 2, 3)
    finally:
        state.close()


def test_a_fold_holds_what_it_keeps_not_what_it_read() -> None:
    """The restore writes behind once its folds hold WRITE_BEHIND_BYTES: a key the changelog
    updates in every batch holds one entry, however many batches are read."""
    cursor, previous, held = Fold(), None, []
    for number in range(1, 201):
        update = data(A, number, "alice", number, previous)
        records = [update, closer(A, number, {"clicks": number}, None)]
        if previous is not None:
            records.append(tombstone(A, previous))
        for offset, record in enumerate(records, 3 * number):
            add_record(cursor, offset, record)
        previous = update.key
        held.append(cursor.held)
    # Only the closers' values add up (each batch's input positions, parsed when taken), and
    # alice's entry by the digits her batch number and count gain.
    closers = sum(len(closer(A, n, {"clicks": n}, None).value or b"") + 100 for n in range(3, 201))
    assert held[-1] <= held[1] + closers + 4
    cursor.take()
    assert cursor.held == 0
