"""What one app costs the operator: `.venv/bin/python benchmarks/operator_cost.py`.

Not a test: it prints the operator's CPU seconds per lag poll of one StreamingApp at 64 tasks
and 8 instances, and so how many such apps one operator process keeps at a 1 s lag poll on
one core. The poll is the operator's own (`AppController.poll`: the spec, the topic check, the
pods, 8 instances' reports, the changelog ends, the plan, the status), against the local API
server and the embedded Kafka, each in a process of its own so that only the operator's CPU is
counted. The instances are simulated on the real report channel (each commits its reports
through `ProgressCommitter` before every poll, as a running instance does every second) and
their pods are marked ready through the status subresource: no Spark runs. Two states are
timed: steady (every task active on its owner), and scaling (8 new instances warming up 64
tasks, with lags). docs/operator-cost.md records the numbers measured on the project's machine
(docs/benchmarks/operator-cost.json).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from devstack.apiserver import write_kubeconfig
from smoothscale.api.models import application_id
from smoothscale.kafka import names
from smoothscale.kafka.progress import ProgressCommitter, ReportedRole, TaskReport
from smoothscale.kubeapi import MERGE_PATCH, KubeApi
from smoothscale.operator.metrics import OperatorMetrics
from smoothscale.operator.policy import AccessPolicy
from smoothscale.operator.reconcile import AppController
from smoothscale.tasks import TaskRole

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
APP = "cost"
STORE = "counts"


def _spawn(arguments: list[str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "smoothscale.cli", "dev", *arguments],
            stdout=subprocess.PIPE,
            stderr=output,
            text=True,
        )


@contextmanager
def control_plane(workdir: Path, tasks: int) -> Iterator[tuple[Path, str]]:
    """The local API server (with the CRDs) and the embedded Kafka, each its own process."""
    with ExitStack() as stack:
        apiserver = _spawn(["apiserver", "--crds", str(ROOT / "crds")], workdir / "apiserver.log")
        stack.callback(apiserver.terminate)
        assert apiserver.stdout is not None
        url = apiserver.stdout.readline().strip()
        kubeconfig = workdir / "kubeconfig"
        write_kubeconfig(kubeconfig, url, NAMESPACE)
        ready = workdir / "kafka.json"
        topics = [f"--topic={APP}-in:{tasks}", f"--topic={APP}-out:{tasks}"]
        kafka = _spawn(
            ["kafka", "--brokers", "1", "--ready-file", str(ready), *topics],
            workdir / "kafka.log",
        )
        stack.callback(kafka.terminate)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if time.monotonic() > deadline or kafka.poll() is not None:
                raise RuntimeError(f"the embedded Kafka did not start: see {workdir}/kafka.log")
            time.sleep(0.1)
        yield kubeconfig, json.loads(ready.read_text())["bootstrap_servers"]


def streaming_app(bootstrap: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "smoothscale.io/v1alpha1",
        "kind": "StreamingApp",
        "metadata": {"name": APP, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "image": "ghcr.io/smoothscale/smoothscale:0.1.0",
            "pipeline": {"ref": "examples.pipelines.running_count:pipeline"},
            "kafka": {
                "bootstrapServers": bootstrap,
                "inputTopics": [f"{APP}-in"],
                "outputTopic": f"{APP}-out",
                "stateStores": [{"name": STORE}],
            },
            "scaling": {"lagPollInterval": "1s"},
        },
    }


class SimulatedInstances:
    """Instances on the real report channel: each reports what it was assigned, as caught up
    (active tasks active at their epoch, warm-ups at a lag), and its pod is ready."""

    def __init__(self, kube: KubeApi, bootstrap: str, app_id: str, lag: int) -> None:
        self.kube = kube
        self.bootstrap = bootstrap
        self.app_id = app_id
        self.lag = lag
        self.stores = {STORE: names.changelog_topic(app_id, STORE)}
        self._committers: dict[str, ProgressCommitter] = {}

    def report(self, controller: AppController) -> None:
        ledger = controller.ledger
        if ledger is None:
            return
        for instance, assignment in sorted(ledger.assignments.items()):
            committer = self._committers.get(instance)
            if committer is None:
                committer = ProgressCommitter(self.bootstrap, self.app_id, instance, self.stores)
                self._committers[instance] = committer
            reports = []
            for task, held in sorted(assignment.tasks.items()):
                active = held.role is TaskRole.ACTIVE
                lag = 0 if active else self.lag
                reports.append(
                    TaskReport(
                        task,
                        ReportedRole.ACTIVE if active else ReportedRole(held.role.value),
                        held.epoch,
                        assignment.generation,
                        {STORE: 0},
                        {f"{APP}-in": 0} if active else None,
                        ends={STORE: lag},
                    )
                )
            committer.commit(reports)

    def ready(self) -> None:
        pods = self.kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
        for pod in pods.get("items") or []:
            conditions = pod.get("status", {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                continue
            status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            self.kube.request(
                "PATCH",
                f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}/status",
                body={"status": status},
                content_type=MERGE_PATCH,
            )

    def close(self) -> None:
        for committer in self._committers.values():
            committer.close()


def time_polls(
    controller: AppController, instances: SimulatedInstances, polls: int
) -> tuple[list[float], list[float]]:
    """CPU seconds and wall seconds of each of `polls` polls (the instances report between)."""
    cpu, wall = [], []
    for _ in range(polls):
        instances.ready()
        instances.report(controller)
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        controller.poll()
        cpu.append(time.process_time() - cpu_start)
        wall.append(time.perf_counter() - wall_start)
    return cpu, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--polls", type=int, default=40, help="timed polls per state")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as scratch,
        control_plane(Path(scratch), args.tasks) as (
            kubeconfig,
            bootstrap,
        ),
    ):
        kube = KubeApi.from_kubeconfig(kubeconfig)
        kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
        app = streaming_app(bootstrap, args.instances)
        created = kube.request(
            "POST", f"/apis/smoothscale.io/v1alpha1/namespaces/{NAMESPACE}/streamingapps", body=app
        )
        app_id = application_id_of(created)
        events: list[tuple[str, str, str]] = []
        controller = AppController(
            kube,
            NAMESPACE,
            name=APP,
            events=lambda *event: events.append(event),
            metrics=OperatorMetrics(),
            policy=AccessPolicy(),
        )
        instances = SimulatedInstances(kube, bootstrap, app_id, lag=0)
        try:
            time_polls(controller, instances, 10)  # topics, pods, first assignments
            steady_cpu, steady_wall = time_polls(controller, instances, args.polls)
            steady_shape = _shape(controller)
            kube.request(
                "PATCH",
                f"/apis/smoothscale.io/v1alpha1/namespaces/{NAMESPACE}/streamingapps/{APP}",
                body={"spec": {"replicas": 2 * args.instances}},
                content_type=MERGE_PATCH,
            )
            instances.lag = 50_000  # every warm-up far behind: nothing moves, all is measured
            time_polls(controller, instances, 3)
            scaling_cpu, scaling_wall = time_polls(controller, instances, args.polls)
            scaling_shape = _shape(controller)
        finally:
            instances.close()
            controller.close()
            kube.close()

    results = {
        "tasks": args.tasks,
        "instances": args.instances,
        "polls": args.polls,
        "steady": {**_summary(steady_cpu, steady_wall), **steady_shape},
        "scaling": {**_summary(scaling_cpu, scaling_wall), **scaling_shape},
    }
    print(f"operator cost of one app, {args.tasks} tasks, {args.instances} instances:")
    for state in ("steady", "scaling"):
        row = results[state]
        print(
            f"  {state:8} CPU {row['cpu_ms_median']:6.1f} ms/poll (p90 {row['cpu_ms_p90']:.1f}), "
            f"wall {row['wall_ms_median']:6.1f} ms/poll -> {row['apps_per_core']:,} apps per "
            f"core at a 1 s lag poll ({row['instances']} instances, {row['active']} tasks "
            f"active, {row['warming']} warm-ups)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def application_id_of(created: dict[str, Any]) -> str:
    from smoothscale.api.models import StreamingApp

    return application_id(StreamingApp.model_validate({**created, "status": None}))


def _shape(controller: AppController) -> dict[str, int]:
    """What the timed polls saw: instances, active tasks, warm-ups."""
    ledger = controller.ledger
    assert ledger is not None, "the operator could not read its memory"
    holdings = [held for a in ledger.assignments.values() for held in a.tasks.values()]
    return {
        "instances": len(ledger.assignments),
        "active": sum(1 for held in holdings if held.role is TaskRole.ACTIVE),
        "warming": sum(1 for held in holdings if held.role is TaskRole.WARMUP),
    }


def _summary(cpu: list[float], wall: list[float]) -> dict[str, float | int]:
    cpu_median = statistics.median(cpu)
    return {
        "cpu_ms_median": round(1000 * cpu_median, 2),
        "cpu_ms_p90": round(1000 * statistics.quantiles(cpu, n=10)[-1], 2),
        "wall_ms_median": round(1000 * statistics.median(wall), 2),
        "apps_per_core": int(1 / cpu_median) if cpu_median > 0 else 0,
    }


if __name__ == "__main__":
    raise SystemExit(main())
