"""plan(): the warm-up-aware task assignor (KIP-441 semantics plus smooth scale-in).

Pure and deterministic: the answer depends only on the ClusterState passed in (ties are broken
by task id and instance id, never by dict or hash order), so the operator can call it at every
lag poll, and again while moves are in flight, and get the same answer for the same facts.

One call works in four steps:
1. The balanced target: which kept instance each task should end on. Kept instances keep the
   actives they hold up to their share (sticky); the rest go first where a warm-up is already
   restoring them, then to a caught-up replica, then to the instances with room, in order.
2. Actives: a task whose owner is gone fails over at once to the most caught-up kept instance;
   a task off its target moves only when the target is ready and caught up (or when its
   draining owner's drain timeout has passed); otherwise its owner keeps it.
3. Warm-ups: at most max_warmup_replicas, only on the target of a task still to move; running
   warm-ups keep their slot, new ones are started round-robin over the target instances.
4. Standbys: num_standby_replicas per task on kept instances other than the active's, sticky,
   balanced across kept instances.
The moves are then the difference between the observed roles and that next assignment.
"""

import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from smoothscale.planner.model import (
    ClusterState,
    Instance,
    InstanceId,
    Move,
    MoveKind,
    Plan,
    PlannerConfig,
    TaskMoves,
)
from smoothscale.tasks import TaskId, TaskRole

_ROLE_RANK = {TaskRole.STANDBY: 0, TaskRole.WARMUP: 1}
"""Among caught-up replicas a task's balanced target may be, a standby before a warm-up."""


def plan(state: ClusterState) -> Plan:
    """The next assignment of `state`'s tasks and the moves that lead there."""
    view = _View.of(state)
    if not view.kept:
        return _stop_everything(view)
    target = _balanced_target(view)
    actives = _place_actives(view, target)
    warmups = _place_warmups(view, target, actives.owner)
    standbys = _place_standbys(view, target, actives.owner, warmups)
    return _assemble(view, target, actives, warmups, standbys)


@dataclass
class _View:
    """The observed state, validated and indexed for the lookups plan() makes."""

    config: PlannerConfig
    tasks: list[TaskId]
    instances: dict[InstanceId, Instance]
    kept: list[InstanceId]
    """Instances not being drained, in id order."""
    owner: dict[TaskId, InstanceId]
    """The observed active owner of each task that has one."""
    replicas: dict[TaskId, list[tuple[InstanceId, TaskRole]]]
    """The observed standby and warm-up holders of each task, in instance id order."""
    reported: dict[TaskId, list[InstanceId]]
    """The instances that reported a lag for each task, in instance id order."""

    @classmethod
    def of(cls, state: ClusterState) -> "_View":
        tasks = sorted(set(state.tasks))
        known = set(tasks)
        instances: dict[InstanceId, Instance] = {}
        for instance in state.instances:
            if not instance.id:
                raise ValueError("an instance has an empty id; name each instance by its pod")
            if instance.id in instances:
                raise ValueError(
                    f"instance {instance.id!r} is listed twice; list each instance once"
                )
            if instance.force_release and not instance.draining:
                raise ValueError(
                    f"instance {instance.id!r} has force_release set but is not draining; "
                    "force_release only lets a draining instance give its actives away"
                )
            instances[instance.id] = instance
        owner: dict[TaskId, InstanceId] = {}
        replicas: dict[TaskId, list[tuple[InstanceId, TaskRole]]] = {}
        reported: dict[TaskId, list[InstanceId]] = {}
        for instance_id in sorted(instances):
            instance = instances[instance_id]
            for task, role in sorted(instance.roles.items()):
                if task not in known:
                    raise ValueError(
                        f"instance {instance_id!r} holds task {task}, which is not a task of "
                        "the app; list it among the tasks or remove it from the instance"
                    )
                if role is TaskRole.ACTIVE:
                    if task in owner:
                        raise ValueError(
                            f"task {task} is active on both {owner[task]!r} and "
                            f"{instance_id!r}; a task has one active owner, keep one of them"
                        )
                    owner[task] = instance_id
                else:
                    replicas.setdefault(task, []).append((instance_id, role))
            for task, lag in sorted(instance.lags.items()):
                if task not in known:
                    raise ValueError(
                        f"instance {instance_id!r} reports a lag for task {task}, which is "
                        "not a task of the app"
                    )
                if lag < 0:
                    raise ValueError(
                        f"instance {instance_id!r} reports lag {lag} for task {task}; a lag "
                        "counts changelog records still to restore, so it is 0 or more"
                    )
                reported.setdefault(task, []).append(instance_id)
        kept = sorted(i for i, instance in instances.items() if not instance.draining)
        return cls(state.config, tasks, instances, kept, owner, replicas, reported)

    def lag(self, instance: InstanceId, task: TaskId) -> int | None:
        """How far `instance` is behind on `task`: 0 for its owner, None when unknown."""
        if self.owner.get(task) == instance:
            return 0
        return self.instances[instance].lags.get(task)

    def role(self, instance: InstanceId, task: TaskId) -> TaskRole | None:
        return self.instances[instance].roles.get(task)

    def caught_up(self, instance: InstanceId, task: TaskId) -> bool:
        lag = self.lag(instance, task)
        return lag is not None and lag <= self.config.acceptable_recovery_lag

    def is_kept(self, instance: InstanceId) -> bool:
        return not self.instances[instance].draining

    def describe(self, instance: InstanceId, task: TaskId) -> str:
        """`instance`'s standing on `task` for a reason: its role and lag."""
        lag = self.lag(instance, task)
        role = self.role(instance, task)
        held = {TaskRole.STANDBY: "standby", TaskRole.WARMUP: "warm-up"}.get(
            role or TaskRole.ACTIVE, "no replica"
        )
        if lag is None:
            return f"{held}, no state yet: restores the whole changelog"
        acceptable = self.config.acceptable_recovery_lag
        if lag <= acceptable:
            return f"{held}, caught up: lag {lag} <= {acceptable}"
        return f"{held}, behind: lag {lag} > {acceptable}"


