"""The planner: a pure, deterministic assignor of tasks to instances (see docs/planner.md)."""

from smoothscale.planner.assignor import plan
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

__all__ = [
    "ClusterState",
    "Instance",
    "InstanceId",
    "Move",
    "MoveKind",
    "Plan",
    "PlannerConfig",
    "TaskMoves",
    "plan",
]
