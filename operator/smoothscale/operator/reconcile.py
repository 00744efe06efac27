"""One StreamingApp's control loop: observe -> plan -> act -> record, one poll at a time.

`AppController.poll()` is the whole spine, top to bottom:

1. observe the spec, and validate it against the platform's policy before any Secret is read,
   any Kafka server connected to or any pod created (`access`); then the Kafka topics (created
   when missing), the pods, the instances' reports and the changelog ends;
2. plan one safe step of the hand-over protocol (`handover.step`, pure);
3. act, in an order that survives a crash between any two writes: the ledger record first
   (the operator's memory, in the assignments topic), then the instances' assignments, then
   pods (created before they are instances, deleted only once drained), then pod labels;
4. record the status, Events and metrics.

An error ends as a Degraded condition and a Warning Event, never as a silent retry, and forces
the next poll to re-read its memory from Kafka and rewrite every assignment (idempotent:
instances ignore a generation they hold). docs/architecture.md ("The operator") has the
argument for the order of writes.
"""

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from confluent_kafka import KafkaException
from pydantic import ValidationError

from smoothscale.api.models import (
    API_VERSION,
    PLURAL,
    DeletionPolicy,
    ScalingSpec,
    ScalingStrategy,
    ScalingSummary,
    StreamingApp,
    StreamingAppStatus,
    application_id,
)
from smoothscale.kafka import names
from smoothscale.kafka.assignments import Assignment, describe
from smoothscale.kafka.progress import ProgressReader, ReportedRole, TaskProgress
from smoothscale.kubeapi import MERGE_PATCH, KubeApi, KubeApiError
from smoothscale.operator.access import AccessRefused, referenced_secrets, refusals, unlabelled
from smoothscale.operator.catchup import CatchUpWatch, Heartbeats, Stalled
from smoothscale.operator.handover import (
    InstanceStatus,
    Ledger,
    Observation,
    Step,
    current_pods_reports,
    forget,
    holds_nothing,
    release_all,
    step,
)
from smoothscale.operator.kafka_client import MissingSecretError, client_config, lookup_in
from smoothscale.operator.ledger import LedgerRecord, OperatorFenced, rebuild
from smoothscale.operator.metrics import OperatorMetrics, TaskLag
from smoothscale.operator.observe import (
    PodView,
    draining_nodes,
    observe_pods,
    observe_secrets,
    pods_path,
)
from smoothscale.operator.pods import (
    BASE_PORT,
    EVICTABLE_LABEL,
    INSTANCES_ANNOTATION,
    ROLE_LABEL,
    TEMPLATE_HASH_ANNOTATION,
    PodSpecError,
    app_selector,
    build_pod,
    disruption_budget,
    disruption_budgets_path,
    instance_name,
    instance_role,
    pod_template_hash,
)
from smoothscale.operator.policy import AccessPolicy
from smoothscale.operator.status import Problem, Snapshot, app_status, busy
from smoothscale.operator.topics import TopicCheck, TopicManager
from smoothscale.planner.model import STRATEGY_MOVES, PlannerConfig
from smoothscale.tasks import TaskId, TaskRole

log = logging.getLogger(__name__)

RELEASE_TIMEOUT = timedelta(seconds=60)
"""When an app is deleted, how long its instances get to release their tasks (one micro-batch
each, normally) before their pods are deleted anyway."""

EVICTION_WAIT = timedelta(seconds=30)
"""How long a drained pod on a node being drained waits for the drain's eviction before the
operator deletes it itself (kubectl drain tries every 5 s, the cluster autoscaler every 10 s)."""

ASSIGNMENT_ANNOTATION = "smoothscale.io/assignment"
"""The pod's current assignment, mirrored for people (`kubectl describe pod`), never read."""


class EventSink(Protocol):
    """Posts a Kubernetes Event about the StreamingApp."""

    def __call__(self, type_: str, reason: str, message: str) -> None: ...


def utc_now() -> datetime:
    return datetime.now(UTC)


def planner_config(scaling: ScalingSpec) -> PlannerConfig:
    return PlannerConfig(
        acceptable_recovery_lag=scaling.acceptable_recovery_lag,
        max_warmup_replicas=scaling.max_warmup_replicas,
        num_standby_replicas=scaling.num_standby_replicas,
        moves=STRATEGY_MOVES[scaling.strategy],
    )


