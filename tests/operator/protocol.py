"""The hand-over protocol end to end in this process: the operator's real control loop
(`AppController`, with the chart's RBAC against the local API server, see in_process.py) and
real instances (`Instance`: stores, changelogs, transactions, restore loop, reports) for the
pods it creates, on the Kafka front, which fences producers as Kafka does. No kubelet and no
Spark: a pod is an `Instance` this process runs, and a micro-batch is `feed` (the running
count, computed here instead of in Spark). Deterministic, and seconds instead of minutes, for
the orderings a scenario with real processes can only hope to hit.
"""

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from smoothscale.kafka.progress import ProgressReader, ReportedRole
from smoothscale.runtime.config import CONFIG_ENV, WorkerConfig
from smoothscale.runtime.instance import Instance
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.pipeline import load_pipeline
from tests.operator.in_process import APPS, Platform
from tests.runtime.instance_helpers import feed

GRACE_SYNCS = 30
"""How many syncs a deleted pod's instance goes on serving before it is stopped anyway."""
LINGER_SYNCS = 2
"""How many syncs a deleted pod's object stays, terminating, after its instance stopped: a
kubelet reports the container gone, and the object goes, a moment after the process exits."""


@dataclass
class Pod:
    name: str
    uid: str
    instance: Instance
    terminating: int = 0
    """Syncs since its pod was deleted with a grace period."""


@dataclass
class InProcessPods:
    """Runs an `Instance` for every pod of the app, as a kubelet would run its container."""

    platform: Platform
    root: Path
    pods: dict[str, Pod] = field(default_factory=dict)
    """By pod name, the instance running for its current pod."""
    leaving: dict[str, int] = field(default_factory=dict)
    """By pod name, the deleted pods whose instance stopped: syncs until the object goes."""

    def sync(self) -> None:
        """Start an instance for each new pod (marked Ready: no Spark to wait for), and stop
        the instance of each pod deleted, as a kubelet and the worker do: a pod deleted with a
        grace period keeps running while it holds active tasks (the operator hands them over),
        then stops (at most GRACE_SYNCS syncs after the delete) and its object goes
        LINGER_SYNCS syncs later."""
        objects = {pod["metadata"]["name"]: pod for pod in self.platform.pods()}
        for name, left in list(self.leaving.items()):
            if left > 0:
                self.leaving[name] = left - 1
                continue
            del self.leaving[name]
            if objects.pop(name, None) is not None:
                self.platform.admin.request(
                    "DELETE", f"/api/v1/namespaces/{APPS}/pods/{name}?gracePeriodSeconds=0"
                )
        for name, running in list(self.pods.items()):
            pod = objects.get(name, {})
            if pod.get("metadata", {}).get("uid") != running.uid:
                running.instance.shutdown(timeout=10)
                del self.pods[name]
            elif pod["metadata"].get("deletionTimestamp"):
                running.terminating += 1
                if running.instance.active_tasks() and running.terminating < GRACE_SYNCS:
                    continue
                running.instance.shutdown(timeout=10)
                del self.pods[name]
                self.leaving[name] = LINGER_SYNCS
        for name, pod in sorted(objects.items()):
            if name not in self.pods and name not in self.leaving:
                self.pods[name] = self._start(pod)

    def _schedule(self, pod: dict[str, Any]) -> None:
        """Bind the pod to the schedulable node with the fewest pods, as a scheduler would
        (when the cluster has nodes)."""
        nodes = self.platform.admin.request("GET", "/api/v1/nodes")["items"]
        usable = [
            n["metadata"]["name"] for n in nodes if not n.get("spec", {}).get("unschedulable")
        ]
        if not usable:
            return
        bound = [p.get("spec", {}).get("nodeName") for p in self.platform.pods()]
        node = min(usable, key=lambda name: (bound.count(name), name))
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod["metadata"]["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.platform.admin.request(
            "POST",
            f"/api/v1/namespaces/{APPS}/pods/{pod['metadata']['name']}/binding",
            body=binding,
        )

    def _start(self, pod: dict[str, Any]) -> Pod:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        if not pod.get("spec", {}).get("nodeName"):
            self._schedule(pod)
        [container] = pod["spec"]["containers"]
        rendered = next(e["value"] for e in container["env"] if e["name"] == CONFIG_ENV)
        config = WorkerConfig.model_validate(
            {
                **json.loads(rendered),
                "instance_uid": uid,
                "state_dir": str(self.root / uid),  # the pod's own disk
                "metrics_port": 0,
                "report_interval": 0.2,
            }
        )
        config.state_dir.mkdir(parents=True, exist_ok=True)
        instance = Instance(
            config, load_pipeline(config.pipeline), InstanceMetrics(), config.state_dir / "plan"
        )
        instance.start(first_assignment_timeout=0.5)
        ready = {"type": "Ready", "status": "True"}
        self.platform.set_pod_status(name, {"phase": "Running", "conditions": [ready]})
        return Pod(name, uid, instance)

    def feed(self) -> int:
        """One micro-batch on every instance; the records they read."""
        return sum(feed(pod.instance) for pod in self.pods.values())

    def kill(self, name: str) -> Instance:
        """Stop the pod's process at once (no release, no report), leaving its pod object."""
        instance = self.pods.pop(name).instance
        held, done = threading.Event(), threading.Event()

        def hold() -> None:
            with instance.lock:
                held.set()
                done.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        try:
            instance.shutdown(timeout=0.01)
        finally:
            done.set()
            holder.join()
        return instance

    def close(self) -> None:
        for pod in self.pods.values():
            pod.instance.shutdown(timeout=10)
        self.pods.clear()


def produce(bootstrap: str, topic: str, users: list[str], partitions: int) -> None:
    """One running-count record per user, each to the partition its name picks."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for user in users:
        producer.produce(
            topic,
            key=user.encode(),
            value=json.dumps({"user": user}).encode(),
            partition=sum(user.encode()) % partitions,
        )
    producer.flush(10)


def final_counts(pods: InProcessPods) -> dict[str, int]:
    """The state of every task, from the instances that hold it active."""
    state: dict[str, int] = {}
    for pod in pods.pods.values():
        for task in pod.instance.active_tasks():
            state.update(pod.instance.state_snapshot(task))
    return state


def active_holders(reader: ProgressReader, pods: InProcessPods, tasks: int) -> dict[int, str]:
    """Per task, the running pod whose own report (its uid's) says it holds it active."""
    uids = {name: pod.uid for name, pod in pods.pods.items()}
    reports = reader.read(sorted(uids), tasks)
    return {
        task: name
        for (name, task), progress in reports.items()
        if progress.report.role is ReportedRole.ACTIVE and progress.report.uid == uids[name]
    }


def reference(users: list[str]) -> dict[str, int]:
    return dict(Counter(users))