@dataclass
class _Target:
    owner: dict[TaskId, InstanceId]
    share: dict[InstanceId, int]
    """How many actives each kept instance holds in the balanced target."""
    warming: set[TaskId]
    """Tasks whose target was chosen because a warm-up already restores them there."""


def _shares(
    instances: list[InstanceId],
    held: dict[InstanceId, int],
    total: int,
    limits: dict[InstanceId, int] | None = None,
) -> dict[InstanceId, int]:
    """Split `total` over `instances` as evenly as possible, moving as little as possible.

    An instance that can take at most limits[i] gets no more than that (water-filling: the
    others share the rest). The others get total // n, and total % n of them one more: first
    those already holding more than total // n (they keep one more without moving anything),
    then the others, each group in id order. Id order (not "who holds most") keeps the split
    stable while tasks drain off an instance, so a target never flips back and forth.
    """
    share: dict[InstanceId, int] = {}
    free = list(instances)
    remaining = total
    while limits is not None and free:
        base = remaining // len(free)
        capped = [i for i in free if limits[i] <= base]
        if not capped:
            break
        for instance in capped:
            share[instance] = limits[instance]
            remaining -= limits[instance]
        free = [i for i in free if limits[i] > base]
    if free:
        base, extra = divmod(remaining, len(free))
        ranked = [i for i in free if held[i] > base] + [i for i in free if held[i] <= base]
        for rank, instance in enumerate(ranked):
            share[instance] = base + (1 if rank < extra else 0)
    return share


