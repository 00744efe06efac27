"""The operator's side of the hand-over protocol: from a plan to the assignments to write.

The planner says where tasks should be; this module says what to tell each instance *now* so
that they get there without a task ever having two active owners (docs/architecture.md, "The
hand-over"). It is pure: no I/O, no clock. Each lag poll the operator calls `step()` with the
ledger it kept from the last poll and what it observed, writes the assignments it returns, and
keeps the new ledger (in the StreamingApp status, so a restarted operator resumes mid-hand-over).

A hand-over of task t from S to D runs over several polls:
1. The plan moves t's active to D (D is caught up). `step()` writes S an assignment without t
   and records the hand-over in the ledger. D keeps restoring t as a warm-up or standby.
2. S finishes its micro-batch, commits, and reports t `released` with its final changelog
   positions.
3. `step()` sees the release and writes D the task as active, with the next epoch and
   `restoreUntil` = those positions. D restores up to them and starts processing.
Once begun, a hand-over is finished, never undone: S may already have let the task go. The
planner therefore sees the task as owned by D from step 1 on, so it plans around it. And a
hand-over begins only once S has reported the task active at its current epoch: an instance
applies only the newest assignment it finds, so one made owner and then, a poll later, asked
to give the task back may never have seen that it owned it, and could not release it.
If S dies before it releases, D takes the task at once (a failover: the epoch marker D writes
fences anything S might still write). If D dies first, the operator still waits for S's release
(S may be mid-batch), then the task fails over to the most caught-up live instance, which is
usually S itself.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from smoothscale.kafka.assignments import Assignment, TaskAssignment
from smoothscale.kafka.progress import ReportedRole, TaskProgress
from smoothscale.planner.assignor import plan
from smoothscale.planner.model import ClusterState, Instance, InstanceId, Plan, PlannerConfig
from smoothscale.tasks import TaskId, TaskRole


@dataclass(frozen=True)
class HandOver:
    """A hand-over under way: the source has been told to release, the destination waits."""

    source: InstanceId
    destination: InstanceId | None
    """None once the destination is gone: the task then fails over after the release."""


@dataclass(frozen=True)
class Ownership:
    """What the operator has decided about one task."""

    epoch: int = 0
    """Bumped every time the task gets a new active owner."""
    active: InstanceId | None = None
    """The instance told to hold the task active; None while nobody is (or during a hand-over)."""
    handover: HandOver | None = None
    restore_until: Mapping[str, int] | None = None
    """The previous owner's final changelog positions per store, when it released the task:
    the active restores at least up to them before it processes anything."""


@dataclass(frozen=True)
class Ledger:
    """The operator's memory between polls: every task's ownership and what it last wrote."""

    generation: int = 0
    """The generation of the newest assignments written."""
    tasks: Mapping[TaskId, Ownership] = field(default_factory=dict)
    assignments: Mapping[InstanceId, Assignment] = field(default_factory=dict)
    """The assignment last written to each live instance."""

    def ownership(self, task: TaskId) -> Ownership:
        return self.tasks.get(task, Ownership())


@dataclass(frozen=True)
class InstanceStatus:
    """One live instance as observed at this poll."""

    ready: bool = True
    draining: bool = False
    """Being removed by a scale-in."""
    force_release: bool = False
    """Its drain timeout has passed: its actives may move to instances not yet caught up."""


@dataclass(frozen=True)
class Observation:
    """What the operator saw at this poll."""

    instances: Mapping[InstanceId, InstanceStatus]
    """The live instances; an instance absent here is gone."""
    progress: Mapping[tuple[InstanceId, TaskId], TaskProgress]
    """Each instance's latest report per task, with its changelog lag."""


@dataclass(frozen=True)
class Step:
    """The outcome of one poll."""

    ledger: Ledger
    plan: Plan
    writes: Mapping[InstanceId, Assignment]
    """The assignments to write now (only those that changed), all of `ledger.generation`."""
    forget: tuple[InstanceId, ...]
    """Instances that are gone: their assignment records are to be deleted (tombstoned)."""
    drained: tuple[InstanceId, ...]
    """Draining instances that hold nothing and owe no release: safe to delete now."""
    events: tuple[str, ...]
    """What happened, one sentence each, for Events and logs."""


