"""Restoring state from a changelog: the record format, batches that count only when closed,
and the epoch rule that ignores zombies."""

import json
from pathlib import Path

import pytest

from smoothscale.runtime.changelog import (
    ChangelogFormatError,
    ChangelogRecord,
    data_record,
    epoch_marker,
    fold,
    input_position_record,
    parse_record,
)
from smoothscale.runtime.store import TaskState

STORE = "counts"


def restore(records: list[ChangelogRecord], highest_epoch: int = -1) -> dict[str, object]:
    outcome = fold(STORE, list(enumerate(records)), highest_epoch, next_position=len(records))
    state = {
        key.decode(): json.loads(value)
        for key, value in outcome.changes.puts.get(STORE, {}).items()
    }
    return {
        "state": state,
        "deleted": sorted(k.decode() for k in outcome.changes.deletes.get(STORE, set())),
        "input": outcome.changes.input_positions,
        "epoch": outcome.changes.epochs[STORE],
        "position": outcome.changes.positions[STORE],
        "pending": [offset for offset, _ in outcome.pending],
        "skipped": outcome.skipped,
    }


def test_records_round_trip_through_message_fields() -> None:
    record = data_record("alice", {"count": 3}, epoch=7)
    parsed = parse_record(record.key, record.value, record.headers())
    assert parsed == record
    assert json.loads(parsed.value or b"") == {"count": 3}


def test_a_record_smoothscale_did_not_write_is_refused() -> None:
    with pytest.raises(ChangelogFormatError, match="written by smoothscale only"):
        parse_record(b"bob", b"5", None)


def test_restore_applies_closed_batches_in_order() -> None:
    restored = restore(
        [
            epoch_marker(1, "pod-a"),
            data_record("alice", 1, 1),
            data_record("bob", 1, 1),
            input_position_record({"clicks": 2}, 1),
            data_record("alice", 2, 1),
            data_record("bob", None, 1),
            input_position_record({"clicks": 3}, 1),
        ]
    )
    assert restored["state"] == {"alice": 2}
    assert restored["deleted"] == ["bob"]
    assert restored["input"] == {"clicks": 3}
    assert restored["epoch"] == 1
    assert restored["position"] == 7


def test_an_unclosed_batch_waits_and_keeps_the_position_before_it() -> None:
    restored = restore(
        [
            data_record("alice", 1, 1),
            input_position_record({"clicks": 1}, 1),
            data_record("alice", 2, 1),
        ]
    )
    assert restored["state"] == {"alice": 1}
    assert restored["pending"] == [2]
    assert restored["position"] == 2, "a restart must read the open batch again"


def test_an_unclosed_batch_of_a_dead_owner_is_dropped_at_the_new_owners_marker() -> None:
    restored = restore(
        [
            data_record("alice", 1, 1),
            input_position_record({"clicks": 1}, 1),
            # The owner died in the middle of its next transaction, and a broker that shows
            # uncommitted records (the librdkafka mock) delivers what it had written.
            data_record("alice", 2, 1),
            epoch_marker(2, "pod-b"),
            data_record("alice", 5, 2),
            input_position_record({"clicks": 4}, 2),
        ]
    )
    assert restored["state"] == {"alice": 5}
    assert restored["input"] == {"clicks": 4}
    assert restored["pending"] == []


def test_a_zombies_writes_after_the_new_owners_marker_are_skipped() -> None:
    restored = restore(
        [
            data_record("alice", 1, 1),
            input_position_record({"clicks": 1}, 1),
            epoch_marker(2, "pod-b"),
            # The old owner (epoch 1) was not fenced and commits one more batch.
            data_record("alice", 99, 1),
            input_position_record({"clicks": 50}, 1),
            data_record("alice", 2, 2),
            input_position_record({"clicks": 2}, 2),
        ]
    )
    assert restored["state"] == {"alice": 2}
    assert restored["input"] == {"clicks": 2}
    assert restored["skipped"] == 2
    assert restored["epoch"] == 2


def test_a_batch_split_across_restore_runs_applies_once_closed(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 0, [STORE])
    try:
        first = fold(STORE, [(0, data_record("alice", 1, 1))], state.epoch(STORE), 1)
        state.apply(first.changes)
        assert state.get(STORE, b"alice") is None
        assert state.position(STORE) == 0
        closing = [(1, input_position_record({"clicks": 1}, 1))]
        second = fold(STORE, closing, state.epoch(STORE), 2, first.pending)
        state.apply(second.changes)
        assert state.snapshot(STORE) == {"alice": 1}
        assert (state.position(STORE), state.input_positions()) == (2, {"clicks": 1})
    finally:
        state.close()


def test_the_highest_epoch_persists_across_restore_runs(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 0, [STORE])
    try:
        state.apply(fold(STORE, [(0, epoch_marker(3, "pod-b"))], state.epoch(STORE), 1).changes)
        stale = [(1, data_record("alice", 99, 2)), (2, input_position_record({"c": 9}, 2))]
        second = fold(STORE, stale, state.epoch(STORE), 3)
        state.apply(second.changes)
        assert second.skipped == 2
        assert state.get(STORE, b"alice") is None
        assert (state.epoch(STORE), state.position(STORE)) == (3, 3)
    finally:
        state.close()
