"""The planner's invariants, for any observed state hypothesis can think of."""

import json
import math
import random
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from smoothscale.planner import ClusterState, Instance, MoveKind, Plan, PlannerConfig, plan
from smoothscale.tasks import TaskRole
from tests.planner.simulation import advance, apply_moves, cluster_states, name, roles_of

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def kept_ids(state: ClusterState) -> list[str]:
    return [i.id for i in state.instances if not i.draining]


def active_owners(plan_: Plan) -> Counter[int]:
    return Counter(
        task
        for roles in plan_.assignment.values()
        for task, role in roles.items()
        if role is TaskRole.ACTIVE
    )


def spread(counts: list[int]) -> int:
    return max(counts) - min(counts) if counts else 0


def lag_of(state: ClusterState, instance_id: str, task: int) -> int | None:
    instance = next(i for i in state.instances if i.id == instance_id)
    if instance.roles.get(task) is TaskRole.ACTIVE:
        return 0
    return instance.lags.get(task)


def caught_up(state: ClusterState, instance_id: str, task: int) -> bool:
    lag = lag_of(state, instance_id, task)
    return lag is not None and lag <= state.config.acceptable_recovery_lag


def converge(state: ClusterState, rounds: int) -> tuple[ClusterState, Plan, int]:
    """Plan, carry out, catch up, repeat until a plan has no moves; at most `rounds` plans."""
    for round_ in range(1, rounds + 1):
        next_plan = plan(state)
        if next_plan.converged:
            return state, next_plan, round_
        state = advance(state, next_plan)
    raise AssertionError(f"no converged plan after {rounds} rounds")


def convergence_bound(state: ClusterState) -> int:
    """Rounds (plans) until one has no moves, when every replica catches up between rounds.

    Round 1 fails tasks over, hands over to targets that are already caught up and starts up
    to w = maxWarmupReplicas warm-ups; every later round hands those w over and starts w more,
    so the at most T tasks off their target are through after ceil(T / w) rounds. One more
    round hands the last warm-ups over and settles standbys on the former owners, one more
    places the standbys that could not go there yet, and the last plan has nothing to do.
    """
    return math.ceil(len(state.tasks) / state.config.max_warmup_replicas) + 3


@SETTINGS
@given(cluster_states())
def test_every_task_has_exactly_one_active_on_a_live_instance(state: ClusterState) -> None:
    result = plan(state)
    assert set(result.assignment) == {i.id for i in state.instances}
    if kept_ids(state):
        assert active_owners(result) == Counter(state.tasks)
        assert result.unassigned == ()
    else:
        assert active_owners(result) == Counter()
        assert result.unassigned == tuple(state.tasks)


@SETTINGS
@given(cluster_states())
def test_actives_move_only_to_caught_up_ready_kept_instances_when_one_exists(
    state: ClusterState,
) -> None:
    forced = {i.id for i in state.instances if i.force_release}
    ready_kept = [i.id for i in state.instances if not i.draining and i.ready]
    for move in plan(state).moves:
        if move.kind not in (MoveKind.FAILOVER, MoveKind.HAND_OVER):
            continue
        assert move.task is not None
        assert move.destination is not None
        assert move.destination in kept_ids(state)
        somewhere = any(caught_up(state, i, move.task) for i in ready_kept)
        if (move.kind is MoveKind.HAND_OVER and move.source not in forced) or somewhere:
            assert move.destination in ready_kept
            assert caught_up(state, move.destination, move.task), move.reason


@SETTINGS
@given(cluster_states())
def test_a_live_owner_keeps_its_active_unless_a_move_says_otherwise(state: ClusterState) -> None:
    result = plan(state)
    assert apply_moves(roles_of(state), result.moves) == result.assignment
    assert all(move.reason for move in result.moves)


