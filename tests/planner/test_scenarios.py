"""The planner's story, scenario by scenario: scale out, scale in, failures and edge cases."""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from smoothscale.planner import (
    ClusterState,
    Instance,
    MoveKind,
    Plan,
    PlannerConfig,
    TaskMoves,
    plan,
)
from smoothscale.tasks import TaskRole
from tests.planner.simulation import advance

KAFKA_STREAMS_DEFAULTS = PlannerConfig()  # acceptable lag 10000, 2 warm-ups, no standby


def instance(
    name: str,
    active: Iterable[int] = (),
    standby: dict[int, int | None] | None = None,
    warmup: dict[int, int | None] | None = None,
    *,
    ready: bool = True,
    draining: bool = False,
    force_release: bool = False,
) -> Instance:
    """An instance holding `active` tasks and standbys/warm-ups given as {task: lag or None}."""
    roles = dict.fromkeys(active, TaskRole.ACTIVE)
    lags = dict.fromkeys(active, 0)
    for role, held in ((TaskRole.STANDBY, standby or {}), (TaskRole.WARMUP, warmup or {})):
        for task, lag in held.items():
            roles[task] = role
            if lag is not None:
                lags[task] = lag
    return Instance(name, ready, draining, force_release, roles, lags)


def moves_of(result: Plan) -> list[tuple[str, int | None, str | None, str | None]]:
    return [(m.kind.value, m.task, m.source, m.destination) for m in result.moves]


def actives(result: Plan) -> dict[str, list[int]]:
    return {
        i: [t for t, role in roles.items() if role is TaskRole.ACTIVE]
        for i, roles in result.assignment.items()
    }


def run_until_converged(state: ClusterState, rounds: int = 30) -> list[Plan]:
    plans = [plan(state)]
    while not plans[-1].converged:
        assert len(plans) < rounds, "no convergence"
        state = advance(state, plans[-1])
        plans.append(plan(state))
    return plans


# --- scale-out: the story of KIP-441 --------------------------------------------------------


def scale_out_2_to_4() -> ClusterState:
    return ClusterState(
        range(12),
        [
            instance("app-0", range(0, 6)),
            instance("app-1", range(6, 12)),
            instance("app-2", ready=False),
            instance("app-3", ready=False),
        ],
        KAFKA_STREAMS_DEFAULTS,
    )


def test_scale_out_first_warms_up_the_new_instances_and_moves_no_active() -> None:
    result = plan(scale_out_2_to_4())
    assert moves_of(result) == [
        ("start-warmup", 3, None, "app-2"),
        ("start-warmup", 9, None, "app-3"),
    ]
    assert actives(result) == {
        "app-0": [0, 1, 2, 3, 4, 5],
        "app-1": [6, 7, 8, 9, 10, 11],
        "app-2": [],
        "app-3": [],
    }
    # The old owners keep their first three tasks; the new instances get the rest.
    owners = {"app-0": [0, 1, 2], "app-2": [3, 4, 5], "app-1": [6, 7, 8], "app-3": [9, 10, 11]}
    assert dict(result.target) == {t: i for i, tasks in owners.items() for t in tasks}


def test_a_warmup_flips_to_active_only_when_caught_up() -> None:
    warming = ClusterState(
        range(12),
        [
            instance("app-0", range(0, 6)),
            instance("app-1", range(6, 12)),
            instance("app-2", warmup={3: 812}),
            instance("app-3", warmup={9: 154_000}),
        ],
        KAFKA_STREAMS_DEFAULTS,
    )
    result = plan(warming)
    hand_overs = [m for m in result.moves if m.kind is MoveKind.HAND_OVER]
    assert [(m.task, m.source, m.destination) for m in hand_overs] == [(3, "app-0", "app-2")]
    assert "lag 812 <= 10000" in hand_overs[0].reason
    assert result.assignment["app-3"] == {9: TaskRole.WARMUP}
    # The slot task 3's warm-up frees goes to the next task app-2 will own.
    assert result.assignment["app-2"] == {3: TaskRole.ACTIVE, 4: TaskRole.WARMUP}


