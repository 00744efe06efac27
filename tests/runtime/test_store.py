"""The per-task RocksDB store: atomic batches, metadata, and surviving a reopen."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from smoothscale.runtime._changelog import Fold, forget_reclaimed
from smoothscale.runtime.changelog import KIND_CODES, RecordKind
from smoothscale.runtime.store import (
    LOOKUP_CHUNK,
    StateChanges,
    TaskState,
    entry,
    record_key_of,
    task_directory,
)
from smoothscale.runtime.writer import Writer


def test_changes_apply_together_and_survive_a_reopen(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 3, ["counts", "windows"])
    writer = Writer(2, 1, 5)
    changes = StateChanges(positions={"counts": 10}, writers={"counts": writer})
    changes.put("counts", b"alice", b"d:alice@2.1.5.1", b"4")
    changes.put("windows", b"w1", b"d:w1@2.1.5.1", b"[1,2]")
    changes.supersede("counts", b"d:alice@1.0.0.4")
    changes.input_positions["clicks"] = 42
    state.apply(changes)
    state.close()

    reopened = TaskState(tmp_path, 3, ["counts", "windows"])
    try:
        assert reopened.get("counts", b"alice") == b"4"
        assert reopened.get("windows", b"alice") is None
        assert reopened.get_many("counts", [b"alice", b"bob"]) == [b"4", None]
        assert reopened.positions() == {"counts": 10, "windows": 0}
        assert reopened.record_keys("counts", [b"alice", b"bob"]) == [b"d:alice@2.1.5.1", None]
        assert (reopened.writer("counts"), reopened.writer("windows")) == (writer, None)
        assert (reopened.epoch("counts"), reopened.epoch("windows")) == (2, -1)
        assert reopened.garbage("counts", limit=10) == [b"d:alice@1.0.0.4"]
        assert reopened.input_positions() == {"clicks": 42}
        assert reopened.snapshot("counts") == {"alice": 4}
    finally:
        reopened.close()


def test_a_delete_is_kept_until_its_own_record_is_reclaimed(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 0, ["counts"])
    try:
        changes = StateChanges()
        changes.put("counts", b"bob", b"d:bob@1.0.0.1", b"1")
        changes.delete("counts", b"bob", b"d:bob@1.0.0.2")
        state.apply(changes)
        assert state.get("counts", b"bob") is None
        assert state.record_keys("counts", [b"bob"]) == [b"d:bob@1.0.0.2"]
        reclaim = StateChanges()
        reclaim.reclaim("counts", [b"d:bob@1.0.0.2"], [b"bob"])
        state.apply(reclaim)
        assert state.record_keys("counts", [b"bob"]) == [None]
    finally:
        state.close()


def test_many_keys_read_back_in_the_order_asked(tmp_path: Path) -> None:
    """More keys than one read takes (LOOKUP_CHUNK), present and absent in turn."""
    state = TaskState(tmp_path, 0, ["counts"])
    try:
        changes = StateChanges()
        for i in range(0, 2 * LOOKUP_CHUNK + 7, 2):
            changes.put("counts", f"k{i}".encode(), f"d:k{i}@1.0.0.1".encode(), str(i).encode())
        state.apply(changes)
        keys = [f"k{i}".encode() for i in reversed(range(2 * LOOKUP_CHUNK + 7))]
        assert state.get_many("counts", keys) == [
            None if int(key[1:]) % 2 else key[1:] for key in keys
        ]
    finally:
        state.close()


def test_tasks_have_separate_stores(tmp_path: Path) -> None:
    first, second = TaskState(tmp_path, 0, ["counts"]), TaskState(tmp_path, 1, ["counts"])
    try:
        changes = StateChanges()
        changes.put("counts", b"alice", b"d:alice@1.0.0.1", b"1")
        first.apply(changes)
        assert second.get("counts", b"alice") is None
    finally:
        first.close()
        second.close()


def test_the_runtime_metadata_name_is_not_a_store_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be named"):
        TaskState(tmp_path, 0, ["smoothscale"])


def test_values_and_record_keys_of_any_bytes_read_back_as_written(tmp_path: Path) -> None:
    state = TaskState(tmp_path, 0, ["counts"])
    try:
        changes = StateChanges()
        changes.put("counts", b"a", b"d:a@1.0.0.1", b"")
        changes.put("counts", b"b", b"d:\x80\x00\x00\x01@1.0.0.1", b"\x80\x00\x00\x00x")
        changes.delete("counts", b"c", b"d:c@1.0.0.1")
        changes.put("counts", b"d", b"", b"4")
        state.apply(changes)
        keys = [b"a", b"b", b"c", b"d", b"e"]
        assert state.get_many("counts", keys) == [b"", b"\x80\x00\x00\x00x", None, b"4", None]
        assert state.record_keys("counts", keys) == [
            b"d:a@1.0.0.1",
            b"d:\x80\x00\x00\x01@1.0.0.1",
            b"d:c@1.0.0.1",
            b"",
            None,
        ]
        assert list(state.items("counts")) == [
            (b"a", b""),
            (b"b", b"\x80\x00\x00\x00x"),
            (b"d", b"4"),
        ]
        assert list(state.scan("counts", b"b")) == [(b"b", b"\x80\x00\x00\x00x")]
        assert list(state.scan("counts", b"c")) == []
    finally:
        state.close()


def test_a_store_of_the_format_with_a_record_key_family_is_restored_from_scratch(
    tmp_path: Path,
) -> None:
    """Stores written before 2026-11-28 kept record keys in a column family of their own."""
    path = task_directory(tmp_path, 0)
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    families = {
        name: Options(raw_mode=True) for name in ("counts", "counts.records", "smoothscale")
    }
    old = Rdict(str(path), options, column_families=families)
    old.get_column_family("counts")[b"alice"] = b"4"
    old.get_column_family("smoothscale")[b"position/counts"] = b"10"
    old.close()

    state = TaskState(tmp_path, 0, ["counts"])
    try:
        assert state.positions() == {"counts": 0}
        assert list(state.items("counts")) == []
    finally:
        state.close()


@given(st.lists(st.tuples(st.binary(max_size=12), st.none() | st.binary(max_size=12))))
def test_the_entries_a_restore_makes_in_c_are_the_stores_entries(
    records: list[tuple[bytes, bytes | None]],
) -> None:
    """The fold (C) makes a batch's entries as `entry` defines them: each state key's last
    record, its record key and value (None, empty or not: a delete)."""
    writer = (1, 0, 0)
    fold = Fold()
    expected = {}
    for offset, (state_key, value) in enumerate(records):
        record_key = b"d:" + state_key + b"@1.0.0.1"
        kind = KIND_CODES.index(RecordKind.DATA if value else RecordKind.DELETE)
        fold.add(offset, kind, writer, 1, record_key, value, None)
        expected[state_key] = entry(record_key, value or None)
    fold.add(len(records), KIND_CODES.index(RecordKind.CLOSE), writer, 1, b"c@1.0.0.1", b"{}", None)
    assert fold.take()[0] == expected


# Few of each, so that tombstones often meet entries, of their record or of one it begins.
NEAR_RECORD_KEYS = st.sampled_from([b"d:a@1.0.0.1", b"d:a@1.0.0.12", b"d:a@1.0.0.2"])


@given(
    st.dictionaries(
        st.sampled_from([b"a", b"b"]),
        st.none() | st.builds(entry, NEAR_RECORD_KEYS, st.none() | st.binary(max_size=4)),
    ),
    st.lists(st.tuples(NEAR_RECORD_KEYS, st.none() | st.sampled_from([b"a", b"b", b"c"]))),
)
def test_tombstones_forget_in_c_the_entries_of_their_records(
    changed: dict[bytes, bytes | None], tombstones: list[tuple[bytes, bytes | None]]
) -> None:
    """forget_reclaimed against its definition: a key whose entry is still the tombstoned
    record is forgotten (None); a key the changes do not hold is left to the stored entry."""
    expected, elsewhere = dict(changed), []
    for index, (record_key, state_key) in enumerate(tombstones):
        if state_key is None:
            continue
        if state_key not in expected:
            elsewhere.append(index)
            continue
        current = expected[state_key]
        if current is not None and record_key_of(current) == record_key:
            expected[state_key] = None
    keys, state_keys = [key for key, _ in tombstones], [key for _, key in tombstones]
    assert forget_reclaimed(changed, keys, state_keys) == elsewhere
    assert changed == expected
