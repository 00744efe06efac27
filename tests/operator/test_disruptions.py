"""Disruptions a cluster imposes are hand-overs: a node drained (cordoned, then its pods
evicted as kubectl drain does it, the budget refusing until the pod holds nothing) and a pod
deleted with a grace period give their tasks away by warm-ups and hand-overs before their pods
go; the eviction API never kills an active owner. The operator's real control loop and real
instances in this process (protocol.py), on an API server with nodes."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from devstack.kafka.front import KafkaFront
from smoothscale.kafka import names
from smoothscale.kafka.progress import ProgressReader
from smoothscale.kubeapi import KubeApiError
from smoothscale.operator import reconcile
from smoothscale.operator.reconcile import AppController
from smoothscale.operator.status import busy
from tests.operator.in_process import APPS, Platform, create_topics, streaming_app
from tests.operator.protocol import InProcessPods, active_holders, final_counts, produce, reference

TASKS = 2
FAST = {"lagPollInterval": "100ms", "probingInterval": "1s"}


def add_nodes(platform: Platform, *names: str) -> None:
    for name in names:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        platform.admin.request("POST", "/api/v1/nodes", body=node)


def node_of(platform: Platform, pod: str) -> str | None:
    found = {p["metadata"]["name"]: p for p in platform.pods()}
    node: str | None = found[pod]["spec"].get("nodeName") if pod in found else None
    return node


def run(controller: AppController, pods: InProcessPods, until: Any, polls: int = 120) -> None:
    for _ in range(polls):
        controller.poll()
        if until():
            return
        pods.sync()
        pods.feed()
    raise AssertionError(f"not within {polls} polls: {until.__doc__}")


@pytest.mark.parametrize("evicting", [True, False], ids=["drained", "cordoned-only"])
def test_a_drained_node_gives_its_tasks_away_by_hand_overs_before_its_pod_goes(
    platform: Platform,
    kafka_front: KafkaFront,
    tmp_path: Path,
    evicting: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`drained`: kubectl drain's evictions take the pod once it holds nothing. `cordoned-only`:
    nothing evicts it (a node cordoned by hand), so the operator deletes it itself once the
    wait for an eviction is over (zero here)."""
    if not evicting:
        monkeypatch.setattr(reconcile, "EVICTION_WAIT", timedelta(0))
    add_nodes(platform, "node-a", "node-b")
    source = streaming_app(kafka_front.bootstrap_servers, replicas=2, scaling=FAST)
    create_topics(kafka_front.bootstrap_servers, source, partitions=TASKS)
    name = source["metadata"]["name"]
    topic = source["spec"]["kafka"]["inputTopics"][0]
    app_id = f"{APPS}.{name}"
    platform.apply(source)
    pods = InProcessPods(platform, tmp_path / "pods")
    controller = platform.controller(source)
    reader = ProgressReader(
        kafka_front.bootstrap_servers, app_id, {"counts": names.changelog_topic(app_id, "counts")}
    )
    users = [f"user-{i % 13}" for i in range(300)]
    produce(kafka_front.bootstrap_servers, topic, users[:150], TASKS)
    try:

        def spread() -> bool:
            """each instance active on one task, on its own node"""
            holders = active_holders(reader, pods, TASKS)
            return len(set(holders.values())) == 2

        run(controller, pods, spread)
        drained = next(pod for pod in sorted(pods.pods) if node_of(platform, pod) == "node-a")
        budget = platform.admin.request(
            "GET", f"/apis/policy/v1/namespaces/{APPS}/poddisruptionbudgets/{name}"
        )
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": drained, "namespace": APPS},
        }
        with pytest.raises(KubeApiError) as refused:
            platform.admin.request(
                "POST", f"/api/v1/namespaces/{APPS}/pods/{drained}/eviction", body=eviction
            )
        # kubectl cordon: what kubectl drain does first.
        platform.admin.request(
            "PATCH",
            "/api/v1/nodes/node-a",
            body={"spec": {"unschedulable": True}},
            content_type="application/merge-patch+json",
        )
        produce(kafka_front.bootstrap_servers, topic, users[150:], TASKS)
        evicted_holding: list[set[int]] = []  # what it held active when its eviction passed

        def evict() -> None:
            """kubectl drain's loop: evict the pod by name until it goes, 429 meanwhile"""
            if evicted_holding or not evicting:
                return
            try:
                platform.admin.request(
                    "POST", f"/api/v1/namespaces/{APPS}/pods/{drained}/eviction", body=eviction
                )
            except KubeApiError as error:
                if error.status != 429:
                    raise
                return
            holders = active_holders(reader, pods, TASKS)
            evicted_holding.append({task for task, pod in holders.items() if pod == drained})

        def off_the_node() -> bool:
            """no pod on node-a, every task active, the surge gone, nothing moving"""
            evict()
            on_a = [
                p["metadata"]["name"]
                for p in platform.pods()
                if p["spec"].get("nodeName") == "node-a"
            ]
            holders = active_holders(reader, pods, TASKS)
            ledger = controller.ledger
            settled = ledger is not None and not busy(ledger)
            return not on_a and len(platform.pods()) == 2 and set(holders) == {0, 1} and settled

        run(controller, pods, off_the_node)
        while pods.feed():
            pass
        state = final_counts(pods)
    finally:
        pods.close()
        reader.close()

    assert budget["spec"]["minAvailable"] == 2, "the app's pods"
    assert refused.value.status == 429
    assert state == reference(users)
    reasons = [reason for _kind, reason, _message in platform.events]
    assert evicted_holding == ([set()] if evicting else []), "evicted once it held nothing"
    assert "NodeDrain" in reasons
    assert "FailedOver" not in reasons, "every task moved by a hand-over"
    assert any("node node-a is being drained (cordoned)" in m for _k, _r, m in platform.events)
    warnings = [event for event in platform.events if event[0] == "Warning"]
    assert not warnings, "a planned roll warns of nothing, however long its pods take to go"


