"""The partition plan: the file through which the driver tells the source what to read."""

from pathlib import Path

import pytest

from smoothscale.runtime.source import SourceError, read_plan, write_plan


def test_write_plan_replaces_the_plan_atomically_and_read_plan_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, {("orders", 3): 1200, ("payments", 3): 57}, version=8)
    write_plan(path, {("orders", 4): 9}, version=9)

    plan = read_plan(path)

    assert plan.partitions == {"orders:4": 9}
    assert plan.version == 9
    assert plan.activation("orders:4") == 0
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"], "no temporary file is left"


def test_read_plan_says_what_is_wrong_with_a_bad_plan(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no partition plan"):
        read_plan(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"partitions": {"orders": 1}, "version": 1}')
    with pytest.raises(SourceError, match="'topic:partition'"):
        read_plan(tmp_path / "bad.json")
    (tmp_path / "negative.json").write_text('{"partitions": {"orders:1": -1}, "version": 1}')
    with pytest.raises(SourceError, match="non-negative"):
        read_plan(tmp_path / "negative.json")


def test_activations_round_trip_and_default_to_zero(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(
        path, {("orders", 1): 5, ("orders", 2): 0}, version=3, activations={("orders", 1): 4}
    )

    plan = read_plan(path)

    assert (plan.activation("orders:1"), plan.activation("orders:2")) == (4, 0)


def test_a_plan_written_without_activations_by_hand_is_read(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text('{"partitions": {"orders:1": 5}, "version": 1}')

    assert read_plan(tmp_path / "plan.json").activation("orders:1") == 0
