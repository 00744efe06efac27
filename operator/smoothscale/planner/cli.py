"""`smoothscale plan STATE.json`: what would the operator do? A dry run of the planner."""

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from smoothscale.planner.model import Plan
from smoothscale.tasks import TaskId, TaskRole

if TYPE_CHECKING:
    from smoothscale.cli import Subparsers

EXIT_BAD_INPUT = 2


def register(subparsers: "Subparsers[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show the next assignment and moves for an observed state (a dry run)",
        description="Plan one round for the app state in STATE.json and print the next "
        "assignment and the moves that lead there, each with its reason. Nothing is changed "
        "anywhere. The schema of STATE.json is in docs/planner.md; examples/plan/ has examples.",
    )
    parser.add_argument("state", type=Path, metavar="STATE.json", help="the observed state")
    parser.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json (default) for tools, table for people",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from smoothscale.planner.assignor import plan
    from smoothscale.planner.io import PlanInputError, load_state, plan_to_json

    try:
        state = load_state(args.state)
        result = plan(state)
    except (PlanInputError, ValueError) as error:
        print(f"smoothscale plan: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.format == "json":
        print(json.dumps(plan_to_json(result), indent=2))
    else:
        draining = {i.id for i in state.instances if i.draining}
        not_ready = {i.id for i in state.instances if not i.ready}
        print(render_table(result, draining, not_ready))
    return 0


def render_table(plan: Plan, draining: set[str], not_ready: set[str]) -> str:
    """The plan for people: the moves, then every instance's tasks by role and its target."""
    lines: list[str] = []
    if plan.converged:
        lines.append("No moves: the assignment is balanced and every task is where it belongs.")
    elif not plan.moves:
        lines.append(
            "No moves now: tasks off their target wait for its replica to catch up or for the "
            "instance to become ready."
        )
    else:
        lines.append(f"{len(plan.moves)} move(s):")
        moves: list[tuple[str, ...]] = [("MOVE", "TASK", "FROM", "TO", "REASON")]
        moves += [
            (
                move.kind.value,
                "-" if move.task is None else str(move.task),
                move.source or "-",
                move.destination or "-",
                move.reason,
            )
            for move in plan.moves
        ]
        lines += _columns(moves)
    lines.append("")
    lines.append("Next assignment:")
    targets: dict[str, list[TaskId]] = {}
    for task, instance in plan.target.items():
        targets.setdefault(instance, []).append(task)
    rows: list[tuple[str, ...]] = [("INSTANCE", "STATE", "ACTIVE", "STANDBY", "WARM-UP", "TARGET")]
    for instance, roles in plan.assignment.items():
        state = "draining" if instance in draining else "kept"
        if instance in not_ready:
            state += ", not ready"
        by_role = {
            role: _ranges([task for task, held in roles.items() if held is role])
            for role in TaskRole
        }
        rows.append(
            (
                instance,
                state,
                by_role[TaskRole.ACTIVE],
                by_role[TaskRole.STANDBY],
                by_role[TaskRole.WARMUP],
                _ranges(targets.get(instance, [])),
            )
        )
    lines += _columns(rows)
    if plan.unassigned:
        lines.append("")
        lines.append(f"Unassigned (no kept instance): {_ranges(list(plan.unassigned))}")
    return "\n".join(lines)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _ranges(tasks: list[TaskId]) -> str:
    """1,2,3,5,7,8 -> "1-3,5,7-8"; no task -> "-"."""
    if not tasks:
        return "-"
    parts: list[str] = []
    ordered = sorted(tasks)
    start = previous = ordered[0]
    for task in [*ordered[1:], None]:
        if task is not None and task == previous + 1:
            previous = task
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if task is not None:
            start = previous = task
    return ",".join(parts)
