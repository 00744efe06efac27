"""The operator's side of the hand-over protocol: from a plan to the assignments to write.

The planner says where tasks should be; this module says what to tell each instance *now* so
that they get there without a task ever having two active owners (docs/architecture.md, "The
hand-over"). It is pure: no I/O, no clock. Each lag poll the operator calls `step()` with the
ledger it kept from the last poll and what it observed, writes the assignments it returns, and
keeps the new ledger (in Kafka before the assignments, then in the StreamingApp status; see
smoothscale.operator.ledger), so a restarted operator resumes mid-hand-over.

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

Only fresh, matching reports count. A report whose generation is below the first one written to
its instance comes from an earlier pod of the same name (its disk is gone); a lag counts only
when the report's role and epoch are the ones last given to that instance for the task; a
release counts only at the hand-over's own epoch. Epochs never go backwards: a report showing
a higher epoch than the ledger's raises it, and an owner that reports the task `refused` or
`fenced` (the changelog holds a newer epoch) does not hold it, so the task fails over above
that epoch at once.
"""

from collections.abc import Container, Mapping
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
    joined: Mapping[InstanceId, int] = field(default_factory=dict)
    """Per live instance, the generation of the first assignment written to it: its reports
    from below it were made by an earlier pod of the same name, whose state is gone."""

    def ownership(self, task: TaskId) -> Ownership:
        return self.tasks.get(task, Ownership())

    def tasks_count(self) -> int | None:
        """The number of tasks this ledger was decided over (None: none yet)."""
        return max(self.tasks) + 1 if self.tasks else None


def forget(ledger: Ledger, instance: InstanceId) -> tuple[Ledger, tuple[str, ...]]:
    """The ledger once `instance`'s pod has been replaced (same name, new uid), and why.

    The old pod is gone with its disk: its tasks are taken from it as if the instance had died,
    and the new pod is a new instance, given its first assignment at the next `step()`, from
    which on its reports count."""
    events: list[str] = []
    gone = {instance}
    tasks = {
        task: _survive(owner, task, _Without(gone), events) for task, owner in ledger.tasks.items()
    }
    return (
        replace(
            ledger,
            tasks=tasks,
            assignments={i: a for i, a in ledger.assignments.items() if i != instance},
            joined={i: g for i, g in ledger.joined.items() if i != instance},
        ),
        tuple(events),
    )


@dataclass(frozen=True)
class _Without(Container[InstanceId]):
    """Every instance but the ones named: those replaced."""

    gone: Container[InstanceId]

    def __contains__(self, instance: object) -> bool:
        return instance not in self.gone


@dataclass(frozen=True)
class InstanceStatus:
    """One live instance as observed at this poll."""

    ready: bool = True
    uid: str | None = None
    """Its pod's uid: its assignments are meant for that pod alone."""
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
    fresh = _fresh_reports(ledger, observed)
    owners = {t: _survive(ledger.ownership(t), t, live, events) for t in range(tasks)}
    owners = {t: _drop_refused(o, t, fresh, events) for t, o in owners.items()}
    owners = {t: _drop_stalled(o, t, fresh, events) for t, o in owners.items()}
    owners = {t: _raise_epoch(o, t, fresh, events) for t, o in owners.items()}
    owners = {t: finish_release(o, t, fresh, events) for t, o in owners.items()}

    the_plan = plan(_cluster_state(ledger, owners, fresh, live, config))
    desired = the_plan.assignment
    for task in range(tasks):
        owners[task] = _follow_plan(owners[task], task, desired, fresh, events)

    assignments = {
        instance: _assignment_for(instance, owners, desired) for instance in sorted(live)
    }
    changed = {
        instance: held
        for instance, held in assignments.items()
        if (last := ledger.assignments.get(instance)) is None
        or last.tasks != held
        or last.uid != live[instance].uid
    }
    generation = ledger.generation + 1 if changed else ledger.generation
    writes = {
        instance: Assignment(generation=generation, tasks=held, uid=live[instance].uid)
        for instance, held in changed.items()
    }
    written = {
        instance: writes.get(instance) or ledger.assignments[instance] for instance in assignments
    }
    joined = {instance: ledger.joined.get(instance, generation) for instance in written}
    drained = tuple(
        instance
        for instance, status in sorted(live.items())
        if status.draining
        and not assignments[instance]
        and not any(o.handover and o.handover.source == instance for o in owners.values())
    )
    return Step(
        ledger=Ledger(generation=generation, tasks=owners, assignments=written, joined=joined),
        plan=the_plan,
        writes=writes,
        forget=tuple(sorted(set(ledger.assignments) - set(live))),
        drained=drained,
        events=tuple(events),
    )


