"""The operator's memory outside its process: the ledger in Kafka, and its rebuild.

`handover.step()` needs the ledger of the last poll: which task is owned at which epoch, which
hand-over is in flight, what each instance was last given. The operator keeps it in the
StreamingApp status for people, and in the app's assignments topic under the key `\\0ledger`
(instances follow only their own key). The record is written BEFORE the instance assignments
of the same generation: whatever the operator is killed between, every assignment an instance
may have acted on is covered by a ledger record at least as new, so a restarted operator knows
of every hand-over it began (a source may be mid-batch on a task it was told to release: the
task must not fail over to someone else meanwhile). The status is written last and may be lost
or older (a restored backup, a re-created object): `rebuild()` takes the newest ledger and
raises it to whatever the topic and the reports prove happened since, so generations and epochs
never go backwards.
"""

import time
from collections.abc import Mapping

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
from smoothscale.kafka.assignments import Assignment, AssignmentDecodeError, decode_assignment
from smoothscale.kafka.progress import TaskProgress
from smoothscale.operator.handover import HandOver, Ledger, Ownership, finish_release
from smoothscale.planner.model import InstanceId
from smoothscale.tasks import TaskId, TaskRole

LEDGER_KEY = b"\0ledger"
"""The ledger's key in the assignments topic: never an instance id (a pod name)."""
FORMAT_VERSION = 1


class _Document(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")


class _HandOverDocument(_Document):
    source: str
    destination: str | None = None


class _OwnershipDocument(_Document):
    epoch: int = Field(ge=0)
    active: str | None = None
    handover: _HandOverDocument | None = None
    restore_until: dict[str, int] | None = Field(default=None, alias="restoreUntil")


class _InstanceDocument(_Document):
    joined: int = Field(ge=0)
    assignment: Assignment


class _LedgerDocument(_Document):
    version: int
    generation: int = Field(ge=0)
    tasks: dict[TaskId, _OwnershipDocument] = Field(default_factory=dict)
    instances: dict[str, _InstanceDocument] = Field(default_factory=dict)


class LedgerDecodeError(ValueError):
    """A ledger record this operator cannot read."""


def encode(ledger: Ledger) -> bytes:
    """The versioned JSON of `ledger`."""
    document = _LedgerDocument(
        version=FORMAT_VERSION,
        generation=ledger.generation,
        tasks={
            task: _OwnershipDocument(
                epoch=owner.epoch,
                active=owner.active,
                handover=None
                if owner.handover is None
                else _HandOverDocument(
                    source=owner.handover.source, destination=owner.handover.destination
                ),
                restoreUntil=None if owner.restore_until is None else dict(owner.restore_until),
            )
            for task, owner in sorted(ledger.tasks.items())
        },
        instances={
            instance: _InstanceDocument(
                joined=ledger.joined.get(instance, assignment.generation), assignment=assignment
            )
            for instance, assignment in sorted(ledger.assignments.items())
        },
    )
    return document.model_dump_json(by_alias=True, exclude_none=True).encode()


def decode(value: bytes) -> Ledger:
    """The ledger `encode` wrote; fields this version does not know are ignored."""
    try:
        document = _LedgerDocument.model_validate_json(value)
    except ValidationError as error:
        raise LedgerDecodeError(f"not a ledger record: {error}") from error
    if document.version != FORMAT_VERSION:
        raise LedgerDecodeError(
            f"the ledger record has format version {document.version}, this operator reads "
            f"{FORMAT_VERSION}: run the operator version that wrote it, or let this one "
            "rebuild the ledger from the assignments and reports"
        )
    return Ledger(
        generation=document.generation,
        tasks={
            task: Ownership(
                epoch=owner.epoch,
                active=owner.active,
                handover=None
                if owner.handover is None
                else HandOver(owner.handover.source, owner.handover.destination),
                restore_until=owner.restore_until,
            )
            for task, owner in document.tasks.items()
        },
        assignments={i: held.assignment for i, held in document.instances.items()},
        joined={i: held.joined for i, held in document.instances.items()},
    )


class LedgerRecord:
    """The ledger's record in the app's assignments topic."""

    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        client_config: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.topic = names.assignments_topic(app_id)
        self.unreadable_records = 0
        """Records of the topic skipped by `read()` because they did not decode."""
        self._config = {"bootstrap.servers": bootstrap_servers, **(client_config or {})}
        self._reader_group = names.reader_group(app_id)
        self._timeout = timeout
        self._producer = Producer({**self._config, "enable.idempotence": True, "acks": "all"})

    def write(self, ledger: Ledger) -> None:
        """Write `ledger` and wait until Kafka has it (before any assignment it covers)."""
        errors: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                errors.append(error)

        self._producer.produce(
            self.topic, key=LEDGER_KEY, value=encode(ledger), on_delivery=on_delivery
        )
        if self._producer.flush(self._timeout):
            raise TimeoutError(
                f"the ledger was not acknowledged by Kafka within {self._timeout} s "
                f"(is {self.topic!r} reachable?)"
            )
        if errors:
            raise RuntimeError(f"Kafka refused the ledger record in {self.topic!r}: {errors[0]}")

    def read(self) -> tuple[Ledger | None, dict[InstanceId, Assignment]]:
        """The newest ledger (None if none) and every instance's newest assignment.

        Newest is the highest generation, not the last written: a stale operator's late write
        never wins (between equal generations, the later one does)."""
        consumer = Consumer(
            {**self._config, "group.id": self._reader_group, "enable.auto.commit": False}
        )
        partition = TopicPartition(self.topic, 0)
        ledger: Ledger | None = None
        assignments: dict[InstanceId, Assignment] = {}
        try:
            _low, high = consumer.get_watermark_offsets(partition, timeout=self._timeout)
            if high <= 0:
                return None, assignments
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + self._timeout
            while consumer.position([partition])[0].offset < high:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"could not read {self.topic!r} to its end within {self._timeout} s"
                    )
                for message in consumer.consume(num_messages=500, timeout=0.5):
                    key, value = message.key(), message.value()
                    if message.error() is not None or key is None:
                        continue
                    if value is None:
                        assignments.pop(key.decode(), None)
                        continue
                    try:
                        if key == LEDGER_KEY:
                            found = decode(value)
                            if ledger is None or found.generation >= ledger.generation:
                                ledger = found
                            continue
                        assignment = decode_assignment(value)
                    except (LedgerDecodeError, AssignmentDecodeError):
                        self.unreadable_records += 1
                        continue
                    held = assignments.get(key.decode())
                    if held is None or assignment.generation > held.generation:
                        assignments[key.decode()] = assignment
            return ledger, assignments
        finally:
            consumer.close()

    def close(self) -> None:
        self._producer.flush(self._timeout)


