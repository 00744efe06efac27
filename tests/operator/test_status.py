"""The status recorder: what `kubectl get ssa` and an HPA read, from one poll's snapshot."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from smoothscale.api.models import ConditionType, Phase, StreamingApp
from smoothscale.kafka.assignments import Assignment, TaskAssignment
from smoothscale.kafka.progress import ReportedRole, TaskProgress, TaskReport
from smoothscale.operator.handover import HandOver, Ledger, Ownership
from smoothscale.operator.observe import PodView
from smoothscale.operator.status import Problem, Snapshot, app_status
from smoothscale.tasks import TaskRole

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "streamingapp.yaml"
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def app() -> StreamingApp:
    return StreamingApp.model_validate(yaml.safe_load(EXAMPLE.read_text()))


def pod(name: str, ready: bool = True) -> PodView:
    return PodView(
        name=name, uid=f"uid-{name}", ordinal=int(name[-1]), ready=ready, terminating=False
    )


def held(role: TaskRole, epoch: int = 1) -> TaskAssignment:
    return TaskAssignment(role=role, epoch=epoch)


def warmup_report(instance: str, task: int, lag: int) -> TaskProgress:
    report = TaskReport(task, ReportedRole.WARMUP, 1, 2, {"counts": 0})
    return TaskProgress(instance, report, lag)


def settled_snapshot() -> Snapshot:
    ledger = Ledger(
        generation=3,
        tasks={0: Ownership(epoch=1, active="pc-0"), 1: Ownership(epoch=1, active="pc-1")},
        assignments={
            "pc-0": Assignment(generation=3, tasks={0: held(TaskRole.ACTIVE)}),
            "pc-1": Assignment(generation=3, tasks={1: held(TaskRole.ACTIVE)}),
        },
    )
    return Snapshot(
        app=app(),
        generation=4,
        selector="smoothscale.io/app=page-counts",
        pods={"pc-0": pod("pc-0"), "pc-1": pod("pc-1")},
        tasks=2,
        desired=2,
        ledger=ledger,
    )


def test_a_settled_app_is_running_ready_and_not_progressing() -> None:
    status = app_status(settled_snapshot(), None, NOW)
    assert status.phase is Phase.RUNNING
    assert (status.replicas, status.ready_replicas, status.active_replicas) == (2, 2, 2)
    assert status.warmup_replicas == 0
    assert status.selector == "smoothscale.io/app=page-counts"
    assert status.observed_generation == 4
    assert status.assignment_generation == 3
    ready = status.condition(ConditionType.READY)
    progressing = status.condition(ConditionType.PROGRESSING)
    degraded = status.condition(ConditionType.DEGRADED)
    assert ready is not None
    assert ready.status == "True"
    assert progressing is not None
    assert progressing.status == "False"
    assert degraded is not None
    assert degraded.status == "False"
    assert [t.active.instance for t in status.tasks if t.active] == ["pc-0", "pc-1"]


def test_a_warm_up_shows_its_lag_and_the_app_is_scaling() -> None:
    snapshot = settled_snapshot()
    assert snapshot.ledger is not None
    ledger = Ledger(
        generation=4,
        tasks=snapshot.ledger.tasks,
        assignments={
            **snapshot.ledger.assignments,
            "pc-2": Assignment(generation=4, tasks={1: held(TaskRole.WARMUP)}),
        },
    )
    status = app_status(
        Snapshot(
            **{
                **snapshot.__dict__,
                "ledger": ledger,
                "pods": {**snapshot.pods, "pc-2": pod("pc-2", ready=False)},
                "desired": 3,
                "progress": {("pc-2", 1): warmup_report("pc-2", 1, 4_200)},
            }
        ),
        None,
        NOW,
    )
    assert status.phase is Phase.SCALING
    assert status.warmup_replicas == 1
    assert status.max_lag == 4_200
    progressing = status.condition(ConditionType.PROGRESSING)
    assert progressing is not None
    assert progressing.reason == "WarmingUp"
    task_1 = next(t for t in status.tasks if t.task == 1)
    assert {(h.instance, h.role, h.lag) for h in task_1.holders} == {
        ("pc-1", TaskRole.ACTIVE, None),
        ("pc-2", TaskRole.WARMUP, 4_200),
    }


def test_a_hand_over_in_flight_is_shown_with_its_start_and_keeps_ready() -> None:
    snapshot = settled_snapshot()
    assert snapshot.ledger is not None
    started = NOW - timedelta(seconds=2)
    ledger = Ledger(
        generation=5,
        tasks={**snapshot.ledger.tasks, 1: Ownership(epoch=1, handover=HandOver("pc-1", "pc-0"))},
        assignments={
            "pc-0": Assignment(
                generation=5, tasks={0: held(TaskRole.ACTIVE), 1: held(TaskRole.WARMUP)}
            ),
            "pc-1": Assignment(generation=5),
        },
    )
    status = app_status(
        Snapshot(**{**snapshot.__dict__, "ledger": ledger, "handover_started": {1: started}}),
        None,
        NOW,
    )
    task_1 = next(t for t in status.tasks if t.task == 1)
    assert task_1.handover is not None
    assert (task_1.handover.from_instance, task_1.handover.to_instance) == ("pc-1", "pc-0")
    assert task_1.handover.started == started
    ready = status.condition(ConditionType.READY)
    assert ready is not None
    assert ready.status == "True", "a task moving is not a task lost"
    progressing = status.condition(ConditionType.PROGRESSING)
    assert progressing is not None
    assert progressing.reason == "HandingOver"


def test_problems_make_the_app_degraded_and_transition_times_hold_while_unchanged() -> None:
    problem = Problem("InputTopicMissing", "input topic page-views does not exist: create it")
    snapshot = Snapshot(**{**settled_snapshot().__dict__, "problems": (problem,)})
    first = app_status(snapshot, None, NOW)
    assert first.phase is Phase.DEGRADED
    degraded = first.condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert (degraded.status, degraded.reason) == ("True", "InputTopicMissing")
    assert "page-views" in degraded.message

    later = app_status(snapshot, first, NOW + timedelta(minutes=5))
    again = later.condition(ConditionType.DEGRADED)
    assert again is not None
    assert again.last_transition_time == degraded.last_transition_time

    healed = app_status(settled_snapshot(), later, NOW + timedelta(minutes=6))
    cleared = healed.condition(ConditionType.DEGRADED)
    assert cleared is not None
    assert cleared.status == "False"
    assert cleared.last_transition_time == NOW + timedelta(minutes=6)


def test_scaled_to_zero_is_not_ready_and_says_why() -> None:
    snapshot = Snapshot(
        **{
            **settled_snapshot().__dict__,
            "pods": {},
            "desired": 0,
            "ledger": Ledger(generation=9, tasks={0: Ownership(epoch=2), 1: Ownership(epoch=2)}),
        }
    )
    status = app_status(snapshot, None, NOW)
    ready = status.condition(ConditionType.READY)
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "ScaledToZero")
    assert status.replicas == 0
    assert status.to_kubernetes()["replicas"] == 0, "the scale subresource reads it"
