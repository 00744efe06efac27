"""The report channel: instances tell the operator how far each task's state has got.

Each instance commits, in its own consumer group `<appId>-instance-<instanceId>`, one offset
per changelog partition it holds: the next changelog offset it has applied to its local store
(its restore position), with the commit metadata `{"role", "epoch", "generation"}` as JSON,
plus `"input": {"<topic>": <next offset>}` for an active task (docs/architecture.md, "The
report channel"; docs/decisions/report-channel.md says why).

The operator reads every instance's reports with one OffsetFetch per instance and the changelog
end offsets with one ListOffsets request for all partitions, so a poll costs O(instances)
requests whatever the number of tasks:

    lag(task, instance) = sum over stores of max(0, end offset - reported restore position)

The end offset is the one the instance reported with its positions (`ends`) when it measured
one: its own consistent view, so a warm-up that keeps pace with a busy owner is seen as caught
up instead of always one poll behind. Otherwise it is the current last stable offset
(read_committed), the furthest a restore can get.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from smoothscale.kafka import names
from smoothscale.tasks import TaskId

_OFFSET_INVALID = -1001


class ReportedRole(StrEnum):
    """The role an instance reports for a task: a TaskRole, or `released` after a hand-over."""

    ACTIVE = "active"
    STANDBY = "standby"
    WARMUP = "warmup"
    RELEASED = "released"
    """The instance held the task active and has let it go; its positions are final."""
    REFUSED = "refused"
    """The instance refused the assignment: the task's changelog already holds a higher epoch
    (`seen_epoch`) than the one assigned. The operator must reassign above it."""
    FENCED = "fenced"
    """The instance found a newer owner's epoch marker before its own writes in the changelog:
    it stopped processing the task. The operator must reassign above `seen_epoch`."""


@dataclass(frozen=True)
class TaskReport:
    """What an instance reports for one task."""

    task: TaskId
    role: ReportedRole
    epoch: int
    generation: int
    positions: Mapping[str, int]
    """Per state store, the next changelog offset applied to the local store."""
    input_positions: Mapping[str, int] | None = None
    """For an active task: per input topic, the next input offset (from its state)."""
    input_time: float | None = None
    """For an active task: the timestamp (seconds since the epoch) of the newest input record
    it has processed, when the records carry timestamps: how old its processing front is."""
    stalled_for: float | None = None
    """For an active task: how long the instance has been stalled (a micro-batch running
    longer than its stall timeout, or none completed that long while input waits), when it
    is: the operator moves its tasks."""
    ends: Mapping[str, int] | None = None
    """Per state store, the changelog end offset the instance saw when it took `positions`
    (one consistent view: lag = ends - positions); None when it did not measure one."""
    seen_epoch: int | None = None
    """For `refused` and `fenced`: the highest ownership epoch the task's changelog holds."""
    error: str | None = None
    """A problem with this task the operator should show (e.g. an unreadable changelog)."""
    beat: int | None = None
    """The reporting process's count of report commits, set when committed: it grows while
    the instance runs (reports go out every second), so one that stops growing tells the
    operator the instance is hung or starved, whatever its last report said."""
    uid: str | None = None
    """The uid of the reporting pod, set when committed: the operator counts only the reports
    of the pod it knows under the instance's name, never a predecessor's or a zombie's."""

    def metadata(self) -> str:
        fields: dict[str, object] = {
            "role": self.role.value,
            "epoch": self.epoch,
            "generation": self.generation,
        }
        if self.input_positions is not None:
            fields["input"] = dict(self.input_positions)
        if self.input_time is not None:
            fields["inputTime"] = round(self.input_time * 1000)
        if self.stalled_for is not None:
            fields["stalledFor"] = round(self.stalled_for, 1)
        if self.ends is not None:
            fields["ends"] = dict(self.ends)
        if self.seen_epoch is not None:
            fields["seenEpoch"] = self.seen_epoch
        if self.error is not None:
            fields["error"] = self.error
        if self.beat is not None:
            fields["beat"] = self.beat
        if self.uid is not None:
            fields["uid"] = self.uid
        return json.dumps(fields, separators=(",", ":"))


@dataclass(frozen=True)
class TaskProgress:
    """One instance's report for one task, with its changelog lag."""

    instance_id: str
    report: TaskReport
    lag: int
    """Changelog records (summed over stores) the instance still has to restore."""
    input_lag: int | None = None
    """For an active report: input records (summed over input topics) not processed yet."""


def _latest_offset_spec() -> OffsetSpec:
    spec: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # untyped upstream
    return spec


def _client_config(
    bootstrap_servers: str, extra: Mapping[str, str] | None
) -> dict[str, str | int | float | bool]:
    return {"bootstrap.servers": bootstrap_servers, **(extra or {})}


