"""Scaling through the operator with real worker pods, in the ways users and failures mix it up:
scaling again in the middle of a scale, to zero and back, the operator killed (and its status
wiped) in the middle of a hand-over, an active pod killed, the app deleted mid-scale. Each ends
with the final state exact and, by the ownership timeline the instances wrote, no task ever
processed by two instances at once.

Scenarios about the runtime run Spark workers; those about the hand-over protocol
(`spark=False`) run the protocol worker, the same worker without a Spark driver
(devstack/protocolworker.py).
"""

import io
import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from devstack.demo.scenario import (
    APP_ID,
    APP_NAME,
    NAMESPACE,
    PEERING,
    STORE,
    DemoOptions,
    Session,
    session,
    signal_pod,
)
from smoothscale.api.models import TaskStatus
from smoothscale.kafka import names
from smoothscale.kafka.progress import ProgressReader, ReportedRole, TaskProgress
from tests.operator.status_stream import handing_over, status_stream

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def options(tmp_path: Path, **changes: Any) -> DemoOptions:
    small = DemoOptions(
        workdir=tmp_path,
        tasks=4,
        keys=400,
        backlog=4_000,
        rate=200,
        hold=3,
        phase_timeout=300,
        examples_root=ROOT,
    )
    return replace(small, **changes)


def pods(running: Session) -> list[str]:
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    return sorted(pod["metadata"]["name"] for pod in listing["items"])


def start_steady(running: Session, replicas: int = 1) -> None:
    """The app applied with `replicas`, running, and the steady input started."""
    running.apply(replicas=replicas)
    running.watcher.run_until(
        lambda: running.watcher.settled(replicas), f"{replicas} instance(s) running"
    )
    running.feed.start()


def moving(running: Session) -> bool:
    """A warm-up or a hand-over is under way."""
    status = running.watcher.status
    return bool(status.get("warmupReplicas")) or handing_over(status)


def test_scaling_back_in_the_middle_of_a_scale_out_then_to_zero_and_up_again(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)

        running.scale(2)
        watcher.run_until(lambda: moving(running), "a warm-up on the new pod")
        running.scale(1)  # changed our mind mid-scale: re-plan from where things are
        watcher.run_until(lambda: watcher.settled(1), "back to one instance")
        watcher.run_until(lambda: pods(running) == [f"{APP_NAME}-0"], "the drained pod gone")

        running.scale(0)
        watcher.run_until(
            lambda: watcher.status.get("replicas") == 0 and not pods(running), "zero instances"
        )
        story = out.getvalue()
        assert "ScaledToZero" in json.dumps(watcher.status), story

        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "running again from the changelogs")
        assert running.finish(), out.getvalue()


def wipe_status(running: Session) -> None:
    """The app's status lost (restored from a backup without it, or by GitOps): the operator
    must rebuild who holds what from its ledger and the instances' reports."""
    running.kubectl(
        "patch", "-n", NAMESPACE, "streamingapp", APP_NAME, "--subresource=status",
        "--type=merge", "-p",
        json.dumps({"status": {"tasks": [], "instances": [], "assignmentGeneration": 0}}),
    )  # fmt: skip


def test_the_operator_killed_mid_hand_over_and_its_status_wiped_resumes_exactly(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        with status_stream(running) as stream:
            running.scale(2)
            stream.wait(handing_over, "a hand-over in flight")
            running.restart_operator()
        wipe_status(running)
        watcher.run_until(lambda: watcher.settled(2), "the scale-out finished by the new operator")
        running.restart_operator()
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "the scale-in")
        watcher.run_until(lambda: pods(running) == [f"{APP_NAME}-0"], "the drained pod gone")
        assert running.finish(), out.getvalue()


POD_ADDRESS = {
    "name": "SMOOTHSCALE_LISTEN_ADDRESS",
    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
}
"""The instance's endpoints on its pod's own IP: pods here share the machine's network, and a
process that outlives its pod would otherwise hold the port its same-name successor needs."""


