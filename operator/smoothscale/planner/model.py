"""The planner's small value types: what it is told (ClusterState) and what it answers (Plan).

Everything here is immutable, plain data: no I/O, no clock, no Kubernetes or Kafka types, so the
operator, `smoothscale plan` and the tests build these values the same way.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from smoothscale.api.models import ScalingStrategy
from smoothscale.tasks import TaskId, TaskRole

InstanceId = str
"""An instance is named by its pod name."""


class TaskMoves(StrEnum):
    """When an active task moves to its balanced target (what spec.scaling.strategy sets)."""

    WHEN_CAUGHT_UP = "WhenCaughtUp"
    """Once the target's replica of it has caught up: a warm-up restores it in the background
    while the old owner keeps processing (strategy WarmUp, KIP-441)."""
    WHEN_READY = "WhenReady"
    """As soon as the target is ready, without a warm-up: it restores the task's state before
    it processes it (strategy Cooperative: Kafka Streams' cooperative rebalancing without
    KIP-441's warm-ups)."""
    AT_ONCE = "AtOnce"
    """At once, even to a target still starting (strategy StopTheWorld)."""


STRATEGY_MOVES = {
    ScalingStrategy.WARM_UP: TaskMoves.WHEN_CAUGHT_UP,
    ScalingStrategy.COOPERATIVE: TaskMoves.WHEN_READY,
    ScalingStrategy.STOP_THE_WORLD: TaskMoves.AT_ONCE,
    ScalingStrategy.RESTART: TaskMoves.WHEN_READY,
}
"""When tasks move under each spec.scaling.strategy (Restart also stops every pod on a change,
which the operator does around the plan)."""


@dataclass(frozen=True)
class PlannerConfig:
    """The knobs of spec.scaling that shape the plan (Kafka Streams' names and defaults)."""

    acceptable_recovery_lag: int = 10_000
    """A replica whose state lag is at most this is caught up and may take the task over."""
    max_warmup_replicas: int = 2
    """How many warm-up replicas may run at once across the whole app (at least 1)."""
    num_standby_replicas: int = 0
    """How many hot standby copies each task keeps on kept instances other than its owner."""
    moves: TaskMoves = TaskMoves.WHEN_CAUGHT_UP
    """When an active moves to its balanced target; warm-ups are planned only for
    WHEN_CAUGHT_UP (the others move without one)."""

    def __post_init__(self) -> None:
        if self.acceptable_recovery_lag < 0:
            raise ValueError(
                f"acceptableRecoveryLag is {self.acceptable_recovery_lag}; "
                "it counts changelog records, so use 0 or more"
            )
        if self.max_warmup_replicas < 1:
            raise ValueError(
                f"maxWarmupReplicas is {self.max_warmup_replicas}; with no warm-up a task "
                "could never move to a new instance, so use 1 or more"
            )
        if self.num_standby_replicas < 0:
            raise ValueError(f"numStandbyReplicas is {self.num_standby_replicas}; use 0 or more")


@dataclass(frozen=True)
class Instance:
    """One live instance (pod) as observed: its readiness, the tasks it holds and their lags.

    An instance that is gone (pod deleted or failed) is simply not passed to the planner; the
    tasks it held actively are then ownerless and fail over at once.
    """

    id: InstanceId
    ready: bool = True
    """A ready instance can process; an active is only handed to a ready instance."""
    draining: bool = False
    """Being removed by a scale-in: it gives all its tasks away, then holds nothing."""
    force_release: bool = False
    """Set by the operator once spec.scaling.drainTimeout has passed for a draining instance:
    its actives then move to the best kept instance even when none is caught up."""
    roles: Mapping[TaskId, TaskRole] = field(default_factory=dict)
    """How it holds each task it holds; tasks it does not hold are absent."""
    lags: Mapping[TaskId, int] = field(default_factory=dict)
    """Changelog end offset minus restored offset, per task it has state for (sparse: a task
    absent here has unknown lag, i.e. was never restored, and is not caught up)."""


@dataclass(frozen=True)
class ClusterState:
    """Everything plan() needs: the app's tasks, the live instances and the config."""

    tasks: Sequence[TaskId]
    instances: Sequence[Instance]
    config: PlannerConfig = field(default_factory=PlannerConfig)


class MoveKind(StrEnum):
    """What one step of a plan does."""

    FAILOVER = "failover"
    """A task without a live active owner gets one at once (availability first)."""
    HAND_OVER = "hand-over"
    """An active moves from one instance to another through the cooperative release."""
    RELEASE = "release"
    """An active is let go with no new owner: only when no instance is kept (scale to zero)."""
    START_WARMUP = "start-warmup"
    """An instance starts restoring a task it is meant to take over."""
    START_STANDBY = "start-standby"
    """An instance starts (or keeps, after giving the active away) a hot copy of a task."""
    DROP_WARMUP = "drop-warmup"
    """An instance stops restoring a task."""
    DROP_STANDBY = "drop-standby"
    """An instance stops keeping a hot copy of a task."""
    DRAINED = "drained"
    """A draining instance holds no task any more once the other moves are done."""


@dataclass(frozen=True)
class Move:
    """One step from the observed state to the next assignment, and why."""

    kind: MoveKind
    task: TaskId | None
    """None only for DRAINED, which is about a whole instance."""
    source: InstanceId | None
    """The instance that gives something up (the old owner of a hand-over); None if none."""
    destination: InstanceId | None
    """The instance that takes something on; None if none."""
    reason: str


@dataclass(frozen=True)
class Plan:
    """The planner's answer: where every task should be held next, and the moves to get there."""

    assignment: Mapping[InstanceId, Mapping[TaskId, TaskRole]]
    """Every live instance, with the tasks it holds after the moves (empty if none)."""
    moves: tuple[Move, ...]
    """In the order of MoveKind (failovers, hand-overs, releases, replicas started, replicas
    dropped, drained instances), then by task id, then instance id."""
    target: Mapping[TaskId, InstanceId]
    """The balanced owner each task converges to (only tasks that have a kept instance)."""
    unassigned: tuple[TaskId, ...]
    """Tasks without an active owner after the moves: only when no instance is kept."""

    @property
    def converged(self) -> bool:
        """True when the plan has nothing left to do: no move, and every task active on its
        balanced target. A plan without moves whose tasks are not all there yet is waiting
        (for a replica to catch up, or for its instance to become ready)."""
        return not self.moves and all(
            self.assignment.get(owner, {}).get(task) is TaskRole.ACTIVE
            for task, owner in self.target.items()
        )
