"""The record: what the StreamingApp's status says after a poll (pure, no I/O).

The status is for people and tools (`kubectl get ssa`, an HPA through the scale subresource,
GitOps health checks). The operator's own memory is the ledger it writes to Kafka first
(smoothscale.operator.ledger); the status mirrors it and adds what was observed: pods, lags,
conditions. Conditions keep their lastTransitionTime while their status does not change.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from smoothscale.api.models import (
    Condition,
    ConditionStatus,
    ConditionType,
    InstanceSummary,
    Phase,
    ScalingSummary,
    StreamingApp,
    StreamingAppStatus,
    TaskHandover,
    TaskHolder,
    TaskStatus,
)
from smoothscale.kafka.progress import TaskProgress
from smoothscale.operator.handover import Ledger
from smoothscale.operator.observe import PodView
from smoothscale.tasks import TaskId, TaskRole


@dataclass(frozen=True)
class Problem:
    """Something that needs a person's attention: the Degraded condition's reason and message."""

    reason: str
    """CamelCase, e.g. InputTopicMissing."""
    message: str
    """What is wrong and what to do."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one poll knows that the status shows."""

    app: StreamingApp
    generation: int | None
    selector: str
    pods: Mapping[str, PodView]
    tasks: int | None
    """The task count, None while the topics could not be checked."""
    desired: int
    ledger: Ledger | None
    """None until the operator could read its memory (Kafka unreachable, topics missing)."""
    progress: Mapping[tuple[str, TaskId], TaskProgress] = field(default_factory=dict)
    draining_since: Mapping[str, datetime] = field(default_factory=dict)
    handover_started: Mapping[TaskId, datetime] = field(default_factory=dict)
    problems: Sequence[Problem] = ()
    last_scaling: ScalingSummary | None = None