def _balanced_target(view: _View) -> _Target:
    held: dict[InstanceId, list[TaskId]] = {instance: [] for instance in view.kept}
    pool: list[TaskId] = []
    for task in view.tasks:
        owner = view.owner.get(task)
        if owner is not None and view.is_kept(owner):
            held[owner].append(task)
        else:
            pool.append(task)
    share = _shares(view.kept, {i: len(tasks) for i, tasks in held.items()}, len(view.tasks))
    target: dict[TaskId, InstanceId] = {}
    room: dict[InstanceId, int] = {}
    for instance, tasks in held.items():
        for task in tasks[: share[instance]]:
            target[task] = instance
        pool.extend(tasks[share[instance] :])
        room[instance] = share[instance] - min(len(tasks), share[instance])
    pool.sort()

    # A warm-up already restoring a task keeps it: the planner put it there on purpose.
    after_warmups: list[TaskId] = []
    honoured: list[TaskId] = []
    for task in pool:
        warming = [
            instance
            for instance, role in view.replicas.get(task, ())
            if role is TaskRole.WARMUP and view.is_kept(instance) and room[instance] > 0
        ]
        if warming:
            chosen = min(warming, key=lambda i: (_lag_order(view.lag(i, task)), i))
            target[task] = chosen
            room[chosen] -= 1
            honoured.append(task)
        else:
            after_warmups.append(task)

    # Then a caught-up replica with room: the task can move there at once.
    to_fill: list[TaskId] = []
    for task in after_warmups:
        ready_replicas = [
            (_ROLE_RANK[role], instance)
            for instance, role in view.replicas.get(task, ())
            if view.is_kept(instance) and room[instance] > 0 and view.caught_up(instance, task)
        ]
        if ready_replicas:
            chosen = min(ready_replicas)[1]
            target[task] = chosen
            room[chosen] -= 1
        else:
            to_fill.append(task)

    # The rest fill the instances with room in id order: removing a task together with the
    # room it took leaves every other choice unchanged, so targets stay put across rounds.
    with_room = iter([instance for instance in view.kept for _ in range(room[instance])])
    for task in to_fill:
        target[task] = next(with_room)
    return _Target(target, share, set(honoured))


def _lag_order(lag: int | None) -> float:
    return math.inf if lag is None else lag


@dataclass
class _Actives:
    owner: dict[TaskId, InstanceId]
    """The active owner of every task after the moves."""
    failovers: dict[TaskId, str] = field(default_factory=dict)
    """Reason per task that failed over (it had no live owner)."""
    hand_overs: dict[TaskId, str] = field(default_factory=dict)
    """Reason per task handed over from its observed owner."""


def _place_actives(view: _View, target: _Target) -> _Actives:
    acceptable = view.config.acceptable_recovery_lag
    first_ready = next((i for i in view.kept if view.instances[i].ready), None)
    actives = _Actives(owner={})
    for task in view.tasks:
        goal = target.owner[task]
        owner = view.owner.get(task)
        if owner is None:
            chosen = _most_caught_up(view, task, goal, first_ready)
            actives.owner[task] = chosen
            actives.failovers[task] = (
                f"no live instance holds task {task} active; {chosen} is the most caught-up "
                f"kept instance ({view.describe(chosen, task)})"
            )
            continue
        actives.owner[task] = owner
        if owner == goal:
            continue
        why = (
            f"{owner} is draining"
            if not view.is_kept(owner)
            else f"{owner} holds more than its balanced share of {target.share[owner]} actives"
        )
        lag = view.lag(goal, task)
        moves = view.config.moves
        if moves is TaskMoves.AT_ONCE:
            actives.owner[task] = goal
            actives.hand_overs[task] = (
                f"stop-the-world: {why}, {goal} is the balanced target; it restores the task's "
                "state before it processes it"
            )
        elif view.instances[goal].ready and moves is TaskMoves.WHEN_READY:
            actives.owner[task] = goal
            actives.hand_overs[task] = (
                f"no warm-ups (Cooperative): {why}, {goal} is the balanced target and ready; "
                "it restores the task's state before it processes it"
            )
        elif view.instances[goal].ready and lag is not None and lag <= acceptable:
            replica = "standby" if view.role(goal, task) is TaskRole.STANDBY else "warm-up"
            actives.owner[task] = goal
            actives.hand_overs[task] = (
                f"{replica} caught up: lag {lag} <= {acceptable}; {why}, {goal} is the "
                "balanced target"
            )
        elif view.instances[owner].force_release:
            chosen = _most_caught_up(view, task, goal, first_ready)
            actives.owner[task] = chosen
            actives.hand_overs[task] = (
                f"{owner} is draining and its drain timeout has passed (forceRelease): moving "
                f"to {chosen}, the most caught-up kept instance ({view.describe(chosen, task)}), "
                "without waiting for a caught-up replica"
            )
    return actives