@SETTINGS
@given(cluster_states())
def test_replicas_respect_the_limits_and_never_sit_beside_the_active(state: ClusterState) -> None:
    result = plan(state)
    kept = set(kept_ids(state))
    owner = {
        task: instance
        for instance, roles in result.assignment.items()
        for task, role in roles.items()
        if role is TaskRole.ACTIVE
    }
    warmups = [
        (instance, task)
        for instance, roles in result.assignment.items()
        for task, role in roles.items()
        if role is TaskRole.WARMUP
    ]
    assert len(warmups) <= state.config.max_warmup_replicas
    for instance, task in warmups:
        assert instance in kept
        assert result.target[task] == instance != owner[task]
    standbys = Counter(
        task
        for roles in result.assignment.values()
        for task, role in roles.items()
        if role is TaskRole.STANDBY
    )
    for task, n in standbys.items():
        target = result.target[task]
        replacement = owner[task] != target and result.assignment[target].get(task) is not None
        assert n <= max(state.config.num_standby_replicas, 1 if replacement else 0)
    for instance, roles in result.assignment.items():
        if instance not in kept:
            assert set(roles.values()) <= {TaskRole.ACTIVE}


@SETTINGS
@given(cluster_states())
def test_the_target_is_balanced_over_the_kept_instances(state: ClusterState) -> None:
    result = plan(state)
    kept = kept_ids(state)
    if not kept:
        assert result.target == {}
        return
    assert set(result.target) == set(state.tasks)
    counts = Counter(result.target.values())
    assert set(counts) <= set(kept)
    assert spread([counts[i] for i in kept]) <= 1


@SETTINGS
@given(cluster_states())
def test_draining_instances_take_nothing_new(state: ClusterState) -> None:
    result = plan(state)
    for instance in state.instances:
        if instance.draining:
            kept_actives = {t for t, role in instance.roles.items() if role is TaskRole.ACTIVE}
            assert set(result.assignment[instance.id]) <= kept_actives


def as_json(plan_: Plan) -> str:
    return json.dumps(
        {
            "assignment": {i: list(r.items()) for i, r in plan_.assignment.items()},
            "target": list(plan_.target.items()),
            "moves": [list(vars(m).values()) for m in plan_.moves],
            "unassigned": plan_.unassigned,
        }
    )


@SETTINGS
@given(cluster_states(), st.randoms(use_true_random=False))
def test_the_same_facts_in_any_order_give_the_same_plan(
    state: ClusterState, rng: random.Random
) -> None:
    def shuffled(pairs: list[tuple[int, Any]]) -> dict[int, Any]:
        rng.shuffle(pairs)
        return dict(pairs)

    instances = [
        Instance(
            i.id,
            i.ready,
            i.draining,
            i.force_release,
            shuffled(list(i.roles.items())),
            shuffled(list(i.lags.items())),
        )
        for i in state.instances
    ]
    rng.shuffle(instances)
    tasks = list(state.tasks)
    rng.shuffle(tasks)
    permuted = ClusterState(tasks, instances, state.config)
    assert as_json(plan(state)) == as_json(plan(state)) == as_json(plan(permuted))


REPLACEMENT_AFTER_STICKY_STANDBYS = ClusterState(
    [0, 1, 2, 3],
    [
        Instance("app-0", ready=True),
        Instance(
            "app-1",
            ready=False,
            roles={0: TaskRole.STANDBY, 1: TaskRole.STANDBY, 2: TaskRole.STANDBY},
        ),
        Instance("app-2", ready=False),
    ],
    PlannerConfig(acceptable_recovery_lag=0, max_warmup_replicas=1, num_standby_replicas=1),
)
"""Found by a gate: app-1's standby of task 2 is the replacement of its move, kept beyond
app-1's share. Kept after two sticky standbys of lower ids, it pushed one of them away; after
those moves the re-plan met it before another and pushed that one instead."""