def _condition(
    previous: StreamingAppStatus | None,
    type_: ConditionType,
    *,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> Condition:
    value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    before = previous.condition(type_) if previous is not None else None
    since = before.last_transition_time if before is not None and before.status == value else now
    return Condition(
        type=type_.value,
        status=value,
        observed_generation=generation,
        last_transition_time=since,
        reason=reason,
        message=message[:32768],
    )


def _input_lag(progress: TaskProgress | None, now: datetime) -> tuple[int | None, float | None]:
    """(records, seconds) an active owner's report shows its task behind its input."""
    if progress is None or progress.input_lag is None:
        return None, None
    if progress.input_lag == 0:
        return 0, 0.0
    newest = progress.report.input_time
    seconds = None if newest is None else round(max(0.0, now.timestamp() - newest), 3)
    return progress.input_lag, seconds


def _task_statuses(snapshot: Snapshot, now: datetime) -> list[TaskStatus]:
    ledger = snapshot.ledger
    if ledger is None or snapshot.tasks is None:
        return []
    statuses = []
    for task in range(snapshot.tasks):
        owner = ledger.ownership(task)
        holders = []
        input_lag: tuple[int | None, float | None] = (None, None)
        for instance, assignment in sorted(ledger.assignments.items()):
            held = assignment.tasks.get(task)
            if held is None:
                continue
            progress = snapshot.progress.get((instance, task))
            lag = None if progress is None or held.role is TaskRole.ACTIVE else progress.lag
            holders.append(TaskHolder(instance=instance, role=held.role, lag=lag))
            if held.role is TaskRole.ACTIVE:
                input_lag = _input_lag(progress, now)
        handover = None
        if owner.handover is not None:
            handover = TaskHandover(
                from_instance=owner.handover.source,
                to_instance=owner.handover.destination or owner.handover.source,
                started=snapshot.handover_started.get(task),
            )
        statuses.append(
            TaskStatus(
                task=task,
                epoch=owner.epoch,
                holders=holders,
                handover=handover,
                input_lag=input_lag[0],
                input_lag_seconds=input_lag[1],
            )
        )
    return statuses


def _instances(snapshot: Snapshot) -> list[InstanceSummary]:
    ledger = snapshot.ledger
    summaries = []
    for name, pod in sorted(snapshot.pods.items()):
        if pod.terminating:
            continue
        assignment = ledger.assignments.get(name) if ledger is not None else None
        roles = [held.role for held in assignment.tasks.values()] if assignment else []
        summaries.append(
            InstanceSummary(
                name=name,
                uid=pod.uid or None,
                ready=pod.ready,
                draining=name in snapshot.draining_since,
                draining_since=snapshot.draining_since.get(name),
                active_tasks=roles.count(TaskRole.ACTIVE),
                warmup_tasks=roles.count(TaskRole.WARMUP),
                standby_tasks=roles.count(TaskRole.STANDBY),
            )
        )
    return summaries


def busy(ledger: Ledger) -> bool:
    """Whether a warm-up, a hand-over or a release is under way."""
    return any(o.handover is not None for o in ledger.tasks.values()) or any(
        a.tasks_in(TaskRole.WARMUP) for a in ledger.assignments.values()
    )


def app_status(
    snapshot: Snapshot, previous: StreamingAppStatus | None, now: datetime
) -> StreamingAppStatus:
    """The status for this poll."""
    generation = snapshot.generation
    instances = _instances(snapshot)
    tasks = _task_statuses(snapshot, now)
    ledger = snapshot.ledger
    unowned = [t.task for t in tasks if t.active is None and t.handover is None]
    moving = [t.task for t in tasks if t.handover is not None]
    warming = [t.task for t in tasks if t.holders_in(TaskRole.WARMUP)]
    draining = [i.name for i in instances if i.draining]
    starting = [i.name for i in instances if not i.ready]
    lags = [h.lag for t in tasks for h in t.holders if h.lag is not None]
    input_lags = [t.input_lag for t in tasks if t.input_lag is not None]
    input_seconds = [t.input_lag_seconds for t in tasks if t.input_lag_seconds is not None]

    problems = list(snapshot.problems)
    degraded = _condition(
        previous,
        ConditionType.DEGRADED,
        status=bool(problems),
        reason=problems[0].reason if problems else "AsExpected",
        message="; ".join(p.message for p in problems) if problems else "Nothing needs attention.",
        generation=generation,
        now=now,
    )

    if snapshot.tasks is None or ledger is None:
        ready = (False, "NotObserved", "The app's Kafka topics could not be checked yet.")
    elif snapshot.desired == 0:
        ready = (False, "ScaledToZero", "spec.replicas is 0: every task is stopped, state kept.")
    elif unowned:
        ready = (False, "TasksWithoutOwner", f"Tasks {unowned} have no active owner yet.")
    else:
        ready = (True, "AllTasksActive", f"All {snapshot.tasks} tasks have an active owner.")
    ready_condition = _condition(
        previous,
        ConditionType.READY,
        status=ready[0],
        reason=ready[1],
        message=ready[2],
        generation=generation,
        now=now,
    )

    if moving:
        progressing = (True, "HandingOver", f"Tasks {moving} are moving to a new owner.")
    elif warming:
        progressing = (True, "WarmingUp", f"Tasks {warming} are warming up on new owners.")
    elif draining:
        progressing = (True, "Draining", f"Instances {draining} are being drained.")
    elif starting or len(instances) != snapshot.desired:
        progressing = (
            True,
            "StartingInstances",
            f"{len(instances) - len(starting)} of {snapshot.desired} instances are ready.",
        )
    else:
        progressing = (False, "Settled", "Every task is where the plan wants it.")
    progressing_condition = _condition(
        previous,
        ConditionType.PROGRESSING,
        status=progressing[0],
        reason=progressing[1],
        message=progressing[2],
        generation=generation,
        now=now,
    )

    if problems:
        phase = Phase.DEGRADED
    elif progressing[0]:
        phase = Phase.SCALING if instances else Phase.PENDING
    elif ready[0]:
        phase = Phase.RUNNING
    else:
        phase = Phase.PENDING

    return StreamingAppStatus(
        observed_generation=generation,
        phase=phase,
        replicas=len(instances),
        ready_replicas=sum(1 for i in instances if i.ready),
        active_replicas=sum(1 for i in instances if i.active_tasks),
        warmup_replicas=sum(1 for i in instances if i.warmup_tasks),
        selector=snapshot.selector,
        desired_replicas=snapshot.desired,
        tasks_total=snapshot.tasks,
        max_lag=max(lags) if lags else None,
        input_lag=sum(input_lags) if input_lags else None,
        input_lag_seconds=max(input_seconds) if input_seconds else None,
        assignment_generation=ledger.generation if ledger is not None else 0,
        tasks=tasks,
        instances=instances,
        last_scaling=snapshot.last_scaling,
        conditions=[ready_condition, progressing_condition, degraded],
    )
