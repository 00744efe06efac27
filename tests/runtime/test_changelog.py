"""Restoring state from a changelog: record format and the epoch rule that ignores zombies."""

import json
from pathlib import Path

from smoothscale.runtime.changelog import (
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
    outcome = fold(STORE, records, highest_epoch, next_position=len(records))
    state = {
        key.decode(): json.loads(value)
        for key, value in outcome.changes.puts.get(STORE, {}).items()
    }
    return {
        "state": state,
        "deleted": sorted(k.decode() for k in outcome.changes.deletes.get(STORE, set())),
        "input": outcome.changes.input_positions,
        "epoch": outcome.changes.epochs[STORE],
        "skipped": outcome.skipped,
    }


def test_records_round_trip_through_message_fields() -> None:
    record = data_record("alice", {"count": 3}, epoch=7)
    parsed = parse_record(record.key, record.value, record.headers())
    assert parsed == record
    assert json.loads(parsed.value or b"") == {"count": 3}


def test_a_record_without_smoothscale_headers_is_epoch_zero_data() -> None:
    parsed = parse_record(b"bob", b"5", None)
    assert (parsed.kind.value, parsed.epoch, parsed.value) == ("data", 0, b"5")


def test_restore_applies_puts_deletes_and_the_input_position_in_order() -> None:
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


def test_a_zombie_writes_after_the_new_owners_marker_are_skipped() -> None:
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


def test_the_highest_epoch_persists_across_restore_runs(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 0, [STORE])
    try:
        first = fold(STORE, [epoch_marker(3, "pod-b")], state.epoch(STORE), 1)
        state.apply(first.changes)
        second = fold(STORE, [data_record("alice", 99, 2)], state.epoch(STORE), 2)
        state.apply(second.changes)
        assert second.skipped == 1
        assert state.get(STORE, b"alice") is None
        assert (state.epoch(STORE), state.position(STORE)) == (3, 2)
    finally:
        state.close()
