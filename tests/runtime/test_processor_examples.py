"""The example processors (examples/processors) run per task with hand-overs in the middle
give what the input says, whatever the batches and owners."""

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from examples.processors import running_count, session_windows

from tests.runtime.processor_helpers import ProcessorTask, at, ms


def batches_with_hand_overs(
    tmp_path: Path, pipeline: Any, batches: list[list[dict[str, Any]]], hand_over_at: set[int]
) -> list[tuple[str, Any]]:
    """Run `batches` on one task, handing it to a new owner (from its compacted changelog)
    before each batch index in `hand_over_at`; returns every output."""
    task = ProcessorTask(tmp_path / "owner-0", pipeline)
    outputs: list[tuple[str, Any]] = []
    for number, rows in enumerate(batches):
        if number in hand_over_at:
            task = task.handed_over(tmp_path / f"owner-{number}", compacted=number % 2 == 0)
        outputs += task.run(rows).outputs
    task.close()
    return outputs


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("api", ["pandas", "rows"])
def test_the_running_count_ends_at_each_users_total(tmp_path: Path, seed: int, api: str) -> None:
    chooser = random.Random(seed)
    rows = [{"user": chooser.choice("abcde")} for _ in range(300)]
    cuts = sorted(chooser.sample(range(1, 300), 9))
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, 300], strict=True)]
    pipeline = running_count.pipeline() if api == "pandas" else running_count.rows_pipeline()

    outputs = batches_with_hand_overs(tmp_path, pipeline, batches, {3, 7})

    last = {user: value["count"] for user, value in outputs}
    assert last == Counter(row["user"] for row in rows)


def reference_sessions(clicks: dict[str, list[int]]) -> list[tuple[str, int, int, int]]:
    """Sessions computed straight from the clicks: runs with gaps of at most GAP_MS."""
    found = []
    for user, times in clicks.items():
        if not times:
            continue
        run = [times[0]]
        for time in times[1:]:
            if time - run[-1] > session_windows.GAP_MS:
                found.append((user, run[0], run[-1], len(run)))
                run = []
            run.append(time)
        found.append((user, run[0], run[-1], len(run)))
    return sorted(found)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sessions_closed_by_event_time_timers_match_the_clicks(tmp_path: Path, seed: int) -> None:
    chooser = random.Random(seed)
    clicks: dict[str, list[int]] = {user: [] for user in "abc"}
    rows = []
    for second in range(100, 700):
        user = chooser.choice("abc")
        if chooser.random() < 0.3:
            clicks[user].append(ms(second))
            rows.append({"user": user, "ts": at(second)})
    flush = [{"user": "z", "ts": at(10_000)}]
    cuts = sorted(chooser.sample(range(1, len(rows)), 7))
    bounds = zip([0, *cuts], [*cuts, len(rows)], strict=True)
    batches = [rows[a:b] for a, b in bounds] + [flush, []]

    outputs = batches_with_hand_overs(tmp_path, session_windows.pipeline(), batches, {2, 5})

    sessions = sorted((u, v["start"], v["end"], v["clicks"]) for u, v in outputs)
    assert sessions == reference_sessions(clicks)
