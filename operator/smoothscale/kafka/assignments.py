"""The assignment channel: the operator tells each instance which tasks it holds, and how.

The operator writes one record per instance to the compacted, single-partition topic
`<appId>-assignments` (key = instance id, value = the JSON of `Assignment`); see
docs/architecture.md, "The assignment channel". Because the topic is compacted, the newest
record per instance is all that survives; because an operator that lost its leadership could
still write a late, stale record, readers keep the record with the highest generation rather
than the last one. A tombstone (null value) forgets an instance whose pod is gone.
Readers ignore fields they do not know (a newer operator may add some), and a record that does
not decode is logged and skipped, never a crash loop.
"""

import json
import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from smoothscale.kafka import names
from smoothscale.kafka.following import FOLLOWER_SETTINGS
from smoothscale.tasks import TaskId, TaskRole

log = logging.getLogger(__name__)


class TaskAssignment(BaseModel):
    """How one instance holds one task."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    role: TaskRole
    epoch: int = Field(ge=0, description="The task's ownership epoch; bumped at every new owner.")
    restore_until: dict[str, int] | None = Field(
        default=None,
        alias="restoreUntil",
        description="Per state store, the changelog offset the previous owner acknowledged "
        "on release; the new active restores at least up to it before processing.",
    )


class Assignment(BaseModel):
    """Everything one instance holds, as of one generation of the app's assignment."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    generation: int = Field(ge=0)
    tasks: dict[TaskId, TaskAssignment] = Field(default_factory=dict)
    uid: str | None = Field(
        default=None,
        description="The uid of the pod this assignment is meant for: a process of another "
        "pod of the same name (one that outlived its pod, or its successor) never acts on it.",
    )

    def tasks_in(self, role: TaskRole) -> set[TaskId]:
        return {task for task, held in self.tasks.items() if held.role is role}

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


class AssignmentDecodeError(ValueError):
    """An assignment record that is not the JSON of an Assignment."""


def decode_assignment(value: bytes) -> Assignment:
    try:
        return Assignment.model_validate_json(value)
    except ValidationError as error:
        raise AssignmentDecodeError(f"not an assignment record: {error}") from error


def _client_config(bootstrap_servers: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap_servers, **(extra or {})}


class AssignmentWriter:
    """Writes assignments (the operator's side; tests acting as the operator use it too)."""

    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        client_config: Mapping[str, str] | None = None,
    ) -> None:
        self.topic = names.assignments_topic(app_id)
        self._producer = Producer(
            {
                **_client_config(bootstrap_servers, client_config),
                "enable.idempotence": True,
                "acks": "all",
            }
        )

    def write(self, instance_id: str, assignment: Assignment, timeout: float = 10.0) -> None:
        """Write `assignment` for `instance_id` and wait until Kafka has it."""
        self._send(instance_id.encode(), assignment.to_json(), timeout)

    def forget(self, instance_id: str, timeout: float = 10.0) -> None:
        """Write a tombstone for an instance that is gone, so compaction drops its record."""
        self._send(instance_id.encode(), None, timeout)

    def _send(self, key: bytes, value: bytes | None, timeout: float) -> None:
        errors: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                errors.append(error)

        self._producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
        remaining = self._producer.flush(timeout)
        if remaining:
            raise TimeoutError(
                f"the assignment for {key.decode()!r} was not acknowledged by Kafka within "
                f"{timeout} s (is {self.topic!r} reachable?)"
            )
        if errors:
            raise RuntimeError(f"Kafka refused the assignment for {key.decode()!r}: {errors[0]}")

    def close(self) -> None:
        self._producer.flush(10.0)