def test_the_operator_lost_its_status_wiped_and_the_releasing_pod_re_created_mid_hand_over(
    tmp_path: Path,
) -> None:
    """Issue 19.7 (c): in the middle of a hand-over from the first pod, the operator's pod is
    lost, the app's status wiped, and the releasing pod force-deleted (its process lives out
    its grace period, as under a real kubelet). The operator comes back with nothing but its
    ledger and the instances' reports: the re-created pod (same name, new uid) inherits no
    ownership from its predecessor's reports, every hand-over ends, and the scale-out finishes
    exact, never two owners, every output checked. The pods listen on their own IPs: the
    force-deleted pod's process holds its port until its grace period ends."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False, env=(POD_ADDRESS,)), out) as running:
        watcher = running.watcher
        start_steady(running)
        releasing = f"{APP_NAME}-0"
        with status_stream(running) as stream:
            running.scale(2)
            stream.wait(handing_over, "a hand-over in flight")
            running.operator.lose()
        before = pod_uids(running)[releasing]
        wipe_status(running)
        running.kubectl("delete", "pod", "-n", NAMESPACE, releasing, "--grace-period=0", "--force")
        running.operator.resume()

        def re_created() -> bool:
            return pod_uids(running).get(releasing) not in (None, before)

        watcher.run_until(re_created, f"{releasing} re-created under its name")
        watcher.run_until(lambda: watcher.settled(2), "the scale-out finished")
        assert not handing_over(watcher.status), "every hand-over ended"
        assert running.finish(), out.getvalue()


def test_a_drain_that_times_out_moves_the_tasks_anyway_with_a_warning(tmp_path: Path) -> None:
    out = io.StringIO()
    with session(options(tmp_path, drain_timeout=0.5, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running, replicas=2)
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "the scale-in")
        watcher.run_until(lambda: pods(running) == [f"{APP_NAME}-0"], "the drained pod gone")
        story = out.getvalue()
        assert "warning DrainTimeout" in story, story
        assert running.finish(), out.getvalue()


def test_a_fresh_pod_warms_up_from_a_compacted_changelog_and_takes_over_exactly(
    tmp_path: Path,
) -> None:
    """Issue 9: hand tasks over several times, let Kafka's cleaner compact the changelog (the
    Kafka front rewrites it the way the cleaner does, offsets kept), then a fresh pod restores
    from the compacted log, takes tasks over, and the final state is exact. The restore, the
    fold and the commits after it are the instance's, the same in both workers: its pods run
    the protocol worker (with Spark, its five pod starts took six minutes of the gate)."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        for replicas in (2, 1, 2, 1):  # every task changes owner (and epoch) several times
            running.scale(replicas)
            watcher.run_until(lambda r=replicas: watcher.settled(r), f"{replicas} instances")
            gone = [f"{APP_NAME}-{n}" for n in range(replicas)]
            watcher.run_until(lambda g=gone: pods(running) == g, "the drained pod gone")
        changelog = names.changelog_topic(APP_ID, STORE)
        running.kafka.compact(changelog)
        running.say(f"compacted {changelog} as Kafka's log cleaner would")
        running.scale(2)  # counts-1 is a new pod: its empty disk restores from the compacted log
        watcher.run_until(lambda: watcher.settled(2), "the fresh pod taking tasks over")
        fresh = next(i for i in watcher.status["instances"] if i["name"] == f"{APP_NAME}-1")
        assert fresh["activeTasks"] == 2, out.getvalue()
        assert running.finish(), out.getvalue()


@pytest.mark.spark
def test_under_a_sustained_load_a_small_acceptable_lag_still_lets_tasks_move(
    tmp_path: Path,
) -> None:
    """Issue 9.5: the owner writes its changelog as fast as it processes; a warm-up that keeps
    pace reports its lag against the end it saw with its position, so with
    acceptableRecoveryLag 1000 it is caught up and the tasks move."""
    busy = options(tmp_path, acceptable_recovery_lag=1_000, rate=3_000, keys=30_000)
    out = io.StringIO()
    with session(busy, out) as running:
        watcher = running.watcher
        start_steady(running)
        watcher.hold()
        running.scale(2)
        watcher.run_until(lambda: watcher.settled(2), "the scale-out")
        watcher.run_until(lambda: out.getvalue().count("HandedOver") >= 2, "two hand-overs")
        assert running.finish(), out.getvalue()