def _most_caught_up(
    view: _View, task: TaskId, goal: InstanceId, first_ready: InstanceId | None
) -> InstanceId:
    """The kept instance best placed to take `task` over now.

    Ready instances first. Among those, any caught-up one (the balanced target first, then by
    id: all of them can take over now, and the target saves a later move); then the smallest
    known lag (the target, then by id, on a tie); instances that have no state for the task
    last (the target first, then by id). A standby and a warm-up of the same lag are as good:
    ranking them would let a re-plan, once the plan has turned the warm-up into a standby,
    pick another instance for the same task.
    """
    acceptable = view.config.acceptable_recovery_lag
    candidates = {goal, view.kept[0]}
    if first_ready is not None:
        candidates.add(first_ready)
    candidates.update(i for i, _ in view.replicas.get(task, ()))
    candidates.update(view.reported.get(task, ()))

    def rank(instance: InstanceId) -> tuple[int, int, int, int, InstanceId]:
        not_ready = 0 if view.instances[instance].ready else 1
        lag = view.lag(instance, task)
        not_goal = 0 if instance == goal else 1
        if lag is None:  # no state: a replica only just started is no better than none
            return (not_ready, 2, 0, not_goal, instance)
        if lag <= acceptable:
            return (not_ready, 0, 0, not_goal, instance)
        return (not_ready, 1, lag, not_goal, instance)

    return min((i for i in candidates if view.is_kept(i)), key=rank)


def _place_warmups(
    view: _View, target: _Target, owner: dict[TaskId, InstanceId]
) -> dict[TaskId, InstanceId]:
    """Warm-ups to hold after the moves, by task: only on targets of tasks still to move, and
    only when tasks move once caught up."""
    if view.config.moves is not TaskMoves.WHEN_CAUGHT_UP:
        return {}
    running: list[TaskId] = []
    waiting: dict[InstanceId, list[TaskId]] = {}
    for task in view.tasks:
        goal = target.owner[task]
        if owner[task] == goal:
            continue
        role = view.role(goal, task)
        if role is TaskRole.WARMUP:
            running.append(task)
        elif role is None:
            waiting.setdefault(goal, []).append(task)
        # A standby on the target already restores the task: it is the replacement.
    budget = view.config.max_warmup_replicas
    running.sort(key=lambda task: (task not in target.warming, task))
    chosen = running[:budget]
    # Round-robin over target instances, so the restore load spreads over them.
    queue = sorted(
        (rank, goal, task)
        for goal, tasks in waiting.items()
        for rank, task in enumerate(tasks)
        if rank < budget
    )
    chosen.extend(task for _, _, task in queue[: budget - len(chosen)])
    return {task: target.owner[task] for task in sorted(chosen)}


@dataclass
class _Standbys:
    holders: dict[TaskId, list[InstanceId]]
    wanted: dict[TaskId, int]


def _place_standbys(
    view: _View,
    target: _Target,
    owner: dict[TaskId, InstanceId],
    warmups: dict[TaskId, InstanceId],
) -> _Standbys:
    """Standbys to hold after the moves, by task."""
    return _StandbyPlacement(view, target, owner, warmups).place()


