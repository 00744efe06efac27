"""One transactional producer per active task: a micro-batch of a task commits all or nothing.

The producer's transactional.id is the task's (`<appId>-task-<i>`, the same at every owner), so
on real Kafka a new owner's init_transactions() fences the previous owner's producer and aborts
its open transaction. One micro-batch of one task is one transaction: the changelog records of
the keys it changed, the input-position record, the output records and the task's dead letters.
Nothing is applied to the local store before the transaction has committed.

A fenced producer's commit raises ProducerFenced, and a commit that does not finish (Kafka
does not answer) CommitOutcomeUnknown: both are TaskLost, on which the instance stops the task
(and only that task) and its next owner restores it from the changelog, which alone knows
whether the last transaction committed. A commit or an abort that times out is called again,
never followed by another transactional call (see END_CALLS). The local stack's Kafka front
fences as Kafka does; the mock brokers behind it do not (../shared/ENVIRONMENT.md), and
correctness never depends on fencing alone: see the epochs in `changelog` and docs/runtime.md.
"""

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from smoothscale.kafka import names
from smoothscale.runtime.changelog import ChangelogRecord, Headers, json_bytes
from smoothscale.runtime.config import WorkerConfig
from smoothscale.tasks import TaskId

END_CALLS = 3
"""How many times commit_transaction or abort_transaction is called for one transaction, each
with the producer's timeout. A call that times out leaves its request in flight (librdkafka's
retriable _TIMED_OUT, "retry call to resume"): only the same call resumes it, and any other
transactional call meanwhile is refused as conflicting. On Kafka the transaction ends by itself
at transaction.timeout.ms (60 s here), so the calls end by then with an answer."""

EPOCH_HEADER = "smoothscale.epoch"
"""The header of every output record: the epoch of the owner that wrote it."""
_ANY_PARTITION = -1
"""Let the producer's partitioner choose (librdkafka's RD_KAFKA_PARTITION_UA)."""
_OUTPUT_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""One encoder for every output (json.dumps with options builds one per call)."""

OutputRecord = tuple[str, Any]
"""An output record: key (text) and a JSON-able value."""


class ChangelogSpan(NamedTuple):
    """Where a committed transaction's records went in one changelog partition."""

    first: int
    """The offset of its first record."""
    last: int
    """The offset of its last record."""
    records: int
    """How many records it wrote there: `last - first + 1` unless someone else wrote between."""


class TransactionError(RuntimeError):
    """A task's transaction did not commit; nothing of it is visible to read_committed readers."""


class TaskLost(TransactionError):
    """The producer can write nothing more for the task, and what it wrote last is what the
    task's changelog says: its instance must stop the task (and only that task), and whoever
    owns it next restores it from the changelog."""


class ProducerFenced(TaskLost):
    """Kafka refused the transaction because a newer producer of the task's transactional.id
    was initialised: another instance has taken the task over."""


class CommitOutcomeUnknown(TaskLost):
    """commit_transaction did not finish (Kafka did not answer in time, or the producer failed
    fatally): the transaction may yet commit, or not. Nothing but the changelog can say which."""


_FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def task_client(config: WorkerConfig, task: TaskId) -> Producer:
    """The client of task `task`'s transactional producer, not yet initialised: it fences no
    one (only `init_transactions` does), and it connects to the brokers meanwhile.

    An instance makes one for each task it may be given as active next (a warm-up, a standby),
    so that its activation initialises a connected client. A fresh client's init_transactions
    finds no broker connection up to ask for the transaction coordinator, and librdkafka looks
    again after up to 0.5 s: on the mock brokers, two in three took 0.50 s and the others
    0.05 s, against 2 ms for a client made 1 s or 20 s before (2026-11-28). That wait was part
    of a hand-over's stop, between the release and the new owner's epoch marker."""
    return Producer(
        {
            **config.client_config(),
            "transactional.id": names.transactional_id(config.app_id, task),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "transaction.timeout.ms": 60_000,
        }
    )