def test_scale_out_converges_two_warm_ups_at_a_time_keeping_the_old_owners_tasks() -> None:
    plans = run_until_converged(scale_out_2_to_4())
    # 6 tasks move, 2 at a time: 3 rounds of warm-ups, whose hand-overs end in round 4.
    assert len(plans) == 5
    for step in plans:
        assert (
            Counter(r for roles in step.assignment.values() for r in roles.values())[
                TaskRole.WARMUP
            ]
            <= 2
        )
    assert actives(plans[-1]) == {
        "app-0": [0, 1, 2],
        "app-1": [6, 7, 8],
        "app-2": [3, 4, 5],
        "app-3": [9, 10, 11],
    }
    hand_overs = [m for step in plans for m in step.moves if m.kind is MoveKind.HAND_OVER]
    assert len(hand_overs) == 6


# --- scale-in: the part of KIP-441's first draft Kafka Streams never did ---------------------


def scale_in_4_to_2(*, force_release: bool = False) -> ClusterState:
    return ClusterState(
        range(8),
        [
            instance("app-0", [0, 4]),
            instance("app-1", [1, 5]),
            instance("app-2", [2, 6], draining=True, force_release=force_release),
            instance("app-3", [3, 7], draining=True, force_release=force_release),
        ],
        KAFKA_STREAMS_DEFAULTS,
    )


def test_a_draining_instance_keeps_its_actives_while_their_replacements_warm_up() -> None:
    result = plan(scale_in_4_to_2())
    assert [m for m in result.moves if m.kind is MoveKind.HAND_OVER] == []
    assert actives(result)["app-2"] == [2, 6]
    assert actives(result)["app-3"] == [3, 7]
    warmups = [(m.task, m.destination) for m in result.moves if m.kind is MoveKind.START_WARMUP]
    assert len(warmups) == 2
    assert {destination for _, destination in warmups} <= {"app-0", "app-1"}


def test_scale_in_hands_everything_over_then_reports_the_drained_instances() -> None:
    plans = run_until_converged(scale_in_4_to_2())
    drained = [m.source for step in plans for m in step.moves if m.kind is MoveKind.DRAINED]
    assert Counter(drained) == {"app-2": 1, "app-3": 1}
    final = actives(plans[-1])
    assert sorted(final) == ["app-0", "app-1"]
    assert sorted(len(tasks) for tasks in final.values()) == [4, 4]
    assert set(final["app-0"]) >= {0, 4}
    assert set(final["app-1"]) >= {1, 5}
    for step in plans:
        assert sum(len(tasks) for tasks in actives(step).values()) == 8


def test_after_the_drain_timeout_actives_move_even_when_nothing_is_caught_up() -> None:
    result = plan(scale_in_4_to_2(force_release=True))
    hand_overs = [m for m in result.moves if m.kind is MoveKind.HAND_OVER]
    assert [m.task for m in hand_overs] == [2, 3, 6, 7]
    assert all("drain timeout" in m.reason for m in hand_overs)
    assert actives(result)["app-2"] == []
    assert actives(result)["app-3"] == []
    assert ("drained", None, "app-2", None) in moves_of(result)


def test_a_draining_instance_releases_its_active_once_a_standby_is_caught_up() -> None:
    state = ClusterState(
        range(2),
        [
            instance("app-0", [0], standby={1: 20_000}),
            instance("app-1", [1], standby={0: 5}, draining=True),
        ],
        PlannerConfig(num_standby_replicas=1),
    )
    assert moves_of(plan(state)) == [
        ("drop-standby", 0, "app-1", None),
    ]
    caught_up = ClusterState(
        range(2),
        [
            instance("app-0", [0], standby={1: 9_000}),
            instance("app-1", [1], standby={0: 5}, draining=True),
        ],
        PlannerConfig(num_standby_replicas=1),
    )
    assert moves_of(plan(caught_up)) == [
        ("hand-over", 1, "app-1", "app-0"),
        ("drop-standby", 0, "app-1", None),
        ("drained", None, "app-1", None),
    ]


# --- failures ---------------------------------------------------------------------------------


