"""What the tests need around plan(): random cluster states, and the operator's part of a round.

`advance` plays the operator and the instances between two planning rounds the simple way:
the plan is carried out, drained instances are deleted, every pod is ready and every replica
has caught up (lag 0) by the next poll.
"""

from hypothesis import strategies as st

from smoothscale.planner import (
    ClusterState,
    Instance,
    InstanceId,
    Move,
    MoveKind,
    Plan,
    PlannerConfig,
)
from smoothscale.tasks import TaskId, TaskRole

Roles = dict[InstanceId, dict[TaskId, TaskRole]]


def name(index: int) -> InstanceId:
    return f"app-{index}"


def roles_of(state: ClusterState) -> Roles:
    return {instance.id: dict(instance.roles) for instance in state.instances}


def advance(state: ClusterState, plan: Plan) -> ClusterState:
    instances = [
        Instance(
            instance.id,
            ready=True,
            draining=instance.draining,
            force_release=instance.force_release,
            roles=plan.assignment[instance.id],
            lags=dict.fromkeys(plan.assignment[instance.id], 0),
        )
        for instance in state.instances
        if not (instance.draining and not plan.assignment[instance.id])
    ]
    return ClusterState(state.tasks, instances, state.config)


def apply_moves(observed: Roles, moves: tuple[Move, ...]) -> Roles:
    """The roles after carrying out `moves` one by one, as their kinds say."""
    roles = {instance: dict(held) for instance, held in observed.items()}
    for move in moves:
        if move.kind is MoveKind.DRAINED:
            continue
        assert move.task is not None
        if move.source is not None:
            del roles[move.source][move.task]
        if move.destination is not None:
            role = {
                MoveKind.FAILOVER: TaskRole.ACTIVE,
                MoveKind.HAND_OVER: TaskRole.ACTIVE,
                MoveKind.START_WARMUP: TaskRole.WARMUP,
                MoveKind.START_STANDBY: TaskRole.STANDBY,
            }[move.kind]
            roles[move.destination][move.task] = role
    return roles


_REPLICA_ROLES = st.sampled_from([None, None, None, TaskRole.STANDBY, TaskRole.WARMUP])
_LAGS = st.none() | st.integers(0, 30_000)


@st.composite
def configs(draw: st.DrawFn) -> PlannerConfig:
    return PlannerConfig(
        acceptable_recovery_lag=draw(st.sampled_from([0, 100, 10_000])),
        max_warmup_replicas=draw(st.integers(1, 3)),
        num_standby_replicas=draw(st.integers(0, 2)),
    )


@st.composite
def cluster_states(
    draw: st.DrawFn, max_tasks: int = 14, max_instances: int = 6, orphans: bool = True
) -> ClusterState:
    """Any consistent observed state: one active at most per task, any replicas and lags."""
    task_count = draw(st.integers(0, max_tasks))
    ids = [name(i) for i in range(draw(st.integers(0, max_instances)))]
    roles: Roles = {i: {} for i in ids}
    lags: dict[InstanceId, dict[TaskId, int]] = {i: {} for i in ids}
    for task in range(task_count):
        if not ids:
            break
        owners = st.sampled_from(ids)
        owner = draw(st.none() | owners) if orphans else draw(owners)
        if owner is not None:
            roles[owner][task] = TaskRole.ACTIVE
        for instance in ids:
            if instance == owner:
                continue
            role = draw(_REPLICA_ROLES)
            if role is not None:
                roles[instance][task] = role
            lag = draw(_LAGS) if role is not None else None
            if lag is not None:
                lags[instance][task] = lag
    instances = []
    for instance in ids:
        draining = draw(st.booleans())
        instances.append(
            Instance(
                instance,
                ready=draw(st.booleans()),
                draining=draining,
                force_release=draining and draw(st.booleans()),
                roles=roles[instance],
                lags=lags[instance],
            )
        )
    return ClusterState(list(range(task_count)), instances, draw(configs()))
