"""The scaling demo, end to end: `kubectl scale` through the operator, real worker pods, real
lag and hand-overs, an exact final state."""

import io
import json
import re
from pathlib import Path

import pytest

from devstack.demo.scenario import DemoOptions, run

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.spark
@pytest.mark.slow
def test_scaling_out_and_in_keeps_the_state_exact_and_moves_only_caught_up_tasks(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    options = DemoOptions(
        workdir=tmp_path,
        tasks=4,
        keys=500,
        backlog=5_000,
        rate=300,
        acceptable_recovery_lag=10_000,
        hold=5,
        examples_root=ROOT,
    )
    exit_code = run(options, out)
    story = out.getvalue()
    assert exit_code == 0, story
    assert (
        "0 updates lost, 0 applied twice, 0 output records repeated or out of order: EXACT" in story
    ), story
    assert "tasks processed by two instances at once: 0" in story, story
    assert re.search(r"longest stop of any partition: scale-out [\d.]+ s, scale-in [\d.]+ s", story)
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    owners = {stint["instance"] for task in timeline["tasks"] for stint in task["stints"]}
    assert owners == {"counts-0", "counts-1"}, "the timeline shows both instances processing"
    handed_over = re.findall(r"handing over from (counts-\d) to (counts-\d) \(lag (\d+)\)", story)
    assert ("counts-0", "counts-1") in {(a, b) for a, b, _lag in handed_over}, story
    assert ("counts-1", "counts-0") in {(a, b) for a, b, _lag in handed_over}, story
    assert all(int(lag) <= options.acceptable_recovery_lag for _a, _b, lag in handed_over), story
    after_scale_out = story.split("kubectl scale")[1]
    assert "FailedOver" not in after_scale_out, "after the first placement, never a failover"
    assert "takes it over at once" not in after_scale_out, "every later move is a hand-over"
    activated = story.index("HandedOver: task")
    drained = story.index("Drained: counts-1")
    assert activated < drained
    assert story.rindex("HandedOver: task") < drained, (
        "the leaving pod is deleted only after its tasks are active elsewhere"
    )