@SETTINGS
@given(cluster_states())
@example(REPLACEMENT_AFTER_STICKY_STANDBYS)
def test_replanning_while_moves_are_in_flight_repeats_the_plan(state: ClusterState) -> None:
    """Replicas started or dropped, hand-overs and failovers not done yet: same answer.

    (From any state the planner can lead to: no more warm-ups than the limit. When the limit
    is lowered under running warm-ups, the extra ones are dropped and their tasks may get a
    new target once.)
    """
    warmups = sum(role is TaskRole.WARMUP for i in state.instances for role in i.roles.values())
    assume(warmups <= state.config.max_warmup_replicas)
    first = plan(state)
    observed = roles_of(state)
    in_flight = [
        move
        for move in first.moves
        if move.kind in (MoveKind.START_WARMUP, MoveKind.DROP_WARMUP, MoveKind.DROP_STANDBY)
        or (
            move.kind is MoveKind.START_STANDBY
            and observed[move.destination or ""].get(move.task or 0) is not TaskRole.ACTIVE
        )
    ]
    roles = apply_moves(observed, tuple(in_flight))
    again = ClusterState(
        state.tasks,
        [
            Instance(
                i.id,
                i.ready,
                i.draining,
                i.force_release,
                roles[i.id],
                {t: lag for t, lag in i.lags.items() if t in roles[i.id]},
            )
            for i in state.instances
        ],
        state.config,
    )
    second = plan(again)
    assert second.assignment == first.assignment
    active_moves = (MoveKind.FAILOVER, MoveKind.HAND_OVER, MoveKind.RELEASE)
    assert [m for m in second.moves if m.kind in active_moves] == [
        m for m in first.moves if m.kind in active_moves
    ]


balanced_states = st.builds(
    lambda tasks, instances, seed: _balanced(tasks, instances, random.Random(seed)),
    st.integers(0, 30),
    st.integers(1, 8),
    st.integers(0, 2**32),
)


def _balanced(tasks: int, instances: int, rng: random.Random) -> ClusterState:
    order = list(range(tasks))
    rng.shuffle(order)
    roles: dict[int, dict[int, TaskRole]] = {i: {} for i in range(instances)}
    for position, task in enumerate(order):
        roles[position % instances][task] = TaskRole.ACTIVE
    members = [Instance(name(i), roles=roles[i]) for i in range(instances)]
    rng.shuffle(members)
    return ClusterState(list(range(tasks)), members, PlannerConfig())


@SETTINGS
@given(balanced_states)
def test_a_balanced_caught_up_state_makes_no_moves(state: ClusterState) -> None:
    result = plan(state)
    assert result.moves == ()
    assert result.assignment == roles_of(state)


NOT_READY_TARGET = ClusterState(
    [0, 1],
    [
        Instance("app-0", ready=False, roles={0: TaskRole.ACTIVE, 1: TaskRole.ACTIVE}),
        Instance("app-1", ready=False, roles={1: TaskRole.STANDBY}),
    ],
    PlannerConfig(acceptable_recovery_lag=0, max_warmup_replicas=1, num_standby_replicas=0),
)
"""Found by CI: the first plan has no move (task 1's target is not ready), which is waiting,
not convergence."""


@SETTINGS
@given(cluster_states(max_tasks=20, max_instances=7))
@example(NOT_READY_TARGET)
def test_planning_converges_to_the_balanced_target_once_warm_ups_catch_up(
    state: ClusterState,
) -> None:
    final, last_plan, _ = converge(state, convergence_bound(state))
    kept = kept_ids(state)
    assert [i.id for i in final.instances] == kept
    assert last_plan.assignment == roles_of(final)
    if not kept:
        return
    actives = active_owners(last_plan)
    assert actives == Counter(state.tasks)
    per_instance = Counter(
        instance
        for instance, roles in last_plan.assignment.items()
        for role in roles.values()
        if role is TaskRole.ACTIVE
    )
    assert spread([per_instance[i] for i in kept]) <= 1
    standbys = Counter(
        instance
        for instance, roles in last_plan.assignment.items()
        for role in roles.values()
        if role is TaskRole.STANDBY
    )
    assert spread([standbys[i] for i in kept]) <= 1
    per_task = min(state.config.num_standby_replicas, len(kept) - 1)
    assert sum(standbys.values()) == per_task * len(state.tasks)
    assert TaskRole.WARMUP not in {
        role for roles in last_plan.assignment.values() for role in roles.values()
    }
    assert last_plan.target == {
        task: instance
        for instance, roles in last_plan.assignment.items()
        for task, role in roles.items()
        if role is TaskRole.ACTIVE
    }