def step(ledger: Ledger, observed: Observation, tasks: int, config: PlannerConfig) -> Step:
    """Advance every task one safe step towards the plan for what was observed."""
    events: list[str] = []
    live = observed.instances
    owners = {t: _survive(ledger.ownership(t), t, live, events) for t in range(tasks)}
    owners = {t: _finish_release(o, t, observed, events) for t, o in owners.items()}

    the_plan = plan(_cluster_state(ledger, owners, observed, tasks, config))
    desired = the_plan.assignment
    for task in range(tasks):
        owners[task] = _follow_plan(owners[task], task, desired, observed, events)

    assignments = {
        instance: _assignment_for(instance, owners, desired) for instance in sorted(live)
    }
    changed = {
        instance: held
        for instance, held in assignments.items()
        if ledger.assignments.get(instance) is None or ledger.assignments[instance].tasks != held
    }
    generation = ledger.generation + 1 if changed else ledger.generation
    writes = {
        instance: Assignment(generation=generation, tasks=held)
        for instance, held in changed.items()
    }
    written = {
        instance: writes.get(instance) or ledger.assignments[instance] for instance in assignments
    }
    drained = tuple(
        instance
        for instance, status in sorted(live.items())
        if status.draining
        and not assignments[instance]
        and not any(o.handover and o.handover.source == instance for o in owners.values())
    )
    return Step(
        ledger=Ledger(generation=generation, tasks=owners, assignments=written),
        plan=the_plan,
        writes=writes,
        forget=tuple(sorted(set(ledger.assignments) - set(live))),
        drained=drained,
        events=tuple(events),
    )


def _survive(
    owner: Ownership, task: TaskId, live: Mapping[InstanceId, InstanceStatus], events: list[str]
) -> Ownership:
    """The ownership of `task` once the instances that are gone are taken out of it."""
    handover = owner.handover
    if handover is not None:
        if handover.source not in live:
            if handover.destination is None:
                events.append(f"task {task}: {handover.source} is gone before releasing it")
                return Ownership(epoch=owner.epoch)
            events.append(
                f"task {task}: {handover.source} is gone before releasing it; "
                f"{handover.destination} takes it over at once (epoch {owner.epoch + 1})"
            )
            return Ownership(epoch=owner.epoch + 1, active=handover.destination)
        if handover.destination is not None and handover.destination not in live:
            events.append(
                f"task {task}: {handover.destination} is gone; the task fails over once "
                f"{handover.source} has released it"
            )
            return replace(owner, handover=HandOver(handover.source, None))
    if owner.active is not None and owner.active not in live:
        events.append(f"task {task}: active owner {owner.active} is gone")
        return replace(owner, active=None)
    return owner


def _finish_release(
    owner: Ownership, task: TaskId, observed: Observation, events: list[str]
) -> Ownership:
    """Complete a hand-over whose source has reported the task released."""
    handover = owner.handover
    if handover is None:
        return owner
    report = observed.progress.get((handover.source, task))
    if report is None or report.report.role is not ReportedRole.RELEASED:
        return owner
    if report.report.epoch < owner.epoch:
        return owner  # a release from an earlier ownership; wait for this one's
    positions = dict(report.report.positions)
    if handover.destination is None:
        events.append(f"task {task}: {handover.source} released it at {positions}")
        return Ownership(epoch=owner.epoch, restore_until=positions)
    events.append(
        f"task {task}: {handover.source} released it at {positions}; "
        f"{handover.destination} is now active (epoch {owner.epoch + 1})"
    )
    return Ownership(epoch=owner.epoch + 1, active=handover.destination, restore_until=positions)