class _StandbyPlacement:
    """numStandbyReplicas per task on kept instances, sticky and balanced.

    A standby never sits on the task's active, nor on its warm-up, nor newly on the target of
    a task still to move (that would be a warm-up outside the warm-up limit). A standby already
    on such a target is the task's replacement: it stays until the hand-over even beyond
    numStandbyReplicas, as dropping it would throw away the state the move waits for.
    """

    def __init__(
        self,
        view: _View,
        target: _Target,
        owner: dict[TaskId, InstanceId],
        warmups: dict[TaskId, InstanceId],
    ) -> None:
        self.view = view
        self.target = target
        self.owner = owner
        self.excluded: dict[TaskId, set[InstanceId]] = {}
        self.wanted: dict[TaskId, int] = {}
        per_task = view.config.num_standby_replicas
        for task in view.tasks:
            goal = target.owner[task]
            moving = goal != owner[task]
            replacement = moving and view.role(goal, task) is TaskRole.STANDBY
            out = {owner[task]}
            if task in warmups:
                out.add(warmups[task])
            if moving and not replacement:
                out.add(goal)
            self.excluded[task] = out
            eligible = len(view.kept) - sum(1 for i in out if view.is_kept(i))
            self.wanted[task] = max(min(per_task, eligible), 1 if replacement else 0)
        may_keep = dict.fromkeys(view.kept, 0)
        for task in view.tasks:
            for instance in self._existing(task):
                may_keep[instance] += 1
        eligible_tasks = dict.fromkeys(view.kept, len(view.tasks))
        for out in self.excluded.values():
            for instance in out:
                if instance in eligible_tasks:
                    eligible_tasks[instance] -= 1
        self.share = _shares(view.kept, may_keep, sum(self.wanted.values()), eligible_tasks)
        self.holders: dict[TaskId, list[InstanceId]] = {task: [] for task in view.tasks}
        self.placed: dict[InstanceId, list[TaskId]] = {i: [] for i in view.kept}
        self.count = dict.fromkeys(view.kept, 0)
        self.by_room: list[tuple[int, InstanceId]] = []
        """Kept instances by room left (count - share: most room first); entries whose
        count changed since are stale and skipped."""

    def _existing(self, task: TaskId) -> list[InstanceId]:
        """The observed standbys of `task` that may stay, its replacement first."""
        goal = self.target.owner[task]
        existing = [
            instance
            for instance, role in self.view.replicas.get(task, ())
            if role is TaskRole.STANDBY
            and self.view.is_kept(instance)
            and instance not in self.excluded[task]
        ]
        return sorted(existing, key=lambda i: (i != goal, i))

    def place(self) -> _Standbys:
        # Replacements first: each stays whatever its instance's share, so the sticky
        # standbys beside it are kept or moved the same way whichever task ids they have;
        # otherwise a re-plan after the moves could shift a different standby than the plan.
        existing = [
            (task, instance) for task in self.view.tasks for instance in self._existing(task)
        ]
        for task, instance in sorted(
            existing, key=lambda pair: pair[1] != self.target.owner[pair[0]]
        ):
            if len(self.holders[task]) < self.wanted[task] and (
                instance == self.target.owner[task] or self._has_room(instance)
            ):
                self._take(task, instance)
        self.by_room = [(self.count[i] - self.share[i], i) for i in self.view.kept]
        heapq.heapify(self.by_room)
        for task in self.view.tasks:
            while len(self.holders[task]) < self.wanted[task]:
                unavailable = self.excluded[task].union(self.holders[task])
                chosen = (
                    self._with_state(task, unavailable)
                    or self._most_room(unavailable)
                    or self._make_room(unavailable)
                    or min(
                        (i for i in self.view.kept if i not in unavailable),
                        key=lambda i: (self.count[i], i),
                    )
                )
                self._take(task, chosen)
        return _Standbys(self.holders, self.wanted)

    def _take(self, task: TaskId, instance: InstanceId) -> None:
        self.holders[task].append(instance)
        self.placed[instance].append(task)
        self.count[instance] += 1
        self._requeue(instance)

    def _requeue(self, instance: InstanceId) -> None:
        heapq.heappush(self.by_room, (self.count[instance] - self.share[instance], instance))

    def _has_room(self, instance: InstanceId) -> bool:
        return self.count[instance] < self.share[instance]

    def _with_state(self, task: TaskId, unavailable: set[InstanceId]) -> InstanceId | None:
        """The kept instance with room that is least behind on `task` (the former owner, a
        warm-up no longer needed there), if one has state for it."""
        candidates = list(self.view.reported.get(task, ()))
        former = self.view.owner.get(task)
        if former is not None and former != self.owner[task]:
            candidates.append(former)
        usable = [
            i
            for i in candidates
            if self.view.is_kept(i) and i not in unavailable and self._has_room(i)
        ]
        if not usable:
            return None
        return min(usable, key=lambda i: (_lag_order(self.view.lag(i, task)), i))

    def _most_room(self, unavailable: set[InstanceId]) -> InstanceId | None:
        """The instance with the most room that may take the task; None if none has room."""
        skipped: list[tuple[int, InstanceId]] = []
        found: InstanceId | None = None
        while self.by_room:
            entry = heapq.heappop(self.by_room)
            room, instance = entry
            if room != self.count[instance] - self.share[instance]:
                continue  # stale
            if room >= 0:
                skipped.append(entry)
                break
            if instance in unavailable:
                skipped.append(entry)
                continue
            found = instance
            break
        for entry in skipped:
            heapq.heappush(self.by_room, entry)
        return found

    def _make_room(self, unavailable: set[InstanceId]) -> InstanceId | None:
        """Free a slot the task may use by shifting other tasks' standbys along a chain
        x0 -> x1 -> ... -> r that ends on an instance r with room (an augmenting path, found
        breadth-first in id order): every instance the task may use is full, but one of them
        can pass a standby on. Returns x0, or None when no chain exists."""
        sources = [i for i in self.view.kept if i not in unavailable]
        came_from: dict[InstanceId, tuple[InstanceId, TaskId] | None] = dict.fromkeys(sources)
        queue = deque(sources)
        while queue:
            instance = queue.popleft()
            for other in self.placed[instance]:
                if instance == self.target.owner[other] != self.owner[other]:
                    continue  # a replacement stays where it is
                for spot in self.view.kept:
                    if (
                        spot in came_from
                        or spot in self.excluded[other]
                        or spot in self.holders[other]
                    ):
                        continue
                    came_from[spot] = (instance, other)
                    if self._has_room(spot):
                        return self._shift_along(spot, came_from)
                    queue.append(spot)
        return None

    def _shift_along(
        self,
        end: InstanceId,
        came_from: dict[InstanceId, tuple[InstanceId, TaskId] | None],
    ) -> InstanceId:
        """Move each standby of the chain one step towards `end`; return the freed start."""
        spot = end
        step = came_from[spot]
        while step is not None:
            instance, other = step
            self.holders[other].remove(instance)
            self.placed[instance].remove(other)
            self.count[instance] -= 1
            self._take(other, spot)
            spot = instance
            step = came_from[spot]
        return spot


