"""Disruptions a cluster imposes, end to end: the operator installed with its chart, instance
pods on the local control plane's nodes, the real kubectl. A node drained with `kubectl drain`
and an owner whose pipeline hangs; each ends with the one checker (every output record against
the reference, the ownership timeline: never two active owners) and prints its longest pause.
The protocol worker runs the pods (their subject is the operator's hand-overs and failovers,
not Spark: devstack/protocolworker.py)."""

import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from devstack.demo.scenario import (
    CHANGELOG_TOPIC,
    INPUT_TOPIC,
    NAMESPACE,
    QUIET,
    Session,
    session,
)
from smoothscale.runtime.worker import EXIT_BATCH_UNFINISHED
from tests.operator.test_scaling import options, start_steady

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def pods_by_node(running: Session) -> dict[str, str]:
    """The app's pods that are not terminating, by name: the node each is bound to."""
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    return {
        pod["metadata"]["name"]: pod["spec"].get("nodeName", "")
        for pod in listing["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }


def pod_uids(running: Session) -> dict[str, str]:
    """The app's pods that are not terminating, by name: their uid."""
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    return {
        pod["metadata"]["name"]: pod["metadata"]["uid"]
        for pod in listing["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }


def restarted(running: Session) -> dict[str, dict[str, Any]]:
    """The app's pods whose container was restarted: how its last run ended (its
    lastState.terminated)."""
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    return {
        pod["metadata"]["name"]: container["lastState"]["terminated"]
        for pod in listing["items"]
        for container in pod.get("status", {}).get("containerStatuses") or []
        if int(container.get("restartCount", 0)) > 0
        and "terminated" in (container.get("lastState") or {})
    }


def test_kubectl_drain_of_a_node_moves_its_instance_by_warm_ups_and_hand_overs(
    tmp_path: Path,
) -> None:
    """Three nodes; the operator on one, an instance on each of the others. `kubectl drain`
    of an instance's node: its evictions are refused (the app's PodDisruptionBudget) while the
    operator, seeing the node cordoned, warms the pod's tasks up on a surge pod elsewhere,
    hands them over and leaves the pod to the drain's eviction; the drain completes, the pod is
    re-created on another node, and every task moved by a hand-over, exactly."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False, nodes=3), out) as running:
        watcher = running.watcher
        start_steady(running, replicas=2)
        watcher.hold()
        operator_node = running.operator.pod()["spec"]["nodeName"]
        placed = pods_by_node(running)
        pod, node = next((p, n) for p, n in sorted(placed.items()) if n != operator_node)
        running.say(f"pods by node: {placed}, the operator on {operator_node}; draining {node}")
        drain_out, drain_err = tmp_path / "drain.out", tmp_path / "drain.err"
        with running.phase("node drain"), drain_out.open("w") as stdout:
            with drain_err.open("w") as stderr:
                draining = subprocess.Popen(
                    [
                        running.kubectl.binary, "drain", node, "--ignore-daemonsets",
                        "--delete-emptydir-data", "--timeout=600s",
                    ],
                    stdout=stdout,
                    stderr=stderr,
                    env={**os.environ, "KUBECONFIG": str(running.kubectl.kubeconfig)},
                )  # fmt: skip
                try:
                    watcher.run_until(lambda: draining.poll() is not None, "the drain")
                finally:
                    if draining.poll() is None:
                        draining.kill()
            watcher.run_until(lambda: watcher.settled(2), "two instances again")
            watcher.hold()
        output, errors = drain_out.read_text(), drain_err.read_text()
        running.say(f"kubectl drain said:\n{output}{errors}")
        story = out.getvalue()
        assert draining.returncode == 0, story
        assert f"evicting pod {NAMESPACE}/{pod}" in output
        assert "would violate the pod's disruption budget" in errors, "the budget held it"
        assert output.rstrip().endswith(f"node/{node} drained"), output
        assert node not in pods_by_node(running).values(), "nothing left on the drained node"
        assert "event NodeDrain" in story
        assert "event HandedOver" in story
        assert "FailedOver" not in story, "every task moved by a hand-over"
        assert "warning " not in story, "a drain is planned: nothing to warn of"
        assert running.finish(), out.getvalue()


HANGING_USER = "user-hangs"


def test_an_owner_whose_pipeline_hangs_loses_its_tasks_and_the_kubelet_restarts_it(
    tmp_path: Path,
) -> None:
    """The pipeline's `apply` blocks for ever on one key in the first instance that meets it
    (tests/operator/hanging_count.py): that instance's micro-batch runs past the stall timeout,
    it reports itself stalled, the operator fails its tasks over at once with a Warning, its
    liveness probe fails and the kubelet restarts it; the restarted instance gets tasks again,
    and nothing is lost or applied twice (the hung batch never commits)."""
    marker = tmp_path / "hung-once"
    hanging = options(
        tmp_path,
        spark=False,
        pipeline="tests.operator.hanging_count:pipeline",
        stall_timeout=5.0,
        env=(
            {"name": "HANG_KEY", "value": HANGING_USER},
            {"name": "HANG_MARKER", "value": str(marker)},
        ),
    )
    out = io.StringIO()
    with session(hanging, out) as running:
        watcher = running.watcher
        start_steady(running, replicas=2)
        watcher.hold()
        with running.phase("an owner hangs"):
            producer = Producer({"bootstrap.servers": running.bootstrap, **QUIET})
            user = json.dumps({"user": HANGING_USER})
            producer.produce(INPUT_TOPIC, key=HANGING_USER, value=user)
            producer.flush(30)
            running.say(f"one record of {HANGING_USER}: its owner's apply hangs")
            watcher.run_until(lambda: "warning InstanceStalled" in out.getvalue(), "the stall")
            watcher.run_until(lambda: restarted(running), "the kubelet's restart")
            watcher.run_until(lambda: watcher.settled(2), "two instances again")
        story = out.getvalue()
        (ended,) = restarted(running).values()
        assert marker.exists(), "an apply hung"
        assert story.count("warning InstanceStalled") == 1, story
        assert "warning FailedOver" in story, story
        # It stopped at once on the kubelet's SIGTERM, not SIGKILLed a grace period later.
        assert ended["exitCode"] == EXIT_BATCH_UNFINISHED, ended
        assert running.finish(), out.getvalue()


def active_tasks(running: Session) -> set[int]:
    """The tasks the app's status shows with an active owner."""
    return {
        int(task["task"])
        for task in running.watcher.status.get("tasks") or []
        if any(holder["role"] == "active" for holder in task.get("holders") or [])
    }


def degraded_reason(running: Session) -> str | None:
    conditions = {c["type"]: c for c in running.watcher.status.get("conditions") or []}
    degraded = conditions.get("Degraded", {})
    return str(degraded["reason"]) if degraded.get("status") == "True" else None


def set_changelog_policy(running: Session, policy: str) -> None:
    admin = AdminClient({"bootstrap.servers": running.bootstrap, **QUIET})
    changelog = ConfigResource("topic", CHANGELOG_TOPIC)
    changelog.add_incremental_config(
        ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
    )
    admin.incremental_alter_configs([changelog])[changelog].result(30)
    running.say(f"cleanup.policy={policy} on {CHANGELOG_TOPIC}")


def test_input_partitions_added_while_it_runs_become_new_tasks_with_owners(
    tmp_path: Path,
) -> None:
    """Two partitions added to the input topic (CreatePartitions, as a person does with their
    Kafka tools) under steady input, with new users sent to them: the operator grows the
    changelog to match (Event ChangelogGrown), the two new tasks get owners and process from
    their first record, and the running tasks go on without a pause beyond their usual
    micro-batches. Then a topic problem that needs a person (the changelog's retention set to
    delete): the app is Degraded, and a pod deleted meanwhile still hands its tasks over and
    comes back. Nothing lost or applied twice."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running, replicas=2)
        watcher.hold()
        before = running.options.tasks
        with running.phase("input partitions added"):
            grown_at = time.time()
            running.grow_input(before + 2, keys=100)
            watcher.run_until(
                lambda: active_tasks(running) == set(range(before + 2)), "the new tasks owned"
            )
            watcher.run_until(lambda: watcher.settled(2), "two instances settled")
            watcher.hold()
        grown = out.getvalue()
        with running.phase("a topic problem, and a pod deleted"):
            set_changelog_policy(running, "delete")
            watcher.run_until(lambda: degraded_reason(running) == "ChangelogRetention", "Degraded")
            deleted = pod_uids(running)["counts-1"]
            running.kubectl("delete", "pod", "-n", NAMESPACE, "counts-1", "--wait=false")
            watcher.run_until(
                lambda: (
                    pod_uids(running).get("counts-1", deleted) != deleted
                    and active_tasks(running) == set(range(before + 2))
                ),
                "the deleted pod's tasks handed over, the pod back",
            )
            assert degraded_reason(running) == "ChangelogRetention", "still Degraded meanwhile"
            set_changelog_policy(running, "compact")
            watcher.run_until(lambda: watcher.settled(2), "Running again")
        assert "event ChangelogGrown" in grown, grown
        assert "warning " not in grown, "partitions added are planned: nothing to warn of"
        assert "warning ChangelogRetention" in out.getvalue()
        assert running.finish(), out.getvalue()
        timelines = running.timelines
        assert len(timelines) == before + 2
        (_, start, end) = running.phases[0]
        running_longest = max(timelines[t].longest_pause(start, end) for t in range(before))
        first_batches = [
            min(t for t in timelines[task].commits if t > grown_at) - grown_at
            for task in range(before, before + 2)
        ]
        running.say(
            f"running tasks' longest pause {running_longest:.1f} s; the new tasks' first batch "
            f"{max(first_batches):.1f} s after the partitions were added"
        )
        assert all(timelines[task].processed(start, end) > 0 for task in range(before, before + 2))
