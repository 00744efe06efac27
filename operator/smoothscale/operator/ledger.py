"""The operator's memory: the ledger, kept in Kafka so that any operator can resume from it.

Every poll writes the whole ledger (generation, each task's epoch, owner, hand-over and
restoreUntil, each instance's last assignment) as one record under the key `\\0ledger` of the
app's compacted assignments topic, BEFORE the instance assignments of that generation
(docs/architecture.md, "The order of writes"). Instances follow only the record under their
own id, so the ledger record is invisible to them. Compaction keeps the newest record per key;
a reader keeps the record with the highest generation, so a late write of a stale operator
never wins.

`rebuild` turns what Kafka holds into the ledger to resume from: the ledger record, raised so
that no generation or epoch ever goes back below what the assignment records and the
instances' reports show.
"""

import json
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from pydantic import ValidationError

from smoothscale.kafka import names
from smoothscale.kafka.assignments import Assignment, decode_assignment
from smoothscale.kafka.progress import TaskProgress
from smoothscale.operator.handover import HandOver, Ledger, Ownership
from smoothscale.tasks import TaskId

LEDGER_KEY = b"\x00ledger"
FORMAT = 1
"""The version of the ledger record's JSON; a reader ignores fields it does not know."""


class LedgerFormatError(ValueError):
    """A ledger record this version cannot read."""


def encode(ledger: Ledger) -> bytes:
    """The ledger as the JSON of its record."""
    tasks: dict[str, Any] = {}
    for task, owner in sorted(ledger.tasks.items()):
        entry: dict[str, Any] = {"epoch": owner.epoch}
        if owner.active is not None:
            entry["active"] = owner.active
        if owner.handover is not None:
            entry["handover"] = {
                "source": owner.handover.source,
                "destination": owner.handover.destination,
            }
        if owner.restore_until is not None:
            entry["restoreUntil"] = dict(owner.restore_until)
        tasks[str(task)] = entry
    record = {
        "format": FORMAT,
        "generation": ledger.generation,
        "tasks": tasks,
        "assignments": {
            instance: json.loads(assignment.to_json())
            for instance, assignment in sorted(ledger.assignments.items())
        },
    }
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


def decode(value: bytes) -> Ledger:
    """The ledger a record holds; LedgerFormatError when it is not one."""
    try:
        record = json.loads(value)
        tasks: dict[TaskId, Ownership] = {}
        for task, entry in record.get("tasks", {}).items():
            handover = entry.get("handover")
            restore_until = entry.get("restoreUntil")
            tasks[int(task)] = Ownership(
                epoch=int(entry["epoch"]),
                active=entry.get("active"),
                handover=None
                if handover is None
                else HandOver(str(handover["source"]), handover.get("destination")),
                restore_until=None
                if restore_until is None
                else {str(store): int(offset) for store, offset in restore_until.items()},
            )
        assignments = {
            str(instance): decode_assignment(json.dumps(assignment).encode())
            for instance, assignment in record.get("assignments", {}).items()
        }
        return Ledger(generation=int(record["generation"]), tasks=tasks, assignments=assignments)
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as error:
        raise LedgerFormatError(f"not a ledger record: {error}") from error


class LedgerStore:
    """Writes and reads the ledger record of one app (and reads the assignment records)."""

    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        client_config: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.topic = names.assignments_topic(app_id)
        self._config = {"bootstrap.servers": bootstrap_servers, **(client_config or {})}
        self._app_id = app_id
        self._timeout = timeout
        self._producer = Producer({**self._config, "enable.idempotence": True, "acks": "all"})

    def write(self, ledger: Ledger) -> None:
        """Write the ledger and wait until Kafka has it."""
        errors: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                errors.append(error)

        self._producer.produce(
            self.topic, key=LEDGER_KEY, value=encode(ledger), on_delivery=on_delivery
        )
        if self._producer.flush(self._timeout):
            raise TimeoutError(f"the ledger was not acknowledged by Kafka within {self._timeout} s")
        if errors:
            raise RuntimeError(f"Kafka refused the ledger record: {errors[0]}")

    def read(self) -> tuple[Ledger | None, dict[str, Assignment]]:
        """The newest ledger (None if there is none) and every instance's newest assignment,
        read to the end of the assignments topic."""
        consumer = Consumer(
            {
                **self._config,
                "group.id": names.reader_group(self._app_id),
                "enable.auto.commit": False,
            }
        )
        partition = TopicPartition(self.topic, 0)
        ledger: Ledger | None = None
        assignments: dict[str, Assignment] = {}
        try:
            _low, high = consumer.get_watermark_offsets(partition, timeout=self._timeout)
            if high <= 0:
                return None, {}
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            deadline = time.monotonic() + self._timeout
            while consumer.position([partition])[0].offset < high:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read {self.topic!r} to its end in time")
                for message in consumer.consume(num_messages=500, timeout=0.5):
                    key, value = message.key(), message.value()
                    if message.error() is not None or key is None:
                        continue
                    if key == LEDGER_KEY:
                        if value is None:
                            continue
                        try:
                            found = decode(value)
                        except LedgerFormatError:
                            continue  # a record from a newer, incompatible operator: skip
                        if ledger is None or found.generation > ledger.generation:
                            ledger = found
                        continue
                    instance = key.decode(errors="replace")
                    if value is None:
                        assignments.pop(instance, None)
                        continue
                    try:
                        assignment = decode_assignment(value)
                    except ValueError:
                        continue
                    held = assignments.get(instance)
                    if held is None or assignment.generation > held.generation:
                        assignments[instance] = assignment
            return ledger, assignments
        finally:
            consumer.close()

    def close(self) -> None:
        self._producer.flush(self._timeout)


def rebuild(
    kafka_ledger: Ledger | None,
    assignments: Mapping[str, Assignment],
    reports: Mapping[tuple[str, TaskId], TaskProgress],
) -> Ledger:
    """The ledger to resume from: the one in Kafka (or a fresh one), with its generation at
    least every generation written, and every task's epoch at least every epoch assigned or
    reported, so neither ever goes back."""
    ledger = kafka_ledger or Ledger()
    generation = max(
        [ledger.generation, *(a.generation for a in assignments.values())],
        default=ledger.generation,
    )
    epochs: dict[TaskId, int] = {task: owner.epoch for task, owner in ledger.tasks.items()}
    for assignment in assignments.values():
        for task, held in assignment.tasks.items():
            epochs[task] = max(epochs.get(task, 0), held.epoch)
    for (_instance, task), progress in reports.items():
        seen = progress.report.seen_epoch or 0
        epochs[task] = max(epochs.get(task, 0), progress.report.epoch, seen)
    tasks = {}
    for task, epoch in epochs.items():
        owner = ledger.ownership(task)
        if epoch > owner.epoch and (owner.active is not None or owner.handover is not None):
            # Kafka shows a newer ownership than the ledger knew: trust none of it, the task
            # fails over above every epoch seen.
            owner = Ownership(epoch=epoch)
        tasks[task] = Ownership(
            epoch=max(epoch, owner.epoch),
            active=owner.active,
            handover=owner.handover,
            restore_until=owner.restore_until,
        )
    return Ledger(generation=generation, tasks=tasks, assignments=ledger.assignments)