Reports = Mapping[tuple[InstanceId, TaskId], TaskProgress]


def current_pods_reports(
    reports: Reports, uids: Mapping[InstanceId, str | None]
) -> dict[tuple[InstanceId, TaskId], TaskProgress]:
    """The reports made by the pod each instance name stands for now (`uids`: its live pod's
    uid, or for a name with no live pod, the uid of the pod its last assignment was meant
    for). A report of another pod of the same name (a predecessor's, or a process that outlived
    its pod) says nothing about this one: it is left out. Reports without a uid (an instance
    of an older version) count as before."""
    return {
        (instance, task): progress
        for (instance, task), progress in reports.items()
        if not progress.report.uid
        or not uids.get(instance)
        or progress.report.uid == uids[instance]
    }


def _fresh_reports(ledger: Ledger, observed: Observation) -> Reports:
    """The reports made by the live instances' current pods: at or above the generation of the
    first assignment written to each (an instance never written to has no report yet)."""
    return {
        (instance, task): progress
        for (instance, task), progress in observed.progress.items()
        if instance in observed.instances
        and instance in ledger.joined
        and progress.report.generation >= ledger.joined[instance]
    }


def _survive(
    owner: Ownership, task: TaskId, live: Container[InstanceId], events: list[str]
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
        # A failover: the next owner restores to the changelog's end, never to the positions
        # of a release that came before the owner that died.
        return Ownership(epoch=owner.epoch)
    return owner


_NOT_HOLDING = (ReportedRole.REFUSED, ReportedRole.FENCED)


def _drop_refused(owner: Ownership, task: TaskId, fresh: Reports, events: list[str]) -> Ownership:
    """Take `task` from an owner that reports it does not hold it (refused or fenced at the
    current epoch): nobody processes it, so it fails over at once above the changelog's epoch."""
    holder = owner.handover.source if owner.handover is not None else owner.active
    progress = fresh.get((holder, task)) if holder is not None else None
    if (
        progress is None
        or progress.report.role not in _NOT_HOLDING
        or progress.report.epoch != owner.epoch
    ):
        return owner
    seen = max(owner.epoch, progress.report.seen_epoch or 0)
    events.append(
        f"task {task}: {holder} reports it {progress.report.role.value} (the changelog holds "
        f"epoch {seen}); it fails over at once above it (epoch {seen + 1})"
    )
    return Ownership(epoch=seen)


def _stalled(fresh: Reports) -> set[InstanceId]:
    """Instances that report themselves stalled (no micro-batch completing while input
    waits): they process nothing, so they are given no active task."""
    return {instance for (instance, _task), p in fresh.items() if p.report.stalled_for is not None}


def _drop_stalled(owner: Ownership, task: TaskId, fresh: Reports, events: list[str]) -> Ownership:
    """Take `task` from an owner that reports itself stalled: it processes nothing, and may
    never release (its micro-batch hangs). The task fails over at once, as from an owner that
    died: the new owner's epoch marker (and Kafka's fencing) keep whatever the stalled batch
    commits later from counting. A hand-over it was the source of goes to its destination."""
    holder = owner.handover.source if owner.handover is not None else owner.active
    progress = fresh.get((holder, task)) if holder is not None else None
    if progress is None or progress.report.stalled_for is None:
        return owner
    if progress.report.role is not ReportedRole.ACTIVE or progress.report.epoch != owner.epoch:
        return owner
    destination = owner.handover.destination if owner.handover is not None else None
    successor = destination or "the most caught-up instance"
    events.append(
        f"task {task}: {holder} has completed no micro-batch for "
        f"{progress.report.stalled_for:.0f} s while input waits; {successor} takes it over at "
        f"once (epoch {owner.epoch + 1})"
    )
    if destination is not None:
        return Ownership(epoch=owner.epoch + 1, active=destination)
    return Ownership(epoch=owner.epoch)


def _raise_epoch(owner: Ownership, task: TaskId, fresh: Reports, events: list[str]) -> Ownership:
    """Raise `task`'s epoch to the highest a live instance reports, so the next owner's epoch
    is above every epoch the changelog may hold (after a lost or older ledger).

    An owner given a lower epoch than the task has seen is fenced by the changelog: the task
    fails over. A hand-over in flight is left to finish first (its release is at its epoch)."""
    shown = max(
        (
            max(progress.report.epoch, progress.report.seen_epoch or 0)
            for (_instance, reported), progress in fresh.items()
            if reported == task
        ),
        default=0,
    )
    if shown <= owner.epoch or owner.handover is not None:
        return owner
    events.append(
        f"task {task}: a report shows epoch {shown}, above the {owner.epoch} recorded; "
        f"it fails over at once above it (epoch {shown + 1})"
    )
    return Ownership(epoch=shown)


def release_all(ledger: Ledger) -> Ledger:
    """The ledger of an app being deleted: every instance is given nothing (each releases its
    active tasks at a micro-batch boundary) and no task has an owner. Epochs stay: an app
    re-created under the same name goes on above them, from the changelogs."""
    generation = ledger.generation + 1
    return replace(
        ledger,
        generation=generation,
        tasks={task: Ownership(epoch=owner.epoch) for task, owner in ledger.tasks.items()},
        assignments={
            instance: Assignment(generation=generation, uid=held.uid)
            for instance, held in ledger.assignments.items()
        },
    )


def holds_nothing(ledger: Ledger) -> bool:
    """Whether no task has an owner and no instance is given anything (`release_all`)."""
    return all(owner == Ownership(epoch=owner.epoch) for owner in ledger.tasks.values()) and all(
        not assignment.tasks for assignment in ledger.assignments.values()
    )


def finish_release(owner: Ownership, task: TaskId, fresh: Reports, events: list[str]) -> Ownership:
    """Complete a hand-over whose source has reported the task released at its epoch (also
    used by the ledger's rebuild, so a release is acted on the same way after a restart)."""
    handover = owner.handover
    if handover is None:
        return owner
    report = fresh.get((handover.source, task))
    if report is None or report.report.role is not ReportedRole.RELEASED:
        return owner
    if report.report.epoch != owner.epoch:
        return owner  # a release from another ownership; wait for this one's
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
    fresh: Reports,
    live: Mapping[InstanceId, InstanceStatus],
    config: PlannerConfig,
) -> ClusterState:
    """The planner's view: decided owners are active (hand-overs count as done), the rest of
    each instance's roles as last written, and the lags of the reports that match them."""
    tasks = len(owners)
    stalled = _stalled(fresh)
    instances = []
    for instance, status in sorted(live.items()):
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
            for (reporter, task), progress in fresh.items()
            if reporter == instance and task < tasks and _matches(ledger, progress)
        }
        instances.append(
            Instance(
                id=instance,
                ready=status.ready and instance not in stalled,
                draining=status.draining,
                force_release=status.force_release,
                roles=roles,
                lags=lags,
            )
        )
    return ClusterState(tasks=list(range(tasks)), instances=instances, config=config)


