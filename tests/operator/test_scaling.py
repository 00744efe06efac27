"""Scaling through the operator with real worker pods, in the ways users and failures mix it up:
scaling again in the middle of a scale, to zero and back, and the operator killed (and its
status wiped) in the middle of a hand-over. Each ends with the final state exact and no task
ever reported active by two pods at once.
"""

import io
import json
from pathlib import Path

import pytest

from smoothscale.demo.scenario import APP_NAME, NAMESPACE, DemoOptions, Session, session

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.cluster]


def options(tmp_path: Path, **changes: float) -> DemoOptions:
    return DemoOptions(
        workdir=tmp_path,
        tasks=4,
        keys=400,
        backlog=4_000,
        rate=200,
        hold=3,
        phase_timeout=300,
        examples_root=ROOT,
        **changes,
    )


def pods(running: Session) -> list[str]:
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    return sorted(pod["metadata"]["name"] for pod in listing["items"])


def start_steady(running: Session) -> None:
    running.apply(replicas=1)
    running.watcher.run_until(lambda: running.watcher.settled(1), "the first instance running")
    running.feed.start()


def moving(running: Session) -> bool:
    """A warm-up or a hand-over is under way."""
    status = running.watcher.status
    return bool(status.get("warmupReplicas")) or any(
        task.get("handover") for task in status.get("tasks") or []
    )


def test_scaling_back_in_the_middle_of_a_scale_out_then_to_zero_and_up_again(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    with session(options(tmp_path), out) as running:
        watcher = running.watcher
        start_steady(running)

        running.scale(2)
        watcher.run_until(lambda: moving(running), "a warm-up on the new pod")
        running.scale(1)  # changed our mind mid-scale: re-plan from where things are
        watcher.run_until(lambda: watcher.settled(1), "back to one instance")
        watcher.run_until(lambda: pods(running) == [f"{APP_NAME}-0"], "the drained pod gone")

        running.scale(0)
        watcher.run_until(
            lambda: watcher.status.get("replicas") == 0 and not pods(running), "zero instances"
        )
        story = out.getvalue()
        assert "ScaledToZero" in json.dumps(watcher.status), story

        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "running again from the changelogs")
        assert running.finish(), out.getvalue()


def test_the_operator_killed_mid_hand_over_and_its_status_wiped_resumes_exactly(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    with session(options(tmp_path), out) as running:
        watcher = running.watcher
        start_steady(running)

        running.scale(2)
        watcher.run_until(
            lambda: any(task.get("handover") for task in watcher.status.get("tasks") or []),
            "a hand-over in flight",
        )
        running.restart_operator()
        running.kubectl(
            "patch",
            "-n",
            NAMESPACE,
            "streamingapp",
            APP_NAME,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"tasks": [], "instances": [], "assignmentGeneration": 0}}),
        )
        watcher.run_until(lambda: watcher.settled(2), "the scale-out finished by the new operator")
        running.restart_operator()
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "the scale-in")
        watcher.run_until(lambda: pods(running) == [f"{APP_NAME}-0"], "the drained pod gone")
        assert running.finish(), out.getvalue()


def test_a_drain_that_times_out_moves_the_tasks_anyway_with_a_warning(tmp_path: Path) -> None:
    out = io.StringIO()
    with session(options(tmp_path, drain_timeout=0.5), out) as running:
        watcher = running.watcher
        running.apply(replicas=2)
        watcher.run_until(lambda: watcher.settled(2), "two instances running")
        running.feed.start()
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "the scale-in")
        watcher.run_until(lambda: pods(running) == [f"{APP_NAME}-0"], "the drained pod gone")
        story = out.getvalue()
        assert "warning DrainTimeout" in story, story
        assert running.finish(), out.getvalue()