def test_a_lost_owners_tasks_fail_over_at_once_to_the_most_caught_up_instance() -> None:
    state = ClusterState(
        range(6),
        [
            instance("app-0", [0, 3], standby={1: 40_000, 2: None}),
            instance("app-1", [1, 4], warmup={2: 30_000}, standby={5: 15_000}),
        ],  # app-2, owner of 2 and 5, is gone
        PlannerConfig(num_standby_replicas=1),
    )
    result = plan(state)
    failovers = {m.task: m for m in result.moves if m.kind is MoveKind.FAILOVER}
    assert list(failovers) == [2, 5]
    # Nobody is caught up: the smallest lag wins (availability first).
    assert failovers[2].destination == "app-1"
    assert failovers[5].destination == "app-1"
    assert "lag 30000 > 10000" in failovers[2].reason
    assert all(len(tasks) for tasks in actives(result).values())


def test_among_caught_up_candidates_a_failover_prefers_the_balanced_target() -> None:
    state = ClusterState(
        range(1),
        [instance("app-0", warmup={0: 10}), instance("app-1", standby={0: 10})],
        KAFKA_STREAMS_DEFAULTS,
    )
    result = plan(state)
    (failover,) = (m for m in result.moves if m.kind is MoveKind.FAILOVER)
    # Both are caught up; the balanced target (app-0, first by id) saves a later move.
    assert failover.destination == result.target[0] == "app-0"


def test_an_instance_that_is_not_ready_receives_warm_ups_but_no_active() -> None:
    state = ClusterState(
        range(2),
        [instance("app-0", [0, 1]), instance("app-1", warmup={1: 0}, ready=False)],
        KAFKA_STREAMS_DEFAULTS,
    )
    result = plan(state)
    assert result.target[1] == "app-1"
    assert moves_of(result) == []
    assert result.assignment["app-1"] == {1: TaskRole.WARMUP}
    assert not result.converged, "no move, but task 1 still waits to go to app-1"


# --- repeated planning --------------------------------------------------------------------------


def test_every_warm_up_behind_means_nothing_moves_and_the_plan_repeats() -> None:
    state = ClusterState(
        range(4),
        [
            instance("app-0", range(4)),
            instance("app-1", warmup={2: 50_000, 3: None}),
        ],
        KAFKA_STREAMS_DEFAULTS,
    )
    first = plan(state)
    assert first.moves == ()
    assert not first.converged, "waiting for the warm-ups is not being done"
    assert plan(state) == first


def test_a_hand_over_in_flight_is_planned_again_not_reversed() -> None:
    state = ClusterState(
        range(2),
        [instance("app-0", [0, 1]), instance("app-1", warmup={1: 3})],
        KAFKA_STREAMS_DEFAULTS,
    )
    first = plan(state)
    assert moves_of(first) == [("hand-over", 1, "app-0", "app-1")]
    # The operator revoked task 1 but app-0 has not acknowledged yet: same facts, same plan.
    assert plan(state) == first


# --- edge cases ---------------------------------------------------------------------------------


def test_more_instances_than_tasks_leaves_some_idle_and_moves_nothing_needlessly() -> None:
    state = ClusterState(
        range(3),
        [instance("app-0", [0, 1, 2])] + [instance(f"app-{i}") for i in range(1, 5)],
        PlannerConfig(num_standby_replicas=1),
    )
    plans = run_until_converged(state)
    final = actives(plans[-1])
    assert sorted(len(tasks) for tasks in final.values()) == [0, 0, 1, 1, 1]
    assert 0 in final["app-0"]
    standbys = Counter(
        i
        for i, roles in plans[-1].assignment.items()
        for r in roles.values()
        if r is TaskRole.STANDBY
    )
    assert sum(standbys.values()) == 3
    assert max(standbys.values()) == 1


def test_scaling_to_zero_releases_every_task_and_drains_every_instance() -> None:
    state = ClusterState(
        range(3),
        [
            instance("app-0", [0, 1], standby={2: 0}, draining=True),
            instance("app-1", [2], warmup={0: 7}, draining=True),
        ],
        KAFKA_STREAMS_DEFAULTS,
    )
    result = plan(state)
    assert result.unassigned == (0, 1, 2)
    assert result.assignment == {"app-0": {}, "app-1": {}}
    assert moves_of(result) == [
        ("release", 0, "app-0", None),
        ("release", 1, "app-0", None),
        ("release", 2, "app-1", None),
        ("drop-warmup", 0, "app-1", None),
        ("drop-standby", 2, "app-0", None),
        ("drained", None, "app-0", None),
        ("drained", None, "app-1", None),
    ]
    assert "scaled to zero" in result.moves[0].reason