def _matches(ledger: Ledger, progress: TaskProgress) -> bool:
    """Whether a report is about the role and epoch last given to its instance for its task
    (a task given active but not yet activated still reports `warmup`)."""
    written = ledger.assignments.get(progress.instance_id)
    given = written.tasks.get(progress.report.task) if written is not None else None
    if given is None or given.epoch != progress.report.epoch:
        return False
    reported = progress.report.role
    if given.role is TaskRole.ACTIVE:
        return reported in (ReportedRole.ACTIVE, ReportedRole.WARMUP)
    return reported.value == given.role.value


def _decided_owner(owner: Ownership) -> InstanceId | None:
    return owner.handover.destination if owner.handover is not None else owner.active


def _follow_plan(
    owner: Ownership,
    task: TaskId,
    desired: Mapping[InstanceId, Mapping[TaskId, TaskRole]],
    fresh: Reports,
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
    if owner.active is not None and not _confirmed(owner, task, fresh):
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
    progress = fresh.get((planned, task))
    lag = "unknown" if progress is None else str(progress.lag)
    events.append(
        f"task {task}: handing over from {owner.active} to {planned} (lag {lag}); "
        f"waiting for {owner.active} to release it"
    )
    return Ownership(epoch=owner.epoch, handover=HandOver(owner.active, planned))


def _confirmed(owner: Ownership, task: TaskId, fresh: Reports) -> bool:
    """Whether the active owner has reported holding `task` active at the current epoch."""
    progress = fresh.get((owner.active, task)) if owner.active else None
    return (
        progress is not None
        and progress.report.role is ReportedRole.ACTIVE
        and progress.report.epoch == owner.epoch
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