def app_path(namespace: str, name: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


@dataclass
class _KafkaClients:
    """The app's Kafka clients, kept across polls while the connection settings stay the same."""

    settings: tuple[tuple[str, str], ...]
    topics: TopicManager
    reader: ProgressReader
    ledgers: LedgerRecord

    def close(self) -> None:
        self.topics.close()
        self.reader.close()
        self.ledgers.close()


@dataclass
class _HandOverClock:
    """A hand-over under way, from the revoke until the new owner reports the task active."""

    started: datetime
    started_monotonic: float
    destination: str | None
    epoch: int


class AppController:
    """The control loop of one StreamingApp; the kopf daemon calls `poll` until the app goes."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        *,
        name: str,
        events: EventSink,
        metrics: OperatorMetrics,
        instance_port: int = BASE_PORT,
        policy: AccessPolicy,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.kube = kube
        self.instance_port = instance_port
        """Instance n's pod listens on instance_port + n (the operator's --instance-port)."""
        self.policy = policy
        """What the platform lets StreamingApps do with credentials (the operator's flags)."""
        self.namespace = namespace
        self.name = name
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.ledger: Ledger | None = None
        """The operator's memory, None until read from Kafka (and after any failed act)."""
        self._kafka: _KafkaClients | None = None
        self._draining_since: dict[str, datetime] = {}
        self._forced: set[str] = set()
        self._deleted: dict[str, str] = {}
        """Pods it deleted once drained, by name: the uid of the pod it deleted. One re-created
        under the same name in its place is no surprise, however long the old one took to go."""
        self._handovers: dict[TaskId, _HandOverClock] = {}
        self._scaling: ScalingSummary | None = None
        self._desired: int | None = None
        self._catch_up = CatchUpWatch()
        self._heartbeats = Heartbeats()
        self._rolling = False
        """A rolling update was seen under way (for the RolledOut Event)."""
        self._restarting = False
        """A restart (strategy Restart) was seen under way (for its Restart Event)."""
        self._evictable: dict[str, tuple[str, datetime]] = {}
        """Drained pods left to a drain's eviction: their uid, and since when."""
        self._budget_pods: int | None = None
        """The minAvailable of the app's PodDisruptionBudget as last written (None: not yet)."""
        self._nodes_unreadable = False
        self._problems: tuple[Problem, ...] = ()
        self._previous: StreamingAppStatus | None = None

    # The spine ----------------------------------------------------------------------------

    def poll(self) -> timedelta | None:
        """One pass; the time until the next one (None: the app is gone)."""
        started = time.monotonic()
        try:
            return self._poll()
        finally:
            self.metrics.observe_reconcile(self.namespace, self.name, time.monotonic() - started)

    def _poll(self) -> timedelta | None:
        now = self.clock()
        body = self._read_app()
        if body is None or body["metadata"].get("deletionTimestamp") is not None:
            return None  # gone, or being deleted: `tear_down` takes over
        try:
            app = StreamingApp.model_validate({**body, "status": None})
        except ValidationError as error:
            problem = Problem("InvalidSpec", f"the spec is invalid, fix it: {error}")
            self._record_problems(body, [problem])
            return timedelta(seconds=30)
        if self._previous is None:
            self._remember(_status_of(body))
        generation = body.get("metadata", {}).get("generation")
        scaling = app.spec.scaling

        # Validate what the app asks of the platform before anything is read or connected to.
        try:
            secrets = self._admit(app)
        except AccessRefused as refused:
            return self._degraded(app, generation, now, list(refused.problems))

        # Observe Kafka: the topics, created when missing, tell the task count.
        try:
            kafka = self._kafka_clients(app, secrets)
            check = kafka.topics.ensure(app)
        except MissingSecretError as error:
            return self._degraded(app, generation, now, [Problem("SecretKeyMissing", str(error))])
        except KafkaException as error:
            return self._degraded(app, generation, now, [_kafka_problem(error)])
        for topic in check.created:
            self.events("Normal", "TopicCreated", f"created Kafka topic {topic}")
        for topic in check.grown:
            self.events(
                "Normal",
                "ChangelogGrown",
                f"the input topics have {check.partitions} partitions now: grew changelog topic "
                f"{topic} to match (the new partitions are new tasks, given owners next)",
            )
        problems: list[Problem] = []
        tasks = check.partitions
        if not check.ok:
            # A topic problem needs a person, but must not freeze the app: failovers and
            # hand-overs go on over the tasks that worked so far (the memory's).
            problems += _topic_problems(check)
            tasks = self.ledger.tasks_count() if self.ledger is not None else None
            if _kafka_down(check):
                tasks = None
        if tasks is None:
            return self._degraded(app, generation, now, problems)
        desired = min(app.spec.replicas, tasks)
        if app.spec.replicas > tasks:
            problems.append(
                Problem(
                    "ReplicasAboveTasks",
                    f"spec.replicas is {app.spec.replicas} but the input has {tasks} "
                    f"partitions (tasks): running {desired} instances, more would hold nothing; "
                    "add input partitions to scale further",
                )
            )

        # Observe the pods (a pod that failed for good is deleted: it is lost); create the
        # missing ones first: a pod is an instance from the moment it exists, so its warm-ups
        # start while its Spark session starts.
        pods = self._delete_failed(observe_pods(self.kube, self.namespace, self.name))
        on_draining_nodes = self._on_draining_nodes(pods)
        restarting = self._restart(app, desired, pods)
        roll = (
            _Roll(False, None) if restarting else self._roll(app, desired, pods, on_draining_nodes)
        )
        try:
            creating = 0 if restarting else desired + (1 if roll.surge else 0)
            pods = self._create_missing_pods(app, creating, desired, pods)
        except PodSpecError as error:
            problem = Problem("InvalidPodSpec", f"no instance pod can be built: {error}")
            return self._degraded(app, generation, now, [problem, *problems])
        self._ensure_disruption_budget(app, pods)
        # A pod deleted with a grace period (by a person, or evicted) is still an instance: it
        # drains, its process serving until its tasks are handed over (or its grace runs out).
        live = dict(pods)
        problems += _crash_problems(self.namespace, live)
        statuses = self._instance_statuses(live, desired, scaling, now, roll, restarting=restarting)
        self._track_scaling(desired, now)

        try:
            # Observe the instances' reports, and the memory (read from Kafka when lost).
            config = planner_config(scaling)
            previous = self.ledger  # before a re-created pod is forgotten: whom a task left
            ledger, rewrite_all = self._memory(kafka, statuses, live, tasks)
            progress = current_pods_reports(
                kafka.reader.read(statuses, tasks), _pod_uids(ledger.assignments, live)
            )
            holding = [name for name, held in ledger.assignments.items() if held.tasks]
            own = {  # not the reports an earlier pod of the same name left behind
                key: item
                for key, item in progress.items()
                if item.report.generation >= ledger.joined.get(key[0], 0)
            }
            silent = self._heartbeats.silent(holding, own, _silence(scaling), now)
            progress = _without_stale_restores(progress, silent)
            problems += _silence_problems(silent, _silence(scaling))
            problems += _stall_problems(progress, app.spec.pipeline.stall_timeout)
            problems += _report_problems(progress)
            stalled = self._catch_up.observe(
                progress, scaling.acceptable_recovery_lag, scaling.probing_interval, now
            )
            problems += _stalled_problems(stalled, ledger)

            # Plan one safe step.
            result = step(ledger, Observation(statuses, progress), tasks, config)

            # Act: the memory, then the instances, in one transaction.
            writes = result.ledger.assignments if rewrite_all else result.writes
            kafka.ledgers.write(result.ledger, writes, result.forget)
            for instance in result.forget:
                kafka.reader.forget(instance)
            self.ledger = result.ledger
        except OperatorFenced as error:
            self._fenced(error)  # the other process records the status meanwhile
            return scaling.lag_poll_interval
        except (KafkaException, TimeoutError, RuntimeError) as error:
            self.ledger = None  # re-read the memory and rewrite every assignment next time
            return self._degraded(app, generation, now, [_kafka_problem(error), *problems])

        self._announce(previous or ledger, result, progress, now)
        if _all_active(result.ledger, progress):
            # A drained pod goes only once every task it gave away runs on its new owner.
            for instance in result.drained:
                self._delete_drained(instance, live, on_draining_nodes, now)
        self._label_pods(live, result.ledger)

        # Record.
        snapshot = Snapshot(
            app=app,
            generation=generation,
            selector=app_selector(self.name),
            pods=live,
            tasks=tasks,
            desired=desired,
            ledger=result.ledger,
            progress=progress,
            draining_since=dict(self._draining_since),
            handover_started={t: c.started for t, c in self._handovers.items()},
            problems=tuple(problems),
            last_scaling=self._finish_scaling(result, live, desired, now),
        )
        self._record(snapshot, now)
        if any(owner.handover is not None for owner in result.ledger.tasks.values()):
            # The new owner waits for the operator to see the release: look often.
            return min(scaling.lag_poll_interval, HANDOVER_POLL_INTERVAL)
        moving = busy(result.ledger) or bool(self._draining_since) or bool(self._handovers)
        starting = any(not pod.ready for pod in live.values()) or len(live) != desired
        return scaling.lag_poll_interval if moving or starting else scaling.probing_interval

    # Observe --------------------------------------------------------------------------------

    def _read_app(self) -> dict[str, Any] | None:
        try:
            return self.kube.request("GET", app_path(self.namespace, self.name))
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def _remember(self, status: StreamingAppStatus | None) -> None:
        """Take what the last status says about pods and scaling (after an operator restart)."""
        self._previous = status
        if status is None:
            return
        for instance in status.instances:
            if instance.draining_since is not None:
                self._draining_since[instance.name] = instance.draining_since
        self._scaling = status.last_scaling
        self._desired = status.desired_replicas

    def _admit(self, app: StreamingApp) -> dict[str, dict[str, str]]:
        """The Secrets the app names (their data), once the app has passed the platform's
        policy; raises AccessRefused first if it does not, before any Secret is read. Only
        Secrets with the policy's label are read (`observe_secrets`): one named without it is
        refused without its data ever reaching the operator."""
        refused = refusals(app, self.policy)
        if refused:
            raise AccessRefused(refused)
        named = referenced_secrets(app)
        secrets = observe_secrets(
            self.kube, self.namespace, sorted(named), self.policy.secret_selector
        )
        missing = unlabelled(named, secrets, self.namespace, self.policy)
        if missing:
            raise AccessRefused(missing)
        return secrets

    def _kafka_clients(
        self, app: StreamingApp, secrets: Mapping[str, Mapping[str, str]]
    ) -> _KafkaClients:
        config = client_config(app.spec.kafka, lookup_in(secrets))
        settings = tuple(sorted(config.items()))
        if self._kafka is not None and self._kafka.settings == settings:
            return self._kafka
        if self._kafka is not None:
            self._kafka.close()
        app_id = application_id(app)
        stores = {
            store.name: names.changelog_topic(app_id, store.name, store.changelog_topic)
            for store in app.spec.kafka.state_stores
        }
        bootstrap = config.pop("bootstrap.servers")
        self._kafka = _KafkaClients(
            settings=settings,
            topics=TopicManager({"bootstrap.servers": bootstrap, **config}),
            reader=ProgressReader(
                bootstrap, app_id, stores, config, input_topics=app.spec.kafka.input_topics
            ),
            ledgers=LedgerRecord(bootstrap, app_id, config),
        )
        self.ledger = None
        return self._kafka

    def _on_draining_nodes(self, pods: Mapping[str, PodView]) -> dict[str, str]:
        """The app's pods on nodes being drained (cordoned, or tainted by a node autoscaler),
        with why: each is replaced by a rolling update, its tasks moving by hand-overs before
        it goes, while the PodDisruptionBudget holds the drain's evictions back."""
        draining = draining_nodes(self.kube)
        if draining is None:
            if not self._nodes_unreadable:
                self._nodes_unreadable = True
                self.events(
                    "Warning",
                    "NodesNotReadable",
                    "the operator may not list nodes: a node drain's evictions wait on the "
                    "app's PodDisruptionBudget, but its pods are not moved off the node first; "
                    "grant list on nodes (the chart does)",
                )
            return {}
        return {
            name: f"its node {pod.node} is being drained ({draining[pod.node]})"
            for name, pod in pods.items()
            if pod.node in draining and not pod.terminating
        }

    def _ensure_disruption_budget(self, app: StreamingApp, pods: Mapping[str, PodView]) -> None:
        """The app's PodDisruptionBudget: no eviction of an instance pod is allowed, so a drain
        waits while the operator moves the pod's state off it, then lets the drain's eviction
        take the pod once it holds nothing (the pattern of CloudNativePG and Strimzi: block,
        move, release). Its minAvailable follows the pods it selects (not being deleted, not
        left to an eviction): called once the poll's new pods exist, it rises before a new pod
        can count as healthy, and falls only after a pod is gone."""
        count = sum(
            1 for pod in pods.values() if not pod.terminating and EVICTABLE_LABEL not in pod.labels
        )
        if self._budget_pods == count:
            return
        budget = disruption_budget(app, str(app.metadata.get("uid", "")), count)
        path = disruption_budgets_path(self.namespace)
        try:
            self.kube.request("POST", path, body=budget)
        except KubeApiError as error:
            if error.status != 409:  # already there: its count set to this one
                raise
            spec = budget["spec"]
            patch = {"spec": {"maxUnavailable": None, **spec}}
            self.kube.request(
                "PATCH",
                f"{path}/{budget['metadata']['name']}",
                body=patch,
                content_type=MERGE_PATCH,
            )
        self._budget_pods = count

    def _roll(
        self,
        app: StreamingApp,
        desired: int,
        pods: Mapping[str, PodView],
        on_draining_nodes: Mapping[str, str],
    ) -> "_Roll":
        """The rolling update, derived from the pods and nodes alone (so it survives an
        operator restart or a lost status): while a pod among the desired ones runs an older
        pod template, or sits on a node being drained, one surge instance (ordinal `desired`)
        runs beside them, and once every pod is ready and none drains, the highest of those
        pods drains: its tasks warm up elsewhere (the surge first, as it holds least) and move
        once caught up; the drained pod is deleted and re-created (from the current template,
        on a node the scheduler still uses). One pod at a time."""
        template = pod_template_hash(app)
        outdated = sorted(
            (pod.ordinal, name)
            for name, pod in pods.items()
            if pod.ordinal is not None
            and pod.ordinal < desired
            and not pod.terminating
            and (
                pod.annotations.get(TEMPLATE_HASH_ANNOTATION) != template
                or name in on_draining_nodes
            )
        )
        if not outdated:
            if self._rolling:
                self._rolling = False
                self.events("Normal", "RolledOut", "every instance runs the current pod template")
            return _Roll(surge=False, replacing=None)
        self._rolling = True
        _, target = outdated[-1]
        if target in self._draining_since:
            return _Roll(surge=True, replacing=target)  # under way
        surge = instance_name(self.name, desired)
        calm = (
            surge in pods
            and all(pod.ready and not pod.terminating for pod in pods.values())
            and not self._draining_since
        )
        if not calm:
            return _Roll(surge=True, replacing=None)
        if target in on_draining_nodes:
            reason, why = "NodeDrain", on_draining_nodes[target]
        else:
            reason, why = "RollingUpdate", "its pod template is out of date"
        self.events(
            "Normal",
            reason,
            f"replacing {target} ({why}, {len(outdated)} to go): its tasks warm up on the "
            "others and move once caught up, then it is re-created",
        )
        return _Roll(surge=True, replacing=target)

    def _restart(
        self, app: StreamingApp, desired: int, pods: Mapping[str, PodView]
    ) -> frozenset[str]:
        """With strategy Restart, the pods of the app's previous run, to stop (derived from
        the pods alone): while any pod runs an older template or was created for another
        instance count, every such pod drains, releasing its tasks to nobody, and no pod is
        created; once they are all gone, the new count starts, and every task restores before
        it processes, as a Spark operator restarts an app on any change."""
        if app.spec.scaling.strategy is not ScalingStrategy.RESTART:
            return frozenset()
        template = pod_template_hash(app)
        stale = frozenset(
            name
            for name, pod in pods.items()
            if pod.annotations.get(TEMPLATE_HASH_ANNOTATION) != template
            or pod.annotations.get(INSTANCES_ANNOTATION) != str(desired)
        )
        if stale and not self._restarting:
            self.events(
                "Normal",
                "Restart",
                f"restarting the app (strategy Restart): its {len(stale)} pod(s) release their "
                f"tasks and stop, then {desired} start; every task restores before it processes",
            )
        self._restarting = bool(stale)
        return stale

    def _instance_statuses(
        self,
        live: Mapping[str, PodView],
        desired: int,
        scaling: ScalingSpec,
        now: datetime,
        roll: "_Roll",
        *,
        restarting: frozenset[str],
    ) -> dict[str, InstanceStatus]:
        """Every live pod is an instance; those beyond the desired count drain (highest
        ordinals first: the scale-in choice is deterministic), except the surge instance of a
        rolling update, and so does the pod the rolling update replaces, and every pod of a
        run being restarted."""
        instances = desired + (1 if roll.surge else 0)
        for name in set(self._draining_since) - set(live):
            del self._draining_since[name]
            self._forced.discard(name)
        statuses = {}
        for name, pod in sorted(live.items()):
            draining = (
                pod.ordinal is None
                or pod.ordinal >= instances
                or name == roll.replacing
                or name in restarting
                or pod.terminating
            )
            if not draining:
                self._draining_since.pop(name, None)
                self._forced.discard(name)
                statuses[name] = InstanceStatus(ready=pod.ready, uid=pod.uid or None)
                continue
            since = self._draining_since.setdefault(name, now)
            forced = now - since >= scaling.drain_timeout
            if forced and name not in self._forced:
                self._forced.add(name)
                self.events(
                    "Warning",
                    "DrainTimeout",
                    f"{name} has drained for {scaling.drain_timeout} without its replacements "
                    "catching up: moving its tasks anyway (they restore before processing)",
                )
            statuses[name] = InstanceStatus(
                ready=pod.ready, uid=pod.uid or None, draining=True, force_release=forced
            )
        return statuses

    def _memory(
        self,
        kafka: _KafkaClients,
        statuses: Mapping[str, InstanceStatus],
        live: Mapping[str, PodView],
        tasks: int,
    ) -> tuple[Ledger, bool]:
        """The ledger, and whether every assignment must be written again: kept in memory
        between polls; after a start or a failed act, rebuilt from what Kafka holds (the
        ledger record, the assignment records, the reports). A pod re-created under a known
        name is a new instance with an empty disk: the old one is gone (`forget`)."""
        ledger = self.ledger
        rewrite = ledger is None
        if ledger is None:
            kafka_ledger, assignments = kafka.ledgers.read()
            reports = current_pods_reports(
                kafka.reader.read(statuses, tasks), _pod_uids(assignments, live)
            )
            ledger = rebuild(None, kafka_ledger, assignments, reports)
        for name, pod in sorted(live.items()):
            held = ledger.assignments.get(name)
            if held is not None and held.uid and pod.uid and held.uid != pod.uid:
                ledger, events = forget(ledger, name)
                if self._deleted.pop(name, None) != held.uid:  # not one it drained and deleted
                    for message in events or [
                        "it held no active task; what it warmed up starts over"
                    ]:
                        self.events(
                            "Warning", "InstanceReplaced", f"{name} was re-created: {message}"
                        )
                rewrite = True
        return ledger, rewrite

    # Act --------------------------------------------------------------------------------

    def _create_missing_pods(
        self, app: StreamingApp, count: int, desired: int, pods: dict[str, PodView]
    ) -> dict[str, PodView]:
        """Create the missing pods of ordinals below `count`, for a run of `desired`."""
        owner_uid = str(app.metadata.get("uid", ""))
        for ordinal in range(count):
            name = instance_name(self.name, ordinal)
            if name in pods:
                continue  # running, or still terminating: re-created once it is gone
            pod = build_pod(app, ordinal, owner_uid, self.instance_port, instances=desired)
            created = self.kube.request("POST", pods_path(self.namespace), body=pod)
            pods[name] = PodView.of(created)
            self.events("Normal", "PodCreated", f"created instance pod {name}")
        return pods

    def _delete_failed(self, pods: dict[str, PodView]) -> dict[str, PodView]:
        """A pod that failed for good (evicted) never runs again but stays until deleted: delete
        it, so that it counts as lost (its tasks fail over) and is created again, empty."""
        for name, pod in sorted(pods.items()):
            if pod.failed is None or pod.terminating:
                continue
            self.events(
                "Warning",
                "InstanceFailed",
                f"pod {name} has failed for good ({pod.failed}): deleting it; its tasks move to "
                "the other instances and it is created again, to warm up from the changelogs",
            )
            self._delete_pod(name)
            pods[name] = replace(pod, terminating=True)
        return pods

    def _delete_drained(
        self,
        instance: str,
        pods: Mapping[str, PodView],
        on_draining_nodes: Mapping[str, str],
        now: datetime,
    ) -> None:
        """A drained pod goes. On a node being drained, the drain's eviction takes it: the pod
        is taken out of the budget (EVICTABLE_LABEL), and deleted by the operator only if no
        eviction comes within EVICTION_WAIT (a node cordoned by hand, and never drained)."""
        pod = pods.get(instance)
        if pod is not None and pod.terminating:
            return  # deleted already: its process stops now that it holds nothing
        if pod is not None and instance in on_draining_nodes:
            marked = self._evictable.get(instance)
            if marked is None or marked[0] != pod.uid:
                self._patch_pod(instance, {"labels": {EVICTABLE_LABEL: "true"}})
                self._evictable[instance] = (pod.uid, now)
                self._deleted[instance] = pod.uid  # its re-creation is planned
                self.events(
                    "Normal",
                    "Drained",
                    f"{instance} holds no task any more: left to the eviction of its node's "
                    f"drain (deleted in {EVICTION_WAIT.total_seconds():.0f} s if none comes)",
                )
                return
            if now - marked[1] < EVICTION_WAIT:
                return
        self._delete_pod(instance)
        if pod is not None and pod.uid:
            self._deleted[instance] = pod.uid
        self.events("Normal", "Drained", f"{instance} holds no task any more: deleted its pod")

    def _delete_pod(self, name: str) -> None:
        try:
            self.kube.request("DELETE", f"{pods_path(self.namespace)}/{name}")
        except KubeApiError as error:
            if error.status != 404:
                raise

    def _label_pods(self, live: Mapping[str, PodView], ledger: Ledger) -> None:
        for name, pod in live.items():
            assignment = ledger.assignments.get(name)
            summary = describe(assignment) if assignment is not None else "{}"
            roles = {held.role for held in assignment.tasks.values()} if assignment else set()
            role = instance_role(roles).value
            if pod.labels.get(ROLE_LABEL) == role and (
                pod.annotations.get(ASSIGNMENT_ANNOTATION) == summary
            ):
                continue
            self._patch_pod(
                name,
                {"labels": {ROLE_LABEL: role}, "annotations": {ASSIGNMENT_ANNOTATION: summary}},
            )

    def _patch_pod(self, name: str, metadata: dict[str, Any]) -> None:
        """Merge `metadata` (labels, annotations) into a pod's."""
        try:
            self.kube.request(
                "PATCH",
                f"{pods_path(self.namespace)}/{name}",
                body={"metadata": metadata},
                content_type=MERGE_PATCH,
            )
        except KubeApiError as error:
            if error.status != 404:  # gone meanwhile: the next poll sees it
                raise

    # Record -----------------------------------------------------------------------------

    def _announce(
        self,
        before: Ledger,
        result: Step,
        progress: Mapping[tuple[str, TaskId], TaskProgress],
        now: datetime,
    ) -> None:
        """Events and hand-over clocks from what changed in this step."""
        after = result.ledger
        for instance, assignment in sorted(result.writes.items()):
            previous = before.assignments.get(instance)
            was = previous.tasks_in(TaskRole.WARMUP) if previous is not None else set()
            for task in sorted(assignment.tasks_in(TaskRole.WARMUP) - was):
                self.events("Normal", "WarmupStarted", f"task {task}: {instance} warms it up")
        for task, owner in sorted(after.tasks.items()):
            old = before.ownership(task)
            if owner.handover is not None and old.handover is None:
                self._handovers[task] = _HandOverClock(
                    now, time.monotonic(), owner.handover.destination, owner.epoch + 1
                )
            elif (
                owner.handover is None
                and old.handover is None
                and old.active is not None
                and owner.active is not None
                and old.active != owner.active
            ):
                self.events(
                    "Warning",
                    "FailedOver",
                    f"task {task}: {old.active} no longer holds it; {owner.active} took it "
                    f"over at once (epoch {owner.epoch})",
                )
        for message in result.events:
            self.events("Normal", "HandOver", message)
        for task, clock in list(self._handovers.items()):
            owner = after.ownership(task)
            if owner.handover is not None:
                continue
            if owner.active is None or owner.active != clock.destination:
                del self._handovers[task]  # failed over or stopped: not a hand-over any more
                continue
            report = progress.get((owner.active, task))
            if report is None or report.report.role is not ReportedRole.ACTIVE:
                continue
            if report.report.epoch < owner.epoch:
                continue
            seconds = time.monotonic() - clock.started_monotonic
            del self._handovers[task]
            self.metrics.observe_handover(self.namespace, self.name, seconds)
            self.events(
                "Normal",
                "HandedOver",
                f"task {task}: {owner.active} is active (epoch {owner.epoch}), {seconds:.1f} s "
                "after its old owner was asked to release it",
            )
            if self._scaling is not None and self._scaling.finished is None:
                longest = max(self._scaling.longest_hand_over_seconds or 0.0, seconds)
                self._scaling = replace_scaling(
                    self._scaling,
                    hand_overs=self._scaling.hand_overs + 1,
                    longest_hand_over_seconds=round(longest, 3),
                )

    def _track_scaling(self, desired: int, now: datetime) -> None:
        if self._desired is not None and self._desired != desired:
            unfinished = self._scaling
            if unfinished is not None and unfinished.finished is None:
                # Every scaling ends with an Event, this one cut short by the next.
                self.events(
                    "Normal",
                    "ScalingSuperseded",
                    f"scaling from {unfinished.from_replicas} to {unfinished.to_replicas} "
                    f"instances superseded after "
                    f"{(now - unfinished.started).total_seconds():.0f} s, with "
                    f"{unfinished.hand_overs} hand-overs done, by scaling to {desired}",
                )
            self._scaling = ScalingSummary(
                from_replicas=self._desired, to_replicas=desired, started=now
            )
            self.events("Normal", "Scaling", f"scaling from {self._desired} to {desired} instances")
        self._desired = desired

    def _finish_scaling(
        self, result: Step, live: Mapping[str, PodView], desired: int, now: datetime
    ) -> ScalingSummary | None:
        scaling = self._scaling
        if scaling is None or scaling.finished is not None:
            return scaling
        settled = (
            not busy(result.ledger)
            and not self._handovers
            and not self._draining_since
            and len(live) == desired
            and all(pod.ready for pod in live.values())
        )
        if settled:
            self._scaling = replace_scaling(scaling, finished=now)
            self.events(
                "Normal",
                "Scaled",
                f"scaled from {scaling.from_replicas} to {scaling.to_replicas} instances in "
                f"{(now - scaling.started).total_seconds():.0f} s with {scaling.hand_overs} "
                f"hand-overs (longest {scaling.longest_hand_over_seconds or 0:.1f} s)",
            )
        return self._scaling

    def _degraded(
        self,
        app: StreamingApp,
        generation: int | None,
        now: datetime,
        problems: list[Problem],
    ) -> timedelta:
        """Record a poll that could not act: no pod churn, the problems in status and Events."""
        pods = observe_pods(self.kube, self.namespace, self.name)
        live = {name: pod for name, pod in pods.items() if not pod.terminating}
        snapshot = Snapshot(
            app=app,
            generation=generation,
            selector=app_selector(self.name),
            pods=live,
            tasks=None,
            desired=app.spec.replicas,
            ledger=None,
            draining_since=dict(self._draining_since),
            problems=tuple(problems),
            last_scaling=self._scaling,
        )
        self._record(snapshot, now)
        return app.spec.scaling.lag_poll_interval

    def _record_problems(self, body: dict[str, Any], problems: list[Problem]) -> None:
        self._warn_new(problems)
        patch = {
            "status": {"phase": "Failed", "observedGeneration": body["metadata"].get("generation")}
        }
        self._patch_status(patch)

    def _warn_new(self, problems: Sequence[Problem]) -> None:
        """A Warning Event for each problem that was not there at the last poll."""
        for problem in problems:
            if problem not in self._problems:
                self.events("Warning", problem.reason, problem.message)
        self._problems = tuple(problems)

    def _record(self, snapshot: Snapshot, now: datetime) -> None:
        self._warn_new(snapshot.problems)
        status = app_status(snapshot, self._previous, now)
        self._patch_status({"status": status.to_kubernetes()})
        self._previous = status
        self.metrics.set_replicas(
            self.namespace,
            self.name,
            desired=snapshot.desired,
            ready=status.ready_replicas,
            active=status.active_replicas,
            warmup=status.warmup_replicas,
        )
        lags = [
            TaskLag(task.task, holder.instance, holder.role, holder.lag)
            for task in status.tasks
            for holder in task.holders
            if holder.lag is not None
        ]
        self.metrics.set_lag(self.namespace, self.name, lags)
        self.metrics.set_input_lag(
            self.namespace, self.name, status.input_lag, status.input_lag_seconds
        )

    def _patch_status(self, patch: dict[str, Any]) -> None:
        try:
            self.kube.request(
                "PATCH",
                f"{app_path(self.namespace, self.name)}/status",
                body=patch,
                content_type=MERGE_PATCH,
            )
        except KubeApiError as error:
            if error.status != 404:  # deleted meanwhile
                raise

    # Deletion -----------------------------------------------------------------------------

    def tear_down(self, waited: timedelta) -> bool:
        """The app is being deleted (kopf's finalizer holds it): release every task, then
        delete the pods. True once done; until then, call again. `waited`: how long the
        deletion has gone on. With deletionPolicy Retain (the default) the changelogs and the
        app's topics are kept, so an app re-created under the same name resumes exactly where
        this one stopped; with Delete, its state topics are deleted last."""
        body = self._read_app()
        if body is None:
            return True
        pods = observe_pods(self.kube, self.namespace, self.name)
        live = {name: pod for name, pod in pods.items() if not pod.terminating}
        if live and not self._released(body, live):
            if waited < RELEASE_TIMEOUT:
                return False
            self.events(
                "Warning",
                "ReleaseTimeout",
                f"the instances did not release their tasks within {RELEASE_TIMEOUT}: deleting "
                "the pods anyway (each commits its micro-batch in flight on SIGTERM; an "
                "unfinished one is processed again by the next owner, exactly once)",
            )
        for name in sorted(live):
            self._delete_pod(name)
        if pods:
            return False  # the finalizer holds the app until its pods are gone
        self.events("Normal", "Released", "every task released and every pod deleted")
        try:
            policy = StreamingApp.model_validate({**body, "status": None}).spec.deletion_policy
        except ValidationError:
            policy = DeletionPolicy.RETAIN  # a spec this version cannot read: keep the state
        if policy is DeletionPolicy.DELETE:
            self._delete_state(StreamingApp.model_validate({**body, "status": None}))
        else:
            self._forget_instances(body)
        return True

    def _delete_state(self, app: StreamingApp) -> None:
        try:
            deleted = self._kafka_clients(app, self._admit(app)).topics.delete_state(app)
        except (KafkaException, MissingSecretError, AccessRefused) as error:
            self.events(
                "Warning",
                "StateNotDeleted",
                f"deletionPolicy is Delete but the app's state topics could not be deleted "
                f"({error}); delete its changelog and assignments topics with your Kafka tools",
            )
            return
        self.events(
            "Normal", "StateDeleted", f"deletionPolicy Delete: deleted {', '.join(deleted)}"
        )

    def _released(self, body: Mapping[str, Any], live: Mapping[str, PodView]) -> bool:
        """Give every instance nothing (once); whether none reports a task active any more."""
        try:
            app = StreamingApp.model_validate({**body, "status": None})
            kafka = self._kafka_clients(app, self._admit(app))
            kafka_ledger, assignments = kafka.ledgers.read()
            ledger = rebuild(None, kafka_ledger, assignments, {})
            if not holds_nothing(ledger):
                ledger = release_all(ledger)
                kafka.ledgers.write(ledger, ledger.assignments)
            statuses = {name: InstanceStatus(ready=pod.ready) for name, pod in live.items()}
            progress = kafka.reader.read(statuses, max(ledger.tasks, default=-1) + 1)
        except _TEAR_DOWN_ERRORS:
            log.exception("could not release the tasks of %s/%s", self.namespace, self.name)
            return False
        return all(item.report.role is not ReportedRole.ACTIVE for item in progress.values())

    def _forget_instances(self, body: Mapping[str, Any]) -> None:
        """Once the pods are gone: no instance is left in the memory or the assignments topic
        (best effort: an app re-created under the same name treats its pods as new anyway)."""
        try:
            app = StreamingApp.model_validate({**body, "status": None})
            kafka = self._kafka_clients(app, self._admit(app))
            kafka_ledger, assignments = kafka.ledgers.read()
            ledger = rebuild(None, kafka_ledger, assignments, {})
            for instance in sorted(assignments):
                kafka.reader.forget(instance)
            kafka.ledgers.write(replace(ledger, assignments={}, joined={}), forget=assignments)
        except _TEAR_DOWN_ERRORS:
            log.exception("could not clear the instances of %s/%s", self.namespace, self.name)

    def _fenced(self, error: OperatorFenced) -> None:
        """Another operator process wrote this app's ledger and assignments since this one read
        them: drop what it knows, and read them again (with a new producer, fencing the other
        in turn) before it acts on the app again."""
        self.events(
            "Warning",
            "OperatorFenced",
            f"{error}: two operator processes act on this app (a peer that has not paused yet, "
            "or a second installation); this one reads the ledger again before acting",
        )
        self.ledger = None
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None
        self.metrics.forget_app(self.namespace, self.name)


_TEAR_DOWN_ERRORS = (
    ValidationError,
    KafkaException,
    MissingSecretError,
    AccessRefused,
    TimeoutError,
    RuntimeError,
)
"""What keeps a step of a deletion from Kafka; the step is logged and tried again."""


@dataclass(frozen=True)
class _Roll:
    """What a rolling update asks of this poll."""

    surge: bool
    """One instance more than desired runs (created if missing, never drained meanwhile)."""
    replacing: str | None
    """The out-of-date pod that drains now, if any."""


def replace_scaling(summary: ScalingSummary, **changes: Any) -> ScalingSummary:
    return summary.model_copy(update=changes)


def _status_of(body: Mapping[str, Any]) -> StreamingAppStatus | None:
    """The status the object carries; None when there is none or it is not one this version
    can read (it is then simply rebuilt)."""
    try:
        return StreamingAppStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None


def _kafka_problem(error: BaseException) -> Problem:
    return Problem(
        "KafkaUnavailable",
        f"Kafka did not answer: {error}. Nothing moves until it does (pods are left as they "
        "are); check spec.kafka.bootstrapServers, the brokers and the credentials",
    )


def _crash_problems(namespace: str, live: Mapping[str, PodView]) -> list[Problem]:
    return [
        Problem(
            "InstanceCrashing",
            f"pod {name} keeps failing: {pod.crash}. See `kubectl logs -n {namespace} {name} "
            "--previous`, and check spec.pipeline.ref, spec.image and spec.env",
        )
        for name, pod in sorted(live.items())
        if pod.crash is not None
    ]


def _kafka_down(check: TopicCheck) -> bool:
    """Whether the topic check could not reach Kafka at all (then nothing can go on)."""
    return any(problem.reason == "KafkaUnavailable" for problem in check.problems)


def _topic_problems(check: TopicCheck) -> list[Problem]:
    return [Problem(p.reason, p.message) for p in check.problems]


def _all_active(ledger: Ledger, progress: Mapping[tuple[str, TaskId], TaskProgress]) -> bool:
    """Whether every task given to an owner is reported active by it at its epoch."""
    for task, owner in ledger.tasks.items():
        if owner.handover is not None:
            return False
        if owner.active is None:
            continue
        report = progress.get((owner.active, task))
        if report is None or report.report.role is not ReportedRole.ACTIVE:
            return False
        if report.report.epoch < owner.epoch:
            return False
    return True


HANDOVER_POLL_INTERVAL = timedelta(milliseconds=250)
"""How often the loop looks for the release while a hand-over is in flight (a poll costs about
10 ms of CPU, docs/operator-cost.md): the new owner starts within a quarter second of it."""

SILENCE_MINIMUM = timedelta(seconds=30)
"""Instances report every second; one silent this long (and 3 lag polls) is hung or starved."""


def _pod_uids(
    assignments: Mapping[str, Assignment], live: Mapping[str, PodView]
) -> dict[str, str | None]:
    """Per instance name, the uid of the pod it stands for: its live pod's, else the one its
    last assignment was meant for."""
    return {
        **{name: held.uid for name, held in assignments.items()},
        **{name: pod.uid or None for name, pod in live.items()},
    }


def _silence(scaling: ScalingSpec) -> timedelta:
    return max(SILENCE_MINIMUM, 3 * scaling.lag_poll_interval)


def _without_stale_restores(
    progress: Mapping[tuple[str, TaskId], TaskProgress], silent: set[str]
) -> dict[tuple[str, TaskId], TaskProgress]:
    """A silent instance's warm-up and standby reports say nothing about now: a task is never
    handed to it on their word. Its other reports (active, released) stay: they are facts."""
    restoring = (ReportedRole.WARMUP, ReportedRole.STANDBY)
    return {
        key: item
        for key, item in progress.items()
        if not (key[0] in silent and item.report.role in restoring)
    }


def _silence_problems(silent: set[str], after: timedelta) -> list[Problem]:
    return [
        Problem(
            "InstanceNotReporting",
            f"{instance} has sent no progress report for {after.total_seconds():.0f} s: hung, "
            "starved of CPU, or cut off from Kafka. Nothing moves to it meanwhile; check its "
            "logs and its CPU",
        )
        for instance in sorted(silent)
    ]


def _stall_problems(
    progress: Mapping[tuple[str, TaskId], TaskProgress], timeout: timedelta
) -> list[Problem]:
    """An instance that reports itself stalled: its tasks fail over (`handover.step`), and a
    person should see why its pipeline or query is stuck. The message is the same at every
    poll while the stall lasts, so it is one Warning, not one per poll."""
    stalled = sorted(
        {
            instance
            for (instance, _), item in progress.items()
            if item.report.stalled_for is not None
        }
    )
    return [
        Problem(
            "InstanceStalled",
            f"{instance} has completed no micro-batch for longer than "
            f"spec.pipeline.stallTimeout ({timeout.total_seconds():g} s) while its input "
            "waits: its tasks move to other instances and the "
            "kubelet restarts it (its liveness probe fails). A pipeline that blocks on some "
            "records stalls every owner of their task: look at its logs (kill -USR1 prints "
            "every thread's stack)",
        )
        for instance in stalled
    ]


def _stalled_problems(stalled: Sequence[Stalled], ledger: Ledger) -> list[Problem]:
    problems = []
    for warmup in stalled:
        owner = ledger.ownership(warmup.task).active or "its owner"
        problems.append(
            Problem(
                "WarmupNotCatchingUp",
                f"task {warmup.task}: the warm-up on {warmup.instance} is not catching up (its "
                f"lag is no lower than {warmup.window.total_seconds():.0f} s ago: it restores "
                f"slower than the changelog grows). The task stays on "
                f"{owner}, which keeps processing, until the warm-up catches up; give "
                f"{warmup.instance} more CPU (spec.resources) or raise acceptableRecoveryLag",
            )
        )
    return problems


def _report_problems(progress: Mapping[tuple[str, TaskId], TaskProgress]) -> list[Problem]:
    problems = []
    for (instance, task), item in sorted(progress.items()):
        if item.report.error is not None:
            problems.append(
                Problem("TaskFailing", f"task {task} on {instance}: {item.report.error}")
            )
    return problems
