"""The JSON forms of the planner's input (STATE.json) and output, for `smoothscale plan`.

The input schema is the pydantic model PlanInput (camelCase, like the StreamingApp resource);
docs/planner.md shows it with examples. Reading a file never raises anything but
PlanInputError, whose message says what is wrong and what to do.
"""

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from smoothscale.api.models import ScalingStrategy
from smoothscale.planner.model import (
    STRATEGY_MOVES,
    ClusterState,
    Instance,
    Plan,
    PlannerConfig,
)
from smoothscale.tasks import TaskId, TaskRole


class PlanInputError(Exception):
    """A state file that cannot be planned; the message is meant for the user."""


class _Schema(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ScalingInput(_Schema):
    """The planner's knobs, named as in spec.scaling of a StreamingApp."""

    acceptable_recovery_lag: int = Field(
        default=10_000, ge=0, description="A replica at most this many records behind is caught up."
    )
    max_warmup_replicas: int = Field(
        default=2, ge=1, description="How many warm-up replicas may run at once across the app."
    )
    num_standby_replicas: int = Field(
        default=0, ge=0, description="Hot standby copies per task, beside its active."
    )
    strategy: ScalingStrategy = Field(
        default=ScalingStrategy.WARM_UP,
        description="When tasks move: WarmUp, Cooperative, Restart or StopTheWorld.",
    )


class HoldingInput(_Schema):
    """How an instance holds one task."""

    role: TaskRole
    lag: int | None = Field(
        None,
        ge=0,
        description="Changelog end offset minus restored offset; omitted or null when the "
        "instance never restored the task. Ignored for the active (its lag is 0).",
    )


class InstanceInput(_Schema):
    """One live instance (pod). Instances that are gone are left out."""

    id: str = Field(min_length=1, description="The pod name.")
    ready: bool = Field(True, description="Whether the pod is ready to process.")
    draining: bool = Field(False, description="Whether a scale-in is removing it.")
    force_release: bool = Field(
        False,
        description="Set once a draining instance's drainTimeout has passed: its actives "
        "move even when no kept instance is caught up.",
    )
    tasks: dict[TaskId, HoldingInput] = Field(
        default_factory=dict, description="The tasks it holds, by task id."
    )

    @model_validator(mode="after")
    def _force_release_needs_draining(self) -> "InstanceInput":
        if self.force_release and not self.draining:
            raise ValueError(
                f"instance {self.id!r} has forceRelease but is not draining; set "
                "draining: true too, or drop forceRelease"
            )
        return self


class PlanInput(_Schema):
    """STATE.json: an app's tasks, its live instances and the scaling config."""

    task_count: int = Field(ge=0, description="The app has tasks 0 .. taskCount - 1.")
    config: ScalingInput = ScalingInput()
    instances: list[InstanceInput] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "PlanInput":
        seen: set[str] = set()
        owners: dict[TaskId, str] = {}
        for instance in self.instances:
            if instance.id in seen:
                raise ValueError(f"instance {instance.id!r} is listed twice; list it once")
            seen.add(instance.id)
            for task, holding in sorted(instance.tasks.items()):
                if not 0 <= task < self.task_count:
                    raise ValueError(
                        f"instance {instance.id!r} holds task {task}, but the app has tasks "
                        f"0..{self.task_count - 1} (taskCount {self.task_count}); fix the "
                        "task id or taskCount"
                    )
                if holding.role is TaskRole.ACTIVE:
                    if task in owners:
                        raise ValueError(
                            f"task {task} is active on both {owners[task]!r} and "
                            f"{instance.id!r}; a task has one active owner, keep one"
                        )
                    owners[task] = instance.id
        return self

    def to_state(self) -> ClusterState:
        config = PlannerConfig(
            acceptable_recovery_lag=self.config.acceptable_recovery_lag,
            max_warmup_replicas=self.config.max_warmup_replicas,
            num_standby_replicas=self.config.num_standby_replicas,
            moves=STRATEGY_MOVES[self.config.strategy],
        )
        instances = [
            Instance(
                id=i.id,
                ready=i.ready,
                draining=i.draining,
                force_release=i.force_release,
                roles={task: holding.role for task, holding in i.tasks.items()},
                lags={
                    task: holding.lag
                    for task, holding in i.tasks.items()
                    if holding.lag is not None
                },
            )
            for i in self.instances
        ]
        return ClusterState(list(range(self.task_count)), instances, config)


def load_state(path: Path) -> ClusterState:
    """Read and validate STATE.json; PlanInputError says what is wrong and what to do."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanInputError(
            f"{path}: no such file; pass the path of a state file "
            "(examples/plan/scale-out.json is one)"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise PlanInputError(
            f"{path}: cannot be read ({error}); pass a readable UTF-8 JSON file"
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise PlanInputError(
            f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg}); "
            "fix the syntax"
        ) from None
    try:
        return PlanInput.model_validate(document).to_state()
    except ValidationError as error:
        problems = "\n".join(f"  {_where(e['loc'])}: {e['msg']}" for e in error.errors())
        raise PlanInputError(
            f"{path}: not a valid state file:\n{problems}\n"
            "The schema is in docs/planner.md; examples/plan/ has complete examples."
        ) from None


def _where(location: tuple[int | str, ...]) -> str:
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            text += " (the key)"
        else:
            text += f".{part}" if text else part
    return text or "(the whole document)"


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready dict (the output schema in docs/planner.md)."""
    assignment: dict[str, dict[str, list[TaskId]]] = {}
    for instance, roles in plan.assignment.items():
        assignment[instance] = {
            role.value: [task for task, held in roles.items() if held is role] for role in TaskRole
        }
    target: dict[str, list[TaskId]] = {}
    for task, instance in plan.target.items():
        target.setdefault(instance, []).append(task)
    return {
        "converged": plan.converged,
        "moves": [
            {
                "kind": move.kind.value,
                "task": move.task,
                "from": move.source,
                "to": move.destination,
                "reason": move.reason,
            }
            for move in plan.moves
        ],
        "assignment": assignment,
        "target": dict(sorted(target.items())),
        "unassigned": list(plan.unassigned),
    }
