"""Time plan() on large apps: `.venv/bin/python benchmarks/planner.py`.

Not a test: it prints how long one planning round takes (the median of a few runs) for
scale-out, scale-in and failover states at 1,000 tasks x 50 instances and 10,000 tasks x 500
instances. docs/planner.md records the numbers measured on the project's machine.
"""

import argparse
import statistics
import time
from collections.abc import Callable

from smoothscale.planner import ClusterState, Instance, PlannerConfig, plan
from smoothscale.tasks import TaskRole

SIZES = ((1_000, 50), (10_000, 500))
"""(tasks, instances) to time."""


def _config() -> PlannerConfig:
    return PlannerConfig(
        acceptable_recovery_lag=10_000, max_warmup_replicas=2, num_standby_replicas=1
    )


def _name(index: int) -> str:
    return f"app-{index:04d}"


def _steady(tasks: int, instances: int) -> list[Instance]:
    """Tasks spread round-robin over the instances, each with one caught-up standby."""
    roles: list[dict[int, TaskRole]] = [{} for _ in range(instances)]
    lags: list[dict[int, int]] = [{} for _ in range(instances)]
    for task in range(tasks):
        owner = task % instances
        standby = (owner + 1) % instances
        roles[owner][task] = TaskRole.ACTIVE
        lags[owner][task] = 0
        roles[standby][task] = TaskRole.STANDBY
        lags[standby][task] = task % 50
    return [Instance(_name(i), roles=roles[i], lags=lags[i]) for i in range(instances)]


def scale_out(tasks: int, instances: int) -> ClusterState:
    """Half the instances hold everything; the other half just started, with no state."""
    old = _steady(tasks, instances // 2)
    new = [Instance(_name(i), ready=False) for i in range(instances // 2, instances)]
    return ClusterState(list(range(tasks)), old + new, _config())


def scale_in(tasks: int, instances: int) -> ClusterState:
    """Every instance holds its share; the upper half is being drained."""
    steady = _steady(tasks, instances)
    drained = [
        Instance(i.id, draining=True, roles=i.roles, lags=i.lags) for i in steady[instances // 2 :]
    ]
    return ClusterState(list(range(tasks)), steady[: instances // 2] + drained, _config())


def failover(tasks: int, instances: int) -> ClusterState:
    """A tenth of the instances are gone: their tasks have no live owner."""
    steady = _steady(tasks, instances)
    return ClusterState(list(range(tasks)), steady[instances // 10 :], _config())


SCENARIOS: dict[str, Callable[[int, int], ClusterState]] = {
    "scale-out": scale_out,
    "scale-in": scale_in,
    "failover": failover,
}


def _median_ms(state: ClusterState, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        plan(state)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per case (the median is shown)")
    runs = parser.parse_args().runs
    print(f"{'tasks x instances':>18}  {'scenario':<10} {'median ms':>10}")
    for tasks, instances in SIZES:
        for name, build in SCENARIOS.items():
            milliseconds = _median_ms(build(tasks, instances), runs)
            print(f"{tasks:>8} x {instances:<7}  {name:<10} {milliseconds:>10.1f}")


if __name__ == "__main__":
    main()
