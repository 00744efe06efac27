"""The per-task RocksDB store: atomic batches, metadata, and surviving a reopen."""

from pathlib import Path

import pytest

from smoothscale.runtime.store import StateChanges, TaskState
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
