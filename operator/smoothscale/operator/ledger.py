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
import uuid
from collections.abc import Iterable, Mapping

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
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
    record: str | None = None
    """This record's id, unique to it."""
    after: str | None = None
    """The id of the ledger record this one was decided from (the newest one its writer had
    read or written): each record follows the one before it in the log, unless two operator
    processes interleaved."""
    generation: int = Field(ge=0)
    tasks: dict[TaskId, _OwnershipDocument] = Field(default_factory=dict)
    instances: dict[str, _InstanceDocument] = Field(default_factory=dict)


class LedgerDecodeError(ValueError):
    """A ledger record this operator cannot read."""


def encode(ledger: Ledger, record: str | None = None, after: str | None = None) -> bytes:
    """The versioned JSON of `ledger` (as record `record`, decided from record `after`)."""
    document = _LedgerDocument(
        version=FORMAT_VERSION,
        record=record,
        after=after,
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


def record_id(value: bytes) -> str | None:
    """The id of the ledger record `value` (None for one written without)."""
    return _LedgerDocument.model_validate_json(value).record


def record_after(value: bytes) -> str | None:
    """The id of the ledger record the one in `value` was decided from."""
    return _LedgerDocument.model_validate_json(value).after


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


class OperatorFenced(RuntimeError):
    """Another operator process initialised the app's operator producer after this one: its
    writes are refused; it must read the ledger again (with a producer of its own) before it
    acts on the app again."""


_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


class LedgerRecord:
    """The operator's writes to the app's assignments topic: the ledger record and the
    instances' assignments, one Kafka transaction per step.

    Two operator processes can act on one app at once for a while (a kopf peer that pauses
    does not stop a poll already running; an operator that lost its lease and has not noticed).
    Their writes must never interleave. All of them write with one transactional.id per app
    (`names.operator_transactional_id`), and each initialises its producer before it reads the
    ledger: from then on, the older process's transactions are refused (`OperatorFenced`), so
    each step is read, decide, write, with nobody else's write in between. On a broker that
    does not fence, a crash-safe order still holds: the ledger first, then the assignments."""

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
        self._transactional_id = names.operator_transactional_id(app_id)
        self._reader_group = names.reader_group(app_id)
        self._timeout = timeout
        self._producer: Producer | None = None
        self._last: str | None = None
        """The id of the ledger record this process read or wrote last."""

    def _ready(self) -> Producer:
        """The transactional producer, initialised (fencing older operator processes) on
        first use: before this process reads the ledger."""
        if self._producer is None:
            producer = Producer(
                {
                    **self._config,
                    "transactional.id": self._transactional_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    "transaction.timeout.ms": 60_000,
                }
            )
            try:
                producer.init_transactions(self._timeout)
            except KafkaException as error:
                raise _failed("initialise the operator's producer", error) from error
            self._producer = producer
        return self._producer

    def write(
        self,
        ledger: Ledger,
        assignments: Mapping[InstanceId, Assignment] | None = None,
        forget: Iterable[InstanceId] = (),
    ) -> None:
        """Write `ledger`, then the `assignments` it covers and the tombstones of the instances
        to `forget`, in one transaction, and wait until Kafka has committed it."""
        producer = self._ready()
        record = uuid.uuid4().hex
        records: list[tuple[bytes, bytes | None]] = [
            (LEDGER_KEY, encode(ledger, record, after=self._last))
        ]
        records += [(i.encode(), a.to_json()) for i, a in sorted((assignments or {}).items())]
        records += [(instance.encode(), None) for instance in sorted(forget)]
        try:
            producer.begin_transaction()
            for key, value in records:
                producer.produce(self.topic, key=key, value=value)
            # Flushes first, and fails when any record was not delivered.
            producer.commit_transaction(self._timeout)
        except KafkaException as error:
            self._abort()
            raise _failed("commit the ledger and assignments", error) from error
        self._last = record

    def _abort(self) -> None:
        if self._producer is None:
            return
        try:
            self._producer.abort_transaction(self._timeout)
        except KafkaException:
            # Fenced, or fatally failed: a new producer is needed (and a fresh read).
            self._producer = None

    def read(self) -> tuple[Ledger | None, dict[InstanceId, Assignment]]:
        """The newest ledger (None if none) and every instance's newest assignment.

        Newest is the highest generation, not the last written: a stale operator's late write
        never wins (between equal generations, the later one does). Reads what is committed
        only, once this process's producer has fenced every older one."""
        self._ready()
        consumer = Consumer(
            {
                **self._config,
                "group.id": self._reader_group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
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
                                self._last = record_id(value)
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
        if self._producer is not None:
            self._producer.flush(self._timeout)


def _failed(what: str, error: KafkaException) -> Exception:
    """OperatorFenced when another operator process's producer fenced this one's, else the
    KafkaException (Kafka trouble: the poll is retried)."""
    cause = error.args[0] if error.args else None
    if isinstance(cause, KafkaError) and cause.code() in _FENCED:
        return OperatorFenced(
            f"could not {what}: another operator process initialised this app's operator "
            f"producer after this one ({cause.str()})"
        )
    return error


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
    kept from being written; from which generation on its reports count, what the ledger
    recorded for its pod."""
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
            instance: _joined(base, instance, assignment)
            for instance, assignment in kafka_assignments.items()
        },
    )


def _joined(base: Ledger, instance: InstanceId, assignment: Assignment) -> int:
    """The generation of the first assignment written to the pod that `assignment` (the
    topic's newest record for `instance`) is meant for: the one `base` recorded, when `base`
    covers that record (the ledger is written before the assignments) and knows the same pod;
    else, not knowing, the record's own. Raising it to the record's own when known would set
    aside the pod's reports made before it applied that record, such as a fenced one."""
    known = base.assignments.get(instance)
    if (
        instance in base.joined
        and known is not None
        and assignment.uid is not None
        and known.uid == assignment.uid
        and assignment.generation <= base.generation
    ):
        return base.joined[instance]
    return max(base.joined.get(instance, 0), assignment.generation)


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
