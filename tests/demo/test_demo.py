"""The scaling demo, end to end: real workers, real lag, real hand-overs, exact final state."""

import io
import re
from pathlib import Path

import pytest

from smoothscale.demo.scenario import DemoOptions, run

ROOT = Path(__file__).resolve().parents[2]


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
    assert "0 updates lost, 0 applied twice: EXACT" in story, story
    handed_over = re.findall(
        r"handing over from (instance-\d) to (instance-\d) \(lag (\d+)\)", story
    )
    assert ("instance-0", "instance-1") in {(a, b) for a, b, _lag in handed_over}, story
    assert ("instance-1", "instance-0") in {(a, b) for a, b, _lag in handed_over}, story
    assert all(int(lag) <= options.acceptable_recovery_lag for _a, _b, lag in handed_over), story
    assert "takes it over at once" not in story.split("replicas 2:")[1], (
        "after the first placement every move is a hand-over, never a failover"
    )
    activated = story.index("instance-1 is now active")
    stopped = story.index("instance-1 holds nothing any more: stopping it")
    assert activated < stopped
    assert story.rindex("instance-0 is now active") < stopped, (
        "the leaving instance is stopped only after its tasks are active elsewhere"
    )