def test_no_instance_at_all_leaves_every_task_unassigned() -> None:
    result = plan(ClusterState(range(2), [], KAFKA_STREAMS_DEFAULTS))
    assert result.unassigned == (0, 1)
    assert result.moves == ()


@dataclass(frozen=True)
class Bad:
    state: ClusterState
    complaint: str


@pytest.mark.parametrize(
    "bad",
    [
        Bad(
            ClusterState([0], [instance("a", [0]), instance("b", [0])]),
            "task 0 is active on both 'a' and 'b'",
        ),
        Bad(ClusterState([0], [instance("a", [1])]), "holds task 1, which is not a task"),
        Bad(ClusterState([0], [instance("a"), instance("a")]), "'a' is listed twice"),
        Bad(ClusterState([0], [instance("a", standby={0: -1})]), "reports lag -1 for task 0"),
        Bad(ClusterState([0], [instance("a", force_release=True)]), "is not draining"),
    ],
    ids=["two-actives", "unknown-task", "duplicate-instance", "negative-lag", "force-not-draining"],
)
def test_inconsistent_input_is_refused_with_what_to_fix(bad: Bad) -> None:
    with pytest.raises(ValueError, match=bad.complaint):
        plan(bad.state)


def test_config_that_could_never_move_a_task_is_refused() -> None:
    with pytest.raises(ValueError, match="maxWarmupReplicas is 0"):
        PlannerConfig(max_warmup_replicas=0)


# --- the baselines: Cooperative (no warm-ups) and StopTheWorld ---------------------------


def cooperative(state: ClusterState) -> ClusterState:
    return ClusterState(state.tasks, state.instances, PlannerConfig(moves=TaskMoves.WHEN_READY))


def test_cooperative_moves_nothing_to_a_starting_instance_and_warms_nothing_up() -> None:
    result = plan(cooperative(scale_out_2_to_4()))
    assert moves_of(result) == [], "no warm-up, and no active to a pod that is not ready"
    assert actives(result)["app-2"] == []
    assert actives(result)["app-3"] == []


def test_cooperative_moves_every_task_to_its_target_once_that_is_ready_lag_or_not() -> None:
    state = scale_out_2_to_4()
    ready = [instance(i.id, ready=True) if not i.ready else i for i in state.instances]
    result = plan(cooperative(ClusterState(state.tasks, ready, state.config)))
    owners = {"app-0": [0, 1, 2], "app-2": [3, 4, 5], "app-1": [6, 7, 8], "app-3": [9, 10, 11]}
    assert actives(result) == owners, "no replica of theirs is caught up: they move anyway"
    assert not any(m.kind is MoveKind.START_WARMUP for m in result.moves)


def test_cooperative_scale_in_moves_the_drained_tasks_at_once_to_the_kept_instances() -> None:
    state = ClusterState(
        range(4),
        [instance("app-0", [0, 1]), instance("app-1", [2, 3], draining=True)],
        PlannerConfig(moves=TaskMoves.WHEN_READY),
    )
    result = plan(state)
    assert actives(result) == {"app-0": [0, 1, 2, 3], "app-1": []}
    assert plan(advance(state, result)).converged


def test_stop_the_world_moves_every_task_to_its_balanced_owner_at_once_warm_or_not() -> None:
    state = scale_out_2_to_4()
    eager = ClusterState(
        state.tasks, state.instances, PlannerConfig(moves=TaskMoves.AT_ONCE, max_warmup_replicas=2)
    )
    result = plan(eager)
    owners = {"app-0": [0, 1, 2], "app-2": [3, 4, 5], "app-1": [6, 7, 8], "app-3": [9, 10, 11]}
    assert actives(result) == owners, "the new, not yet ready instances take theirs at once"
    assert not any(m.kind is MoveKind.START_WARMUP for m in result.moves), "no warm-up"
    assert plan(advance(eager, result)).converged, "one plan is the whole move"