def test_the_app_deleted_mid_scale_releases_its_tasks_and_resumes_exactly_when_reapplied(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        running.scale(2)
        watcher.run_until(lambda: moving(running), "a warm-up on the new pod")

        running.kubectl("delete", "-n", NAMESPACE, "streamingapp", APP_NAME, "--timeout=120s")

        assert pods(running) == [], "the finalizer holds the app until its pods are gone"
        events = json.loads(running.kubectl("get", "-n", NAMESPACE, "events", "-o", "json"))
        reasons = {event.get("reason") for event in events["items"]}
        assert "Released" in reasons, out.getvalue()
        topics = AdminClient({"bootstrap.servers": running.bootstrap}).list_topics(timeout=10)
        assert names.changelog_topic(APP_ID, STORE) in topics.topics, "the changelog is kept"

        running.apply(replicas=1)  # re-created: it resumes from the changelogs
        watcher.run_until(lambda: watcher.settled(1), "the re-created app running")
        assert running.finish(), out.getvalue()


@pytest.mark.spark
def test_an_active_pod_killed_mid_batch_fails_its_tasks_over_at_once_exactly(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    with session(options(tmp_path), out) as running:
        watcher = running.watcher
        start_steady(running, replicas=2)
        watcher.hold()

        # Force-deleted: the pod object goes at once and its tasks fail over, but its process
        # lives out its grace period (as under a real kubelet), finishing the batch in flight:
        # Kafka must fence it, or it commits after its successor's marker (two owners).
        victim = f"{APP_NAME}-1"
        with running.phase("failover"):
            running.kubectl("delete", "pod", "-n", NAMESPACE, victim, "--grace-period=0", "--force")
            watcher.run_until(lambda: "warning FailedOver" in out.getvalue(), "the failover")
            watcher.run_until(lambda: watcher.settled(2), "two instances again")
            watcher.hold()
        story = out.getvalue()
        assert "warning FailedOver" in story.split("--force")[1], "a Warning Event says so"
        assert running.finish(), out.getvalue()


def test_a_frozen_owner_thawed_after_its_same_name_successor_took_over_writes_nothing(
    tmp_path: Path,
) -> None:
    """The active pod's process frozen (SIGSTOP: a node cut off, a stop-the-world pause), its
    pod force-deleted; the operator creates the pod again under the same name (a new uid) and
    its tasks fail over to that successor, which processes them. Then the old process is
    thawed (SIGCONT), still following the assignments of its name: it finds them meant for
    another pod and stops without committing (or Kafka fences it). Exact, never two owners."""
    out = io.StringIO()
    frozen = options(tmp_path, spark=False, env=(POD_ADDRESS,), termination_grace_seconds=300)
    with session(frozen, out) as running:
        watcher = running.watcher
        start_steady(running)
        watcher.hold()
        victim = f"{APP_NAME}-0"
        old = json.loads(
            running.kubectl("get", "pod", "-n", NAMESPACE, victim, "-o", "json", quiet=True)
        )
        with running.phase("a frozen owner replaced"):
            groups = signal_pod(old, signal.SIGSTOP)
            running.say(f"SIGSTOP to the container of {victim} (process groups {groups})")
            running.kubectl("delete", "pod", "-n", NAMESPACE, victim, "--grace-period=0", "--force")

            def successor_active() -> bool:
                uid = pod_uids(running).get(victim)
                return uid not in (None, old["metadata"]["uid"]) and watcher.settled(1)

            watcher.run_until(successor_active, "the successor active on every task")
            watcher.hold()  # the successor processes while the old process is frozen
            signal_pod(old, signal.SIGCONT)
            running.say(f"SIGCONT to the old process of {victim}")
            watcher.run_until(lambda: not alive(groups), "the old process gone")
            watcher.hold()
        story = out.getvalue()
        thawed = running.cluster.container_log(old, "worker").read_text()
        assert "warning InstanceReplaced" in story, story
        assert "has been replaced by pod" in thawed or "fenced" in thawed, thawed[-3000:]
        assert running.finish(), out.getvalue()


def alive(groups: list[int]) -> bool:
    """Whether any process of these process groups still runs (not yet reaped)."""
    for group in groups:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            continue
        return True
    return False


def test_two_operators_acting_at_once_through_a_scale_out_never_interleave_their_writes(
    tmp_path: Path,
) -> None:
    """Issue 19.7 (b): two releases of the chart without peering (a misconfiguration, or an
    old operator that has not noticed it lost its lease) both run the control loop on the app
    through a scale-out and a scale-in. Their writes are fenced (one Kafka transaction per
    step, one transactional id per app): the one fenced says so and steps back until its next
    poll; the scalings finish, exact, never two owners, every output checked."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        second = running.install_operator("second")
        watcher.run_until(
            lambda: "control loop starts" in second.log(), "the second operator's control loop"
        )
        running.scale(2)
        watcher.run_until(lambda: watcher.settled(2), "the scale-out, by both")
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "the scale-in, by both")
        watcher.run_until(lambda: pods(running) == [f"{APP_NAME}-0"], "the drained pod gone")
        story = out.getvalue()
        assert "warning OperatorFenced" in story, "they did act at once, and one was fenced"
        assert running.finish(), out.getvalue()
        second.stop()


def test_a_warmup_pod_killed_mid_restore_is_replaced_and_warms_up_again(tmp_path: Path) -> None:
    out = io.StringIO()
    with session(options(tmp_path, backlog=40_000, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        running.scale(2)
        watcher.run_until(lambda: bool(watcher.status.get("warmupReplicas")), "a warm-up")
        victim = f"{APP_NAME}-1"
        running.kubectl("delete", "pod", "-n", NAMESPACE, victim, "--grace-period=0", "--force")
        watcher.run_until(lambda: watcher.settled(2), "the scale-out finished by the new pod")
        story = out.getvalue().split("--force")[1]
        assert "warning InstanceReplaced" in story, story
        assert "counts-1 is now active" in story, "the tasks moved to the new pod by hand-overs"
        assert running.finish(), out.getvalue()


def test_a_source_restarted_in_place_mid_hand_over_still_ends_the_hand_over(
    tmp_path: Path,
) -> None:
    """Issue 9.2 end to end: the container of the owner that is releasing a task is SIGKILLed
    and restarted in place by the kubelet (same pod, same disk); the task still reaches its
    new owner, without a timeout."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        with status_stream(running) as stream:
            running.scale(2)
            stream.wait(handing_over, "a hand-over in flight")
            running.signal_container(f"{APP_NAME}-0", signal.SIGKILL)
        watcher.run_until(lambda: watcher.settled(2), "the scale-out")
        restarts = json.loads(
            running.kubectl("get", "pod", "-n", NAMESPACE, f"{APP_NAME}-0", "-o", "json")
        )["status"]["containerStatuses"][0]["restartCount"]
        assert restarts == 1, "restarted in place, not re-created"
        assert running.finish(), out.getvalue()


def pod_uids(running: Session) -> dict[str, str]:
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    return {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in listing["items"]}


def degraded_by_kafka(running: Session) -> bool:
    return any(
        condition.get("type") == "Degraded"
        and condition.get("status") == "True"
        and condition.get("reason") == "KafkaUnavailable"
        for condition in running.watcher.status.get("conditions") or []
    )


def test_kafka_down_mid_hand_over_degrades_the_app_and_it_finishes_once_kafka_is_back(
    tmp_path: Path,
) -> None:
    """The only broker goes down for tens of seconds while a hand-over is in flight: the app
    says Degraded (KafkaUnavailable), no pod is deleted or re-created meanwhile, and once the
    broker is back the scale-out finishes, exact, with no two owners at once."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        with status_stream(running) as stream:
            running.scale(2)
            stream.wait(handing_over, "a hand-over in flight")
            running.kafka.set_broker_down(1)
        before = pod_uids(running)
        running.say("broker 1 down")
        down_since = time.monotonic()
        watcher.run_until(lambda: degraded_by_kafka(running), "the app Degraded by Kafka")
        while time.monotonic() - down_since < 30:
            watcher.poll()
            time.sleep(1)
        assert pod_uids(running) == before, "no pod churn while Kafka is down"
        running.kafka.set_broker_up(1)
        running.say("broker 1 up")
        watcher.run_until(lambda: watcher.settled(2), "the scale-out once Kafka is back")
        assert not degraded_by_kafka(running)
        assert set(pod_uids(running).items()) >= set(before.items()), "the same pods"
        assert running.finish(), out.getvalue()


def template_hashes(running: Session) -> dict[str, str]:
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    return {
        pod["metadata"]["name"]: pod["metadata"]["annotations"]["smoothscale.io/pod-template-hash"]
        for pod in listing["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }


def test_a_changed_pod_template_rolls_the_pods_one_at_a_time_through_warm_ups(
    tmp_path: Path,
) -> None:
    """A change of env (as of image or pipeline) replaces every pod, one at a time: a surge
    pod starts first, the outdated pod's tasks warm up and move once caught up, then it is
    drained, deleted and re-created; never more than one pod over, exact, no two owners. Its
    subject is the roll's order, so its pods run the protocol worker: five Spark drivers
    started one after the other took six minutes of the gate, and a Spark pod's own warm-up,
    hand-over and drain are the demo's and the other Spark scenarios' subject."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running, replicas=2)
        watcher.hold()
        before = pod_uids(running)
        (old_hash,) = set(template_hashes(running).values())
        most = 0

        def rolled() -> bool:
            nonlocal most
            most = max(most, len(pod_uids(running)))
            hashes = template_hashes(running)
            return (
                watcher.settled(2)
                and len(hashes) == 2
                and old_hash not in hashes.values()
                and "event RolledOut" in out.getvalue()
            )

        with running.phase("rolling update"):
            variable = {"name": "ROLLOUT", "value": "2"}
            patch = [{"op": "add", "path": "/spec/env/-", "value": variable}]
            running.kubectl(
                "patch", "-n", NAMESPACE, "streamingapp", APP_NAME,
                "--type", "json", "-p", json.dumps(patch),
            )  # fmt: skip
            watcher.run_until(rolled, "the rolling update")
            watcher.hold()
        story = out.getvalue()
        after = pod_uids(running)
        assert sorted(after) == sorted(before), "the same names"
        assert not set(after.values()) & set(before.values()), "every pod replaced"
        assert most <= 3, "one surge pod at most"
        assert story.count("event RollingUpdate") == 2, story
        surge_created = story.index(f"created instance pod {APP_NAME}-2")
        first_drained = story.index("event Drained")
        assert surge_created < first_drained, "the new pod comes before an old one goes"
        assert "warning " not in story.split("--type")[1], "a planned roll warns of nothing"
        assert running.finish(), out.getvalue()


def test_two_operator_replicas_the_leader_killed_mid_hand_over_the_other_finishes_it(
    tmp_path: Path,
) -> None:
    """Two peered operators (the chart with peering on; two releases of it, as pods here share
    this machine's ports): only the leader acts; its pod SIGKILLed in the middle of a hand-over
    and not replaced, the other takes over once the leader's keepalive runs out and finishes
    the scale-out, exact, no two owners."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        running.operator.stop()
        running.apply(replicas=1)
        peering = {
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering",
            "metadata": {"name": PEERING, "namespace": NAMESPACE},
        }
        running.kubectl("apply", "-f", "-", stdin=json.dumps(peering))
        leader = running.install_operator("leader", priority=20)
        spare = running.install_operator("spare", priority=10)
        running.operator = watcher.operator = leader
        watcher.run_until(lambda: watcher.settled(1), "the first instance running")
        assert "control loop starts" not in spare.log()
        running.feed.start()
        with status_stream(running) as stream:
            running.scale(2)
            instances = [running_pod(running, f"{APP_NAME}-{n}") for n in (0, 1)]
            stream.wait(handing_over, "a hand-over in flight")
            # Both instances frozen at once: the hand-over goes no further while the leader is
            # lost (a hand-over takes a second or two; losing the leader, which looks its pod up
            # first, once took long enough for it to finish the scale-out).
            for pod in instances:
                signal_pod(pod, signal.SIGSTOP)
            leader.lose()
            for pod in instances:
                signal_pod(pod, signal.SIGCONT)
        running.operator = watcher.operator = spare
        watcher.run_until(lambda: watcher.settled(2), "the scale-out, by the spare")
        assert "control loop starts" in spare.log()
        assert running.finish(), out.getvalue()


def running_pod(running: Session, instance: str) -> dict[str, Any]:
    """`instance`'s pod once its container runs (its process group known, to signal it at
    once later)."""
    deadline = time.monotonic() + running.options.phase_timeout
    while time.monotonic() < deadline:
        listed = running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True)
        for pod in json.loads(listed)["items"]:
            if pod["metadata"]["name"] == instance and any(
                str(status.get("containerID", "")).startswith("process://")
                for status in pod.get("status", {}).get("containerStatuses") or []
            ):
                return dict(pod)
        time.sleep(0.02)
    raise AssertionError(f"{instance}'s container did not start")


def freeze_at_first_warmup_report(
    running: Session, instance: str, reader: ProgressReader
) -> list[TaskProgress]:
    """SIGSTOP `instance`'s pod as soon as it reports a warm-up: its first report goes out when
    its warm-ups start and the next one a report interval (a second) later, so the signal lands
    before it can say anything newer. Returns its warm-ups as it last reported them."""
    pod = running_pod(running, instance)  # its process group, known before it can report
    deadline = time.monotonic() + running.options.phase_timeout
    while time.monotonic() < deadline:
        if any(
            item.report.role is ReportedRole.WARMUP
            for item in reader.read([instance], running.options.tasks).values()
        ):
            groups = signal_pod(pod, signal.SIGSTOP)
            running.say(f"SIGSTOP to the container of {instance} (process groups {groups})")
            return [
                item
                for item in reader.read([instance], running.options.tasks).values()
                if item.report.role is ReportedRole.WARMUP
            ]
        time.sleep(0.02)
    raise AssertionError(f"{instance} reported no warm-up")


def test_a_warmup_pod_that_hangs_gets_nothing_and_a_condition_says_why(tmp_path: Path) -> None:
    """The new pod is frozen (SIGSTOP: hung, or starved of CPU) while it warms up, its last
    report still behind on a task: that task does not move to it on the word of that report,
    its owner keeps it, and the app is Degraded with InstanceNotReporting; thawed, the pod
    catches up and the scale-out finishes. (Each task's changelog, about 5,000 records, is far
    above the acceptable lag, so the pod's first report, sent as its restores begin, is behind
    on its tasks: on all but those whose restore finished first, a few milliseconds each.)"""
    out = io.StringIO()
    hung = options(
        tmp_path, keys=20_000, backlog=40_000, acceptable_recovery_lag=1_000, spark=False
    )
    with session(hung, out) as running:
        watcher = running.watcher
        start_steady(running)
        changelogs = {STORE: names.changelog_topic(APP_ID, STORE)}
        reader = ProgressReader(running.bootstrap, APP_ID, changelogs)
        frozen = f"{APP_NAME}-1"
        try:
            running.scale(2)
            behind = freeze_at_first_warmup_report(running, frozen, reader)
        finally:
            reader.close()
        try:
            late = {i.report.task for i in behind if i.lag > hung.acceptable_recovery_lag}
            assert late, f"it was frozen while warming up, behind on a task: {behind}"
            watcher.run_until(
                lambda: any(
                    c.get("reason") == "InstanceNotReporting" and c.get("status") == "True"
                    for c in watcher.status.get("conditions") or []
                ),
                "the InstanceNotReporting condition",
            )
            tasks = [TaskStatus.model_validate(task) for task in watcher.status["tasks"]]
            for task in (task for task in tasks if task.task in late):
                assert task.active is not None, f"task {task.task} kept its owner"
                assert task.active.instance == f"{APP_NAME}-0", f"task {task.task} stayed"
                assert task.handover is None, f"task {task.task} is not moving to {frozen}"
            assert f"{frozen} is now active" not in out.getvalue(), "nothing moved to it"
        finally:
            running.signal_container(frozen, signal.SIGCONT)
        watcher.run_until(lambda: watcher.settled(2), "the scale-out once it is back")
        assert f"warning InstanceNotReporting: {frozen}" in out.getvalue()
        assert running.finish(), out.getvalue()


def test_api_trouble_mid_scale_conflicts_expired_watches_and_5xx_the_scale_finishes_exactly(
    tmp_path: Path,
) -> None:
    """The API server answers the operator (its ServiceAccount; never the scenario's own checks)
    409 to status writes, 410 to watches (kopf re-lists), 503 to pod lists and 500 to Events
    in the middle of a hand-over: the operator retries through it all and the scale-out
    finishes, exact, no two owners."""
    out = io.StringIO()
    with session(options(tmp_path, spark=False), out) as running:
        watcher = running.watcher
        start_steady(running)
        running.scale(2)
        watcher.run_until(lambda: moving(running), "a warm-up on the new pod")
        operator = {"user": "system:serviceaccount:"}  # never the scenario's own kubectl
        running.inject_api_faults(
            {"code": 409, "count": 3, "method": "PATCH", "path": "/streamingapps/", **operator},
            {"code": 410, "count": 3, "watch": True, **operator},
            {"code": 503, "count": 3, "method": "GET", "path": "/pods", "watch": False, **operator},
            {"code": 500, "count": 3, "method": "POST", "path": "/events", **operator},
        )
        watcher.run_until(lambda: watcher.settled(2), "the scale-out through API trouble")
        report = running.inject_api_faults()
        assert report["injected"] == {"409": 3, "410": 3, "500": 3, "503": 3}, report
        assert running.finish(), out.getvalue()