def test_a_pod_deleted_with_a_grace_period_hands_its_tasks_over_before_it_stops(
    platform: Platform, kafka_front: KafkaFront, tmp_path: Path
) -> None:
    add_nodes(platform, "node-a")
    source = streaming_app(kafka_front.bootstrap_servers, replicas=2, scaling=FAST)
    create_topics(kafka_front.bootstrap_servers, source, partitions=TASKS)
    name = source["metadata"]["name"]
    topic = source["spec"]["kafka"]["inputTopics"][0]
    app_id = f"{APPS}.{name}"
    platform.apply(source)
    pods = InProcessPods(platform, tmp_path / "pods")
    controller = platform.controller(source)
    reader = ProgressReader(
        kafka_front.bootstrap_servers, app_id, {"counts": names.changelog_topic(app_id, "counts")}
    )
    users = [f"user-{i % 13}" for i in range(300)]
    produce(kafka_front.bootstrap_servers, topic, users[:150], TASKS)
    deleted = f"{name}-1"
    try:

        def spread() -> bool:
            """each instance active on one task"""
            return len(set(active_holders(reader, pods, TASKS).values())) == 2

        run(controller, pods, spread)
        first_uid = pods.pods[deleted].uid
        # kubectl delete pod: the API server sets deletionTimestamp, the kubelet sends SIGTERM.
        platform.admin.request("DELETE", f"/api/v1/namespaces/{APPS}/pods/{deleted}")
        produce(kafka_front.bootstrap_servers, topic, users[150:], TASKS)

        def replaced() -> bool:
            """the deleted pod re-created, every task active, nothing moving"""
            again = pods.pods.get(deleted)
            holders = active_holders(reader, pods, TASKS)
            ledger = controller.ledger
            return (
                again is not None
                and again.uid != first_uid
                and set(holders) == {0, 1}
                and ledger is not None
                and not busy(ledger)
            )

        run(controller, pods, replaced)
        while pods.feed():
            pass
        state = final_counts(pods)
    finally:
        pods.close()
        reader.close()

    assert state == reference(users)
    reasons = [reason for _kind, reason, _message in platform.events]
    assert "FailedOver" not in reasons, "its tasks moved by a hand-over"
    assert "HandedOver" in reasons