def _assemble(
    view: _View,
    target: _Target,
    actives: _Actives,
    warmups: dict[TaskId, InstanceId],
    standbys: _Standbys,
) -> Plan:
    assignment: dict[InstanceId, dict[TaskId, TaskRole]] = {i: {} for i in sorted(view.instances)}
    for task in view.tasks:
        assignment[actives.owner[task]][task] = TaskRole.ACTIVE
        for instance in standbys.holders[task]:
            assignment[instance][task] = TaskRole.STANDBY
        if task in warmups:
            assignment[warmups[task]][task] = TaskRole.WARMUP
    assignment = {i: dict(sorted(roles.items())) for i, roles in assignment.items()}

    moves: list[Move] = []
    for task, reason in actives.failovers.items():
        moves.append(Move(MoveKind.FAILOVER, task, None, actives.owner[task], reason))
    for task, reason in actives.hand_overs.items():
        moves.append(Move(MoveKind.HAND_OVER, task, view.owner[task], actives.owner[task], reason))
    warmup_limit = view.config.max_warmup_replicas
    wanted_standbys = view.config.num_standby_replicas
    for instance, task, before, after in _changes(view, assignment):
        if after is TaskRole.ACTIVE or (before is TaskRole.ACTIVE and after is None):
            continue  # a failover or hand-over, listed above
        if after is TaskRole.WARMUP:
            moves.append(
                Move(
                    MoveKind.START_WARMUP,
                    task,
                    None,
                    instance,
                    f"{instance} is the balanced target of task {task}, active on "
                    f"{actives.owner[task]}; it restores the task to take it over once caught "
                    f"up (at most {warmup_limit} warm-ups at once)",
                )
            )
        elif after is TaskRole.STANDBY:
            if before is TaskRole.ACTIVE:
                why = "the former owner keeps its state as a standby"
            elif before is TaskRole.WARMUP:
                why = f"its warm-up is no longer needed on {instance} and becomes a standby"
            else:
                why = f"{instance} has room for it"
            moves.append(
                Move(
                    MoveKind.START_STANDBY,
                    task,
                    None,
                    instance,
                    f"task {task} keeps {standbys.wanted[task]} standby replica(s) beside its "
                    f"active on {actives.owner[task]}; {why}",
                )
            )
        elif before is TaskRole.WARMUP:
            moves.append(
                Move(
                    MoveKind.DROP_WARMUP,
                    task,
                    instance,
                    None,
                    _why_drop_warmup(view, target, actives, warmups, holding=(instance, task)),
                )
            )
        elif before is TaskRole.STANDBY:
            if not view.is_kept(instance):
                why = f"{instance} is draining"
            elif wanted_standbys == 0:
                why = "numStandbyReplicas is 0"
            else:
                holders = ", ".join(standbys.holders[task]) or "none"
                why = (
                    f"task {task} keeps {standbys.wanted[task]} standby replica(s), now on "
                    f"{holders}, balanced over the kept instances"
                )
            moves.append(Move(MoveKind.DROP_STANDBY, task, instance, None, why))
    moves.extend(_drained(view, assignment))
    return Plan(
        assignment=assignment,
        moves=tuple(sorted(moves, key=_move_order)),
        target=dict(sorted(target.owner.items())),
        unassigned=(),
    )