class ProgressCommitter:
    """The instance's side: commits its task reports in its own consumer group."""

    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        instance_id: str,
        changelog_topics: Mapping[str, str],
        client_config: Mapping[str, str] | None = None,
        *,
        uid: str | None = None,
    ) -> None:
        """`uid`: the reporting pod's, stamped on every report."""
        self.group = names.instance_group(app_id, instance_id)
        self._uid = uid
        self._changelog_topics = dict(changelog_topics)
        self._consumer = Consumer(
            {
                **_client_config(bootstrap_servers, client_config),
                "group.id": self.group,
                "enable.auto.commit": False,
            }
        )
        self._beat = 0

    def commit(self, reports: Iterable[TaskReport]) -> None:
        """Commit `reports` in one OffsetCommit request and wait for the answer; each carries
        this committer's next beat and its pod's uid."""
        self._beat += 1
        offsets = [
            TopicPartition(
                self._changelog_topics[store],
                report.task,
                position,
                metadata=replace(report, beat=self._beat, uid=self._uid).metadata(),
            )
            for report in reports
            for store, position in sorted(report.positions.items())
        ]
        if offsets:
            self._consumer.commit(offsets=offsets, asynchronous=False)

    def close(self) -> None:
        self._consumer.close()


def parse_report(
    task: TaskId, metadata: str | None, positions: Mapping[str, int]
) -> TaskReport | None:
    """The report committed with `metadata`, or None when the commit is not a smoothscale report."""
    if not metadata:
        return None
    try:
        fields = json.loads(metadata)
        inputs = fields.get("input")
        ends = fields.get("ends")
        seen_epoch = fields.get("seenEpoch")
        error = fields.get("error")
        beat = fields.get("beat")
        uid = fields.get("uid")
        input_time = fields.get("inputTime")
        stalled_for = fields.get("stalledFor")
        return TaskReport(
            task=task,
            role=ReportedRole(fields["role"]),
            epoch=int(fields["epoch"]),
            generation=int(fields["generation"]),
            positions=dict(positions),
            input_positions=None
            if inputs is None
            else {str(topic): int(offset) for topic, offset in inputs.items()},
            ends=None if ends is None else {str(s): int(o) for s, o in ends.items()},
            seen_epoch=None if seen_epoch is None else int(seen_epoch),
            error=None if error is None else str(error),
            beat=None if beat is None else int(beat),
            uid=None if uid is None else str(uid),
            input_time=None if input_time is None else int(input_time) / 1000,
            stalled_for=None if stalled_for is None else float(stalled_for),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class ProgressReader:
    """The operator's side: every instance's reports and the lag they imply.

    Keeps one consumer per instance group (librdkafka fetches a group's offsets only through a
    consumer of that group; the mock broker has no admin ListConsumerGroupOffsets) and one admin
    client for the end offsets. Close it when done.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        changelog_topics: Mapping[str, str],
        client_config: Mapping[str, str] | None = None,
        *,
        timeout: float = 10.0,
        input_topics: Sequence[str] = (),
    ) -> None:
        """`input_topics`: the app's, whose end offsets give each active task's input lag."""
        self.app_id = app_id
        self._changelog_topics = dict(changelog_topics)
        self._input_topics = tuple(input_topics)
        self._config = _client_config(bootstrap_servers, client_config)
        self._timeout = timeout
        self._consumers: dict[str, Consumer] = {}
        self._admin = AdminClient(self._config)
        self.unreadable_reports = 0
        """How many committed reports did not parse (a newer or broken instance) and were
        skipped, since this reader was made: a counter for the operator's metrics."""

    def end_offsets(
        self, tasks: int
    ) -> tuple[dict[tuple[str, TaskId], int], dict[tuple[str, TaskId], int]]:
        """The last stable offsets of every changelog partition, per (store, task), and of
        every input partition, per (input topic, task), from one ListOffsets request."""
        topics = [*self._changelog_topics.values(), *self._input_topics]
        requests = {
            TopicPartition(topic, task): _latest_offset_spec()
            for topic in topics
            for task in range(tasks)
        }
        if not requests:
            return {}, {}
        try:
            latest = self._latest_offsets(requests)
        except KafkaException as error:
            if error.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                raise
            # Partitions added since this client last read the topics' metadata (input
            # partitions added: new tasks, and their changelog partitions): it would not ask
            # again for minutes (topic.metadata.refresh.interval.ms), so ask now, and retry.
            for topic in topics:
                self._admin.list_topics(topic, timeout=self._timeout)
            latest = self._latest_offsets(requests)
        store_of = {topic: store for store, topic in self._changelog_topics.items()}
        changelogs: dict[tuple[str, TaskId], int] = {}
        inputs: dict[tuple[str, TaskId], int] = {}
        for partition, offset in latest.items():
            if partition.topic in store_of:
                changelogs[(store_of[partition.topic], partition.partition)] = offset
            if partition.topic in self._input_topics:
                inputs[(partition.topic, partition.partition)] = offset
        return changelogs, inputs

    def _latest_offsets(
        self, requests: Mapping[TopicPartition, OffsetSpec]
    ) -> dict[TopicPartition, int]:
        futures = self._admin.list_offsets(
            dict(requests),
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self._timeout,
        )
        return {partition: future.result().offset for partition, future in futures.items()}

    def reports(self, instance_id: str, tasks: int) -> dict[TaskId, TaskReport]:
        """Instance `instance_id`'s reports for tasks 0..tasks-1, fetched in one request."""
        consumer = self._consumers.get(instance_id)
        if consumer is None:
            consumer = Consumer(
                {
                    **self._config,
                    "group.id": names.instance_group(self.app_id, instance_id),
                    "enable.auto.commit": False,
                }
            )
            self._consumers[instance_id] = consumer
        store_of = {topic: store for store, topic in self._changelog_topics.items()}
        committed = consumer.committed(
            [
                TopicPartition(topic, task)
                for topic in self._changelog_topics.values()
                for task in range(tasks)
            ],
            timeout=self._timeout,
        )
        positions: dict[TaskId, dict[str, int]] = {}
        metadata: dict[TaskId, str | None] = {}
        for partition in committed:
            if partition.offset == _OFFSET_INVALID:
                continue
            positions.setdefault(partition.partition, {})[store_of[partition.topic]] = (
                partition.offset
            )
            metadata.setdefault(partition.partition, partition.metadata)
        found: dict[TaskId, TaskReport] = {}
        for task, store_positions in positions.items():
            if not metadata[task]:
                continue  # an offset committed by something else than a smoothscale instance
            report = parse_report(task, metadata[task], store_positions)
            if report is None:
                self.unreadable_reports += 1
            else:
                found[task] = report
        return found

    def read(
        self, instance_ids: Iterable[str], tasks: int
    ) -> dict[tuple[str, TaskId], TaskProgress]:
        """Every instance's report per task, with its lag: against the end offsets the report
        carries, else against the current ones."""
        ends, input_ends = self.end_offsets(tasks)
        progress: dict[tuple[str, TaskId], TaskProgress] = {}
        for instance_id in instance_ids:
            for task, report in self.reports(instance_id, tasks).items():
                seen_ends = report.ends or {}
                lag = sum(
                    max(
                        0,
                        seen_ends.get(store, ends.get((store, task), 0))
                        - report.positions.get(store, 0),
                    )
                    for store in self._changelog_topics
                )
                input_lag = None
                if report.input_positions is not None and self._input_topics:
                    positions = report.input_positions
                    input_lag = sum(
                        max(0, input_ends.get((topic, task), 0) - positions.get(topic, 0))
                        for topic in self._input_topics
                    )
                progress[(instance_id, task)] = TaskProgress(instance_id, report, lag, input_lag)
        return progress

    def forget(self, instance_id: str) -> None:
        """Drop the consumer kept for an instance that is gone."""
        consumer = self._consumers.pop(instance_id, None)
        if consumer is not None:
            consumer.close()

    def close(self) -> None:
        for instance_id in list(self._consumers):
            self.forget(instance_id)


class InputPositionCommitter:
    """The input positions in the app's group `<appId>`, for external lag tools (KEDA, Burrow).

    Informational only: the positions that count live in each task's state and changelog. A task
    that has no state yet starts from here (or from the earliest offset).
    """

    def __init__(
        self, bootstrap_servers: str, app_id: str, client_config: Mapping[str, str] | None = None
    ) -> None:
        self.group = names.input_position_group(app_id)
        self._consumer = Consumer(
            {
                **_client_config(bootstrap_servers, client_config),
                "group.id": self.group,
                "enable.auto.commit": False,
            }
        )

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Commit the next offset to process per (input topic, partition)."""
        offsets = [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in sorted(positions.items())
        ]
        if offsets:
            self._consumer.commit(offsets=offsets, asynchronous=False)

    def committed(
        self, topics: Iterable[str], partition: int, timeout: float = 10.0
    ) -> dict[str, int]:
        """The committed next offset per input topic for one partition (absent: none)."""
        found = self._consumer.committed(
            [TopicPartition(topic, partition) for topic in topics], timeout=timeout
        )
        return {tp.topic: tp.offset for tp in found if tp.offset >= 0}

    def close(self) -> None:
        self._consumer.close()