class AssignmentFollower:
    """An instance's view of the assignments topic: the newest assignment for itself.

    It reads the whole (compacted) topic from the start, then follows it; `poll` returns an
    assignment only when one with a higher generation than the last it returned has arrived.

    A name is not an identity: a pod deleted by force keeps running out its grace period, a
    partitioned node's process lives on, and a re-created pod has its predecessor's name. With
    `uid` (the pod's), only records meant for that pod (or for no pod in particular) are
    followed; one meant for another pod of the same name, newer than every record this pod was
    given, means this process has been replaced: `replaced_by` names the successor's uid.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        instance_id: str,
        client_config: Mapping[str, str] | None = None,
        *,
        on_bad_record: Callable[[], None] | None = None,
        uid: str | None = None,
    ) -> None:
        """`on_bad_record` is called for each record for this instance that does not decode."""
        self.instance_id = instance_id
        self.uid = uid
        self.replaced_by: str | None = None
        """The uid of the pod that replaced this one under its name, once a record says so."""
        self._own_generation = -1
        """The highest generation of a record meant for this pod (-1: none yet)."""
        self._on_bad_record = on_bad_record
        self._key = instance_id.encode()
        self.topic = names.assignments_topic(app_id)
        self.generation = -1
        self._consumer = Consumer(
            {
                **FOLLOWER_SETTINGS,
                **_client_config(bootstrap_servers, client_config),
                "group.id": names.reader_group(app_id),
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                # The operator writes in transactions: never act on one it did not commit.
                "isolation.level": "read_committed",
            }
        )
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])

    def poll(self, timeout: float = 0.0) -> Assignment | None:
        """The newest assignment for this instance that arrived since the last call, if any.

        Waits up to `timeout` seconds for a first record, then reads to the end of the topic.
        """
        # consume() waits for its whole batch: wait for one record, then read to the end.
        messages = self._consumer.consume(num_messages=1, timeout=timeout)
        newest: Assignment | None = None
        partition = TopicPartition(self.topic, 0)
        while messages:
            for message in messages:
                if message.error() is not None or message.key() != self._key:
                    continue
                value = message.value()
                if value is None:
                    continue
                try:
                    assignment = decode_assignment(value)
                except AssignmentDecodeError as error:
                    log.error(
                        "skipping assignment record at offset %s: %s", message.offset(), error
                    )
                    if self._on_bad_record is not None:
                        self._on_bad_record()
                    continue
                if self.uid is not None and assignment.uid not in (None, self.uid):
                    # Another pod's: its successor's when newer than what this one was given;
                    # a predecessor's (older, or before this pod's first record) otherwise.
                    if -1 < self._own_generation < assignment.generation:
                        self.replaced_by = assignment.uid
                    continue
                self._own_generation = max(self._own_generation, assignment.generation)
                if assignment.generation > self.generation:
                    self.generation = assignment.generation
                    newest = assignment
            _low, high = self._consumer.get_watermark_offsets(partition, cached=True)
            if self._consumer.position([partition])[0].offset >= high:
                break
            messages = self._consumer.consume(num_messages=500, timeout=0.1)
        return newest

    def close(self) -> None:
        self._consumer.close()


def read_assignments(
    bootstrap_servers: str,
    app_id: str,
    client_config: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> dict[str, Assignment]:
    """Every instance's current assignment, read to the end of the assignments topic."""
    topic = names.assignments_topic(app_id)
    consumer = Consumer(
        {
            **_client_config(bootstrap_servers, client_config),
            "group.id": names.reader_group(app_id),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
        current: dict[str, Assignment] = {}
        if high <= 0:
            return current
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while consumer.position([TopicPartition(topic, 0)])[0].offset < high:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic!r} to its end within {timeout} s")
            for message in consumer.consume(num_messages=500, timeout=0.5):
                key = message.key()
                if message.error() is not None or key is None or key.startswith(b"\0"):
                    continue  # not an instance's record (the operator's ledger)
                instance_id = key.decode()
                value = message.value()
                if value is None:
                    current.pop(instance_id, None)
                    continue
                try:
                    assignment = decode_assignment(value)
                except AssignmentDecodeError as error:
                    log.error("skipping the assignment record of %s: %s", instance_id, error)
                    continue
                held = current.get(instance_id)
                if held is None or assignment.generation > held.generation:
                    current[instance_id] = assignment
        return current
    finally:
        consumer.close()


def describe(assignment: Assignment) -> str:
    """A one-line, human-readable summary (for logs and the pod annotation)."""
    return json.dumps(
        {
            str(task): f"{held.role.value}@{held.epoch}"
            for task, held in sorted(assignment.tasks.items())
        }
    )