def _why_drop_warmup(
    view: _View,
    target: _Target,
    actives: _Actives,
    warmups: dict[TaskId, InstanceId],
    *,
    holding: tuple[InstanceId, TaskId],
) -> str:
    instance, task = holding
    goal = target.owner[task]
    if not view.is_kept(instance):
        return f"{instance} is draining"
    if actives.owner[task] == goal:
        return f"task {task} needs no warm-up: it is active on its balanced target {goal}"
    if instance != goal:
        return f"{instance} is no longer the balanced target of task {task} ({goal} is)"
    return (
        f"more warm-ups than maxWarmupReplicas ({view.config.max_warmup_replicas}); "
        f"warming {', '.join(str(t) for t in sorted(warmups))}"
    )


def _changes(
    view: _View, assignment: dict[InstanceId, dict[TaskId, TaskRole]]
) -> Iterable[tuple[InstanceId, TaskId, TaskRole | None, TaskRole | None]]:
    """(instance, task, observed role, next role) for every holding that changes."""
    for instance_id in sorted(view.instances):
        before = view.instances[instance_id].roles
        after = assignment[instance_id]
        for task in sorted(set(before) | set(after)):
            if before.get(task) != after.get(task):
                yield instance_id, task, before.get(task), after.get(task)


def _drained(view: _View, assignment: dict[InstanceId, dict[TaskId, TaskRole]]) -> list[Move]:
    moves = []
    for instance in sorted(view.instances):
        if view.is_kept(instance) or assignment[instance]:
            continue
        if view.instances[instance].roles:
            reason = (
                f"{instance} is draining and holds no task once the moves above are done; "
                "delete it then"
            )
        else:
            reason = f"{instance} is draining and holds no task; it can be deleted"
        moves.append(Move(MoveKind.DRAINED, None, instance, None, reason))
    return moves


_KIND_ORDER = {kind.value: rank for rank, kind in enumerate(MoveKind)}


def _move_order(move: Move) -> tuple[int, int, str]:
    task = -1 if move.task is None else move.task
    instance = move.destination or move.source or ""
    return (_KIND_ORDER[move.kind.value], task, instance)


def _stop_everything(view: _View) -> Plan:
    """No instance is kept: scaling to zero stops the app, so every task is let go."""
    moves: list[Move] = []
    for instance_id in sorted(view.instances):
        for task, role in sorted(view.instances[instance_id].roles.items()):
            if role is TaskRole.ACTIVE:
                kind, reason = (
                    MoveKind.RELEASE,
                    f"no instance is kept (scaled to zero): the app stops, task {task} is "
                    "released and its state stays in the changelog",
                )
            else:
                kind = MoveKind.DROP_STANDBY if role is TaskRole.STANDBY else MoveKind.DROP_WARMUP
                reason = f"{instance_id} is draining and no instance is kept"
            moves.append(Move(kind, task, instance_id, None, reason))
    assignment: dict[InstanceId, dict[TaskId, TaskRole]] = {i: {} for i in sorted(view.instances)}
    moves.extend(_drained(view, assignment))
    return Plan(
        assignment=assignment,
        moves=tuple(sorted(moves, key=_move_order)),
        target={},
        unassigned=tuple(view.tasks),
    )