def _cluster_state(
    ledger: Ledger,
    owners: Mapping[TaskId, Ownership],
    observed: Observation,
    tasks: int,
    config: PlannerConfig,
) -> ClusterState:
    """The planner's view: decided owners are active (hand-overs count as done), the rest of
    each instance's roles as last written, and the lags as reported."""
    instances = []
    for instance, status in sorted(observed.instances.items()):
        roles: dict[TaskId, TaskRole] = {}
        written = ledger.assignments.get(instance)
        if written is not None:
            for task, held in written.tasks.items():
                if held.role is not TaskRole.ACTIVE and task < tasks:
                    roles[task] = held.role
        for task, owner in owners.items():
            if _decided_owner(owner) == instance:
                roles[task] = TaskRole.ACTIVE
        lags = {
            task: progress.lag
            for (reporter, task), progress in observed.progress.items()
            if reporter == instance and task < tasks
        }
        instances.append(
            Instance(
                id=instance,
                ready=status.ready,
                draining=status.draining,
                force_release=status.force_release,
                roles=roles,
                lags=lags,
            )
        )
    return ClusterState(tasks=list(range(tasks)), instances=instances, config=config)


def _decided_owner(owner: Ownership) -> InstanceId | None:
    return owner.handover.destination if owner.handover is not None else owner.active


def _follow_plan(
    owner: Ownership,
    task: TaskId,
    desired: Mapping[InstanceId, Mapping[TaskId, TaskRole]],
    observed: Observation,
    events: list[str],
) -> Ownership:
    """The ownership of `task` after the plan's move for it, if any, has been started."""
    if owner.handover is not None:
        return owner  # under way: finished by a release or a death, never undone
    planned = next(
        (i for i, roles in sorted(desired.items()) if roles.get(task) is TaskRole.ACTIVE), None
    )
    if planned == owner.active:
        return owner
    if owner.active is not None and not _confirmed(owner, task, observed):
        # Its owner has not reported it active yet: it may never have seen the assignment
        # that made it the owner, and could then neither process nor release the task.
        return owner
    if planned is None:
        if owner.active is None:
            return owner
        # Nothing is kept (scale to zero): the owner lets the task go and nobody takes it.
        events.append(f"task {task}: no instance is kept; waiting for {owner.active} to release it")
        return Ownership(epoch=owner.epoch, handover=HandOver(owner.active, None))
    if owner.active is None:
        events.append(f"task {task}: {planned} takes it over at once (epoch {owner.epoch + 1})")
        return Ownership(epoch=owner.epoch + 1, active=planned, restore_until=owner.restore_until)
    progress = observed.progress.get((planned, task))
    lag = "unknown" if progress is None else str(progress.lag)
    events.append(
        f"task {task}: handing over from {owner.active} to {planned} (lag {lag}); "
        f"waiting for {owner.active} to release it"
    )
    return Ownership(epoch=owner.epoch, handover=HandOver(owner.active, planned))


def _confirmed(owner: Ownership, task: TaskId, observed: Observation) -> bool:
    """Whether the active owner has reported holding `task` active at the current epoch."""
    progress = observed.progress.get((owner.active, task)) if owner.active else None
    return (
        progress is not None
        and progress.report.role is ReportedRole.ACTIVE
        and progress.report.epoch >= owner.epoch
    )


def _assignment_for(
    instance: InstanceId,
    owners: Mapping[TaskId, Ownership],
    desired: Mapping[InstanceId, Mapping[TaskId, TaskRole]],
) -> dict[TaskId, TaskAssignment]:
    """What `instance` is to hold, as the protocol allows it at this point: its actives are
    what the ownership says (never what the plan wishes: a move waits for its protocol step),
    the plan adds the replicas."""
    held: dict[TaskId, TaskAssignment] = {}
    for task, owner in owners.items():
        if owner.active == instance:
            restore_until = None if owner.restore_until is None else dict(owner.restore_until)
            held[task] = TaskAssignment(
                role=TaskRole.ACTIVE, epoch=owner.epoch, restoreUntil=restore_until
            )
    for task, role in sorted(desired.get(instance, {}).items()):
        owner = owners[task]
        if task in held or (owner.handover is not None and owner.handover.source == instance):
            # A source gets no other role for the task before it has released it.
            continue
        # The plan's active-to-be keeps restoring until the protocol makes it the owner.
        replica = TaskRole.WARMUP if role is TaskRole.ACTIVE else role
        held[task] = TaskAssignment(role=replica, epoch=owner.epoch)
    return dict(sorted(held.items()))
