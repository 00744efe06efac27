"""The shared vocabulary of tasks: what a task is and the roles an instance can hold it in.

Task i is partition i of the input topic(s) plus partition i of each state store's changelog
topic (see docs/architecture.md). Every part of smoothscale (planner, runtime, operator,
status) speaks of tasks with these names, so they live here and nowhere else.
"""

from enum import StrEnum

TaskId = int
"""A task is named by its partition number."""


class TaskRole(StrEnum):
    """How an instance holds a task."""

    ACTIVE = "active"
    """Processes the task's input and writes its state; exactly one per task."""
    STANDBY = "standby"
    """Keeps a hot copy of the task's state by following its changelog."""
    WARMUP = "warmup"
    """Restores the task's state in the background to take the task over once caught up."""