class TaskProducer:
    """The transactional producer of one active task, at one ownership epoch."""

    def __init__(
        self,
        config: WorkerConfig,
        task: TaskId,
        epoch: int,
        timeout: float = 30.0,
        client: Producer | None = None,
    ):
        """Initialise the task's transactions on `client` (one from `task_client`), or on a
        new client."""
        self.task = task
        self.epoch = epoch
        self._timeout = timeout
        self._changelog_topics = config.changelog_topics()
        self._aborting = False
        """An abort timed out: its request is still in flight, to finish before a new begin."""
        self._output_topic = config.output_topic
        self.delivered: dict[str, ChangelogSpan] = {}
        """Per store, where the last committed transaction's changelog records went (to verify
        that nobody else wrote between them, see `instance`)."""
        self._producer = client if client is not None else task_client(config, task)
        try:
            self._producer.init_transactions(timeout)
        except KafkaException as error:
            raise TransactionError(
                f"task {task}: could not initialise its transactional producer: {error}"
            ) from error

    def commit(
        self,
        changelog: Mapping[str, Sequence[ChangelogRecord]],
        outputs: Sequence[OutputRecord] = (),
        also: Callable[[Producer], object] | None = None,
    ) -> dict[str, int]:
        """Write one batch of the task in one transaction and commit it.

        `changelog` maps each store to its records (they go to partition `task` of the store's
        changelog topic); `also` may queue more records on the producer (dead letters) inside
        the transaction. Returns, per store written to, the changelog offset after its last
        record. On failure, aborts when it can and raises TransactionError (nothing of it
        visible), or a TaskLost: ProducerFenced, or CommitOutcomeUnknown (it may yet commit).

        Only the first and the last changelog record of each store are delivered to a Python
        callback: the idempotent producer keeps a partition's records in order, so theirs are
        the span's offsets, and a record Kafka refused fails the commit, callback or not
        (librdkafka makes the transaction abortable; tried on the mock brokers). With a
        callback a record, a commit of 5,001 changelog and 2,500 output records took 20 ms;
        this way 16 ms (2026-11-28).
        """
        edges: dict[str, list[int]] = {}
        failures: list[KafkaError] = []

        def on_edge(store: str) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(error: KafkaError | None, message: Message) -> None:
                offset = message.offset()
                if error is not None:
                    failures.append(error)
                elif offset is not None:
                    edges.setdefault(store, []).append(offset)

            return on_delivery

        epoch_header: Headers = [(EPOCH_HEADER, str(self.epoch).encode())]
        # A record a call, thousands a commit: the producer's own call in the loops, and the
        # one that waits for room in its queue only when it is full.
        produce, task, output_topic = self._producer.produce, self.task, self._output_topic
        self._finish_abort()
        try:
            self._producer.begin_transaction()
            for store, records in changelog.items():
                topic = self._changelog_topics[store]
                edge = on_edge(store)
                last = len(records) - 1
                for index, record in enumerate(records):
                    key, value, headers = record.key, record.value, record.headers()
                    delivery = edge if index in (0, last) else None
                    try:
                        produce(
                            topic, value, key, partition=task, on_delivery=delivery, headers=headers
                        )
                    except BufferError:
                        self._produce_when_room(
                            topic, value, key, partition=task, on_delivery=delivery, headers=headers
                        )
            for user_key, output in outputs:
                key, value = user_key.encode(), json_bytes(_OUTPUT_ENCODER, output)
                try:
                    produce(
                        output_topic, value, key, partition=_ANY_PARTITION, headers=epoch_header
                    )
                except BufferError:
                    self._produce_when_room(
                        output_topic, value, key, partition=_ANY_PARTITION, headers=epoch_header
                    )
            if also is not None:
                also(self._producer)
            if self._flush():
                raise TransactionError(f"task {self.task}: records not delivered in time")
            if failures:
                raise _failed(self.task, "Kafka refused a record", failures[0])
        except KafkaException as error:
            self._abort()
            raise _failed(self.task, "the transaction failed", _cause(error)) from error
        except BaseException:
            self._abort()
            raise
        self._end_transaction()
        self.delivered = {
            store: ChangelogSpan(min(edges[store]), max(edges[store]), len(records))
            for store, records in changelog.items()
            if records
        }
        return {store: span.last + 1 for store, span in self.delivered.items()}

    def _flush(self) -> int:
        """Deliver what is queued; the records not delivered in time. When Kafka fences the
        producer, the client raises the fatal error from inside its delivery callbacks, and the
        next callback turns it into a SystemError: the KafkaException behind it is raised."""
        try:
            remaining: int = self._producer.flush(self._timeout)
        except SystemError as error:
            behind = error.__cause__ or error.__context__
            if isinstance(behind, KafkaException):
                raise behind from error
            raise
        return remaining

    def _produce_when_room(
        self, topic: str, value: bytes | None, key: bytes, **record: Any
    ) -> None:
        """Produce one record (`record`: the producer's other arguments) once the producer's
        queue has room for it."""
        while True:
            self._producer.poll(0.1)
            try:
                self._producer.produce(topic, value, key, **record)
                return
            except BufferError:
                continue

    def _end_transaction(self) -> None:
        """Commit the open transaction. Raises TransactionError when it was aborted (nothing of
        it visible), ProducerFenced when Kafka fenced the producer, and CommitOutcomeUnknown
        when it neither committed nor failed in END_CALLS calls."""
        try:
            _call_to_its_end(self._producer.commit_transaction, self._timeout)
        except KafkaException as error:
            cause = _cause(error)
            failed = _failed(self.task, "the transaction's commit failed", cause)
            if isinstance(failed, ProducerFenced):
                raise failed from error
            if isinstance(cause, KafkaError) and cause.txn_requires_abort():
                self._abort()
                raise failed from error
            raise CommitOutcomeUnknown(
                f"task {self.task}: the commit of its transaction did not finish ({cause}): it "
                "may yet commit or not, and only the changelog can say which; giving the task "
                "up, so that its next owner restores it from there"
            ) from error

    def _abort(self) -> None:
        """Abort the open transaction. One whose abort has not finished yet is aborted again
        before the next transaction begins; a fenced or fatally failed producer cannot abort,
        and Kafka aborts for it."""
        self._aborting = True
        self._abort_to_its_end()

    def _finish_abort(self) -> None:
        """Before a new transaction: end the abort of the last one if it had not ended."""
        if not self._aborting:
            return
        unfinished = self._abort_to_its_end()
        if unfinished is not None:
            raise TransactionError(
                f"task {self.task}: its previous transaction is still being aborted "
                f"({unfinished}); nothing of it is visible, and no new one can begin yet"
            )

    def _abort_to_its_end(self) -> KafkaError | None:
        """Call abort_transaction to its end. The retriable error when it has still not ended
        (the abort stays due); None when it has, or when the producer cannot abort."""
        try:
            _call_to_its_end(self._producer.abort_transaction, self._timeout)
        except KafkaException as error:
            cause = _cause(error)
            if isinstance(cause, KafkaError) and cause.retriable():
                return cause
        self._aborting = False
        return None

    def close(self) -> None:
        # A producer Kafka fenced (or failed fatally) raises from flush: nothing of it is left
        # to deliver, and closing it must not fail whoever lets it go.
        with contextlib.suppress(KafkaException):
            self._producer.flush(self._timeout)


def _call_to_its_end(call: Callable[[float], None], timeout: float) -> None:
    """commit_transaction or abort_transaction, called again while it times out (see
    END_CALLS); raises the KafkaException of the last call."""
    for calls in range(1, END_CALLS + 1):
        try:
            call(timeout)
            return
        except KafkaException as error:
            cause = _cause(error)
            timed_out = isinstance(cause, KafkaError) and cause.code() == KafkaError._TIMED_OUT
            if calls == END_CALLS or not timed_out:
                raise


def _cause(error: KafkaException) -> object:
    return error.args[0] if error.args else error


def _failed(task: TaskId, what: str, error: object) -> TransactionError:
    """The error to raise for a failed transaction: ProducerFenced when Kafka fenced it."""
    if isinstance(error, KafkaError) and error.code() in _FENCED_CODES:
        return ProducerFenced(
            f"task {task}: Kafka fenced its producer (a newer owner initialised the task's "
            f"transactional.id): {error.str()}"
        )
    return TransactionError(f"task {task}: {what}: {error}")
