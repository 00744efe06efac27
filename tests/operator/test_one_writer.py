"""One task, one writer, from the operator's side: a pod is its uid, not its name, and two
operator processes acting at once never interleave their writes. Run with the operator's real
control loop and real instances in this process (protocol.py)."""

import itertools
from pathlib import Path
from typing import Any

from devstack.kafka.front import KafkaFront
from smoothscale.api.models import API_VERSION, PLURAL
from smoothscale.kafka import names
from smoothscale.kafka.progress import ProgressReader
from smoothscale.kubeapi import MERGE_PATCH
from smoothscale.operator.ledger import LEDGER_KEY, record_after, record_id
from smoothscale.operator.reconcile import AppController
from tests.operator.in_process import APPS, Platform, create_topics, streaming_app
from tests.operator.protocol import InProcessPods, active_holders, final_counts, produce, reference
from tests.runtime.kafka_helpers import read_committed

TASKS = 2
FAST = {"lagPollInterval": "100ms", "probingInterval": "1s"}


def app_path(source: dict[str, Any]) -> str:
    return f"/apis/{API_VERSION}/namespaces/{APPS}/{PLURAL}/{source['metadata']['name']}"


def test_a_pod_recreated_mid_hand_over_with_the_status_lost_does_not_inherit_its_predecessor(
    platform: Platform, kafka_front: KafkaFront, tmp_path: Path
) -> None:
    """The operator dies in the middle of a hand-over from app-0, its status is lost, and
    app-0's pod is re-created (its process gone with it, the release never sent). The new
    operator must know from Kafka alone that app-0 is another pod now: its predecessor's
    reports confirm nothing, the hand-over ends, every task gets an active owner, and the
    state is exact."""
    source = streaming_app(kafka_front.bootstrap_servers, replicas=1, scaling=FAST)
    create_topics(kafka_front.bootstrap_servers, source, partitions=TASKS)
    name = source["metadata"]["name"]
    topic = source["spec"]["kafka"]["inputTopics"][0]
    platform.apply(source)
    pods = InProcessPods(platform, tmp_path / "pods")
    users = [f"user-{i % 11}" for i in range(400)]
    produce(kafka_front.bootstrap_servers, topic, users[:200], TASKS)
    app_id = f"{APPS}.{name}"
    changelogs = {"counts": names.changelog_topic(app_id, "counts")}
    reader = ProgressReader(kafka_front.bootstrap_servers, app_id, changelogs)
    first = f"{name}-0"

    def run(controller: AppController, until: Any, polls: int = 60) -> None:
        for _ in range(polls):
            controller.poll()
            if until():
                return
            pods.sync()
            pods.feed()
        raise AssertionError(f"not within {polls} polls: {until.__doc__}")

    try:
        operator = platform.controller(source)

        def first_holds_everything() -> bool:
            """app-0 active on every task"""
            return active_holders(reader, pods, TASKS) == {0: first, 1: first}

        run(operator, first_holds_everything)
        platform.admin.request(
            "PATCH", app_path(source), body={"spec": {"replicas": 2}}, content_type=MERGE_PATCH
        )

        def handing_over() -> bool:
            """a hand-over from app-0 under way"""
            ledger = operator.ledger
            return ledger is not None and any(
                owner.handover is not None and owner.handover.source == first
                for owner in ledger.tasks.values()
            )

        run(operator, handing_over)
        # The operator dies; app-0's pod goes, with its process, before it released; the status
        # is wiped (a restore from an old backup would do the same).
        pods.kill(first)
        platform.admin.request("DELETE", f"/api/v1/namespaces/{APPS}/pods/{first}")
        platform.admin.request(
            "PATCH",
            app_path(source) + "/status",
            body={"status": {"tasks": [], "instances": [], "assignmentGeneration": 0}},
            content_type=MERGE_PATCH,
        )
        restarted = platform.controller(source)

        def every_task_active() -> bool:
            """every task active on a current pod, no hand-over in flight"""
            ledger = restarted.ledger
            return (
                ledger is not None
                and all(owner.handover is None for owner in ledger.tasks.values())
                and set(active_holders(reader, pods, TASKS)) == set(range(TASKS))
            )

        run(restarted, every_task_active)
        produce(kafka_front.bootstrap_servers, topic, users[200:], TASKS)
        while pods.feed():
            pass
        state = final_counts(pods)
    finally:
        pods.close()
        reader.close()

    assert state == reference(users)
    replaced = [event for event in platform.events if event[1] == "InstanceReplaced"]
    assert replaced, platform.events


def test_two_operator_processes_acting_at_once_never_interleave_their_writes(
    platform: Platform, kafka_front: KafkaFront, tmp_path: Path
) -> None:
    """Two control loops of the same app poll in turn through a scale-out (a peer that has
    not paused yet beside the leader): each step is read, decide, write, with nobody else's
    write in between: in the assignments topic, each ledger record is decided from the one before
    it, and the scale-out ends exact."""
    source = streaming_app(kafka_front.bootstrap_servers, replicas=1, scaling=FAST)
    create_topics(kafka_front.bootstrap_servers, source, partitions=TASKS)
    name = source["metadata"]["name"]
    topic = source["spec"]["kafka"]["inputTopics"][0]
    app_id = f"{APPS}.{name}"
    platform.apply(source)
    pods = InProcessPods(platform, tmp_path / "pods")
    users = [f"user-{i % 11}" for i in range(300)]
    produce(kafka_front.bootstrap_servers, topic, users[:150], TASKS)
    changelogs = {"counts": names.changelog_topic(app_id, "counts")}
    reader = ProgressReader(kafka_front.bootstrap_servers, app_id, changelogs)
    operators = [platform.controller(source), platform.controller(source)]
    try:

        def balanced() -> bool:
            holders = active_holders(reader, pods, TASKS)
            return len(set(holders.values())) == 2 and set(holders) == set(range(TASKS))

        scaled = False
        for turn in range(80):
            operators[turn % 2].poll()
            pods.sync()
            pods.feed()
            if turn == 6:
                platform.admin.request(
                    "PATCH",
                    app_path(source),
                    body={"spec": {"replicas": 2}},
                    content_type=MERGE_PATCH,
                )
                scaled = True
            if scaled and turn > 10 and balanced():
                break
        else:
            raise AssertionError("the scale-out did not finish")
        produce(kafka_front.bootstrap_servers, topic, users[150:], TASKS)
        while pods.feed():
            pass
        state = final_counts(pods)
    finally:
        pods.close()
        reader.close()

    assert state == reference(users)
    ledgers = [
        message.value() or b""
        for message in read_committed(
            kafka_front.bootstrap_servers, names.assignments_topic(app_id), 1
        )
        if message.key() == LEDGER_KEY
    ]
    for before, record in itertools.pairwise(ledgers):
        assert record_after(record) == record_id(before), "a ledger decided from another"
    assert any(event[1] == "OperatorFenced" for event in platform.events)