def rebuild(
    status_ledger: Ledger | None,
    kafka_ledger: Ledger | None,
    kafka_assignments: Mapping[InstanceId, Assignment],
    reports: Mapping[tuple[InstanceId, TaskId], TaskProgress],
) -> Ledger:
    """The ledger to resume from, from every copy of the operator's memory that survived.

    The ledger with the higher generation wins (the status is written after Kafka, so it is
    never newer). Its generation is raised to every generation in the topic and the reports;
    each task's epoch to every epoch the topic or a report shows, the owner then being the
    instance given the task active at that epoch, if any (else the task fails over above it);
    a hand-over whose source has already released the task is completed. What each instance
    was last given is what the topic holds, so the next `step()` writes whatever a crash
    kept from being written."""
    ledgers = [ledger for ledger in (kafka_ledger, status_ledger) if ledger is not None]
    base = max(ledgers, key=lambda ledger: ledger.generation, default=Ledger())
    generation = max(
        [base.generation]
        + [assignment.generation for assignment in kafka_assignments.values()]
        + [progress.report.generation for progress in reports.values()]
    )
    floors: dict[TaskId, int] = {}
    for assignment in kafka_assignments.values():
        for task, held in assignment.tasks.items():
            floors[task] = max(floors.get(task, 0), held.epoch)
    for (_instance, task), progress in reports.items():
        seen = max(progress.report.epoch, progress.report.seen_epoch or 0)
        floors[task] = max(floors.get(task, 0), seen)
    tasks: dict[TaskId, Ownership] = {}
    for task in sorted(set(base.tasks) | set(floors)):
        owner = finish_release(base.ownership(task), task, reports, [])
        floor = floors.get(task, 0)
        if floor > owner.epoch:
            owner = Ownership(epoch=floor, active=_active_at(task, floor, kafka_assignments))
        tasks[task] = owner
    return Ledger(
        generation=generation,
        tasks=tasks,
        assignments=dict(kafka_assignments),
        joined={
            instance: max(base.joined.get(instance, 0), assignment.generation)
            for instance, assignment in kafka_assignments.items()
        },
    )


def _active_at(
    task: TaskId, epoch: int, assignments: Mapping[InstanceId, Assignment]
) -> InstanceId | None:
    """The one instance the topic shows holding `task` active at `epoch`, if exactly one."""
    holders = [
        instance
        for instance, assignment in sorted(assignments.items())
        if (held := assignment.tasks.get(task)) is not None
        and held.role is TaskRole.ACTIVE
        and held.epoch == epoch
    ]
    return holders[0] if len(holders) == 1 else None
