"""Restoring task state from the changelog: the background loop, and a one-off catch-up.

The restore's own librdkafka consumer (read_committed, assign() only, never commits) reads each
task's changelog partitions from the restore position kept in the task's local store, and one
`changelog.Fold` per partition folds the records into the changes written to the store. The
restore position is the consumer's position(),
not the last record's offset + 1: transaction commit markers take offsets but are never
delivered, so "last offset + 1" would stop short of the end forever.

`RestoreLoop` is the thread that keeps warm-up, standby and activating tasks following their
changelogs (an activation never waits for a restore in the batch path). `catch_up` restores one
task synchronously up to given offsets: a whole restore in one call, for tools and checks.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from smoothscale.kafka import names
from smoothscale.kafka.following import FOLLOWER_SETTINGS
from smoothscale.kafka.watermarks import WatermarkClient, watermarks
from smoothscale.runtime import _changelog
from smoothscale.runtime._changelog import Fold, read
from smoothscale.runtime.changelog import (
    ChangelogFormatError,
    MessageHeaders,
    add_record,
    parse_record,
    resume,
    take,
)
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.store import StateChanges, TaskState
from smoothscale.tasks import TaskId

log = logging.getLogger(__name__)

READ_CHUNK = 2000
"""Messages one read of a restore takes at most. `_changelog.read` folds them in C, making no
Python object a message but those its changes keep, so the garbage collector does not set the
size (at 250, the size it needed while the restore read confluent-kafka Messages, one object
each, collections had taken a fifth of a restore); a larger chunk gives the loop fewer turns:
the throughput benchmark's changelog (240,104 records, 8 tasks) restored at 436,576 records/s at
2,000 against 285,162 at 250 (medians of 4, in one process with its broker, 2026-11-27). A read
holds the loop's lock: 2,000 records take about a millisecond to read and fold."""
_CONSUME_SECONDS = 0.02
"""Longest a consume of the restore loop waits for a record, holding the loop's lock (it then
takes what is queued, up to READ_CHUNK). A caller (the instance's tick: follow, unfollow, read
positions) wakes it (`_held`)."""
QUEUE_BACKOFF_MS = 10
"""How long the restore consumer waits to fetch again once its local queue is full (librdkafka's
queued.min.messages, 100,000 records). A restore applies records more slowly than librdkafka
fetches them, so its queue fills; at librdkafka's default of 1,000 ms the fetcher then stopped
for a second while the loop drained the queue in about half that, and the restore waited out
the rest. Measured on a changelog of 132,048 records (8 tasks, one process with its broker):
81,496 records/s at the default, 102,659 at 10 ms (medians of 5). A full queue is looked at
again every 10 ms."""
WRITE_BEHIND_BYTES = 64 * 1024 * 1024
"""The most memory (about) the restore's folded changes may hold before they are written to
the stores. Folding many chunks before writing lets a key updated many times in the changelog
(a running aggregate: once per batch it changed in) reach RocksDB once, and RocksDB's inserts
were the largest part of a restore's time (docs/benchmarks/throughput.md)."""
_METADATA_SECONDS = 5.0
"""How long the loop, starting, waits for each changelog topic's metadata (see `_learn_topics`)."""
_IDLE_SECONDS = 1.0
"""How long the loop, following no task, waits before looking again (a `follow` wakes it)."""
RestoredCallback = Callable[[TaskId, int], None]
"""Called with (task, records applied) after each restored batch."""


class RestoreConsumer:
    """The restore's own librdkafka consumer (`_changelog.open_consumer`), with the part of
    confluent-kafka's Consumer API the restore uses; `_changelog.read(consumer.handle, ...)`
    consumes from it. Not confluent-kafka's Consumer: see docs/runtime.md, Restore."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.handle = _changelog.open_consumer(settings)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.incremental_assign(partitions)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        _changelog.assign(self.handle, [(p.topic, p.partition, p.offset) for p in partitions], True)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        _changelog.assign(self.handle, [(p.topic, p.partition, 0) for p in partitions], False)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        offsets = _changelog.positions(self.handle, [(p.topic, p.partition, 0) for p in partitions])
        return [
            TopicPartition(p.topic, p.partition, o)
            for p, o in zip(partitions, offsets, strict=True)
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        topic, number = partition.topic, partition.partition
        if cached:
            return _changelog.cached_watermarks(self.handle, topic, number)
        error, low, high = _changelog.query_watermarks(self.handle, topic, number, timeout)
        if error:
            raise KafkaException(KafkaError(error))
        return low, high

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        """Refresh `topic`'s metadata (partitions added since the handle last read it)."""
        if topic is None:
            raise ValueError("the restore's consumer refreshes one topic at a time")
        error = _changelog.refresh_metadata(self.handle, topic, timeout)
        if error:
            raise KafkaException(KafkaError(error))

    def close(self) -> None:
        _changelog.close(self.handle)


def restore_settings(config: WorkerConfig) -> dict[str, str]:
    """The settings of a read_committed consumer that only assign()s changelog partitions and
    never commits.

    A position the broker no longer has is an error (`auto.offset.reset` error), never a silent
    jump to the log start: the records in between would be lost from the state."""
    return {
        **FOLLOWER_SETTINGS,
        **config.client_config(),
        "group.id": names.reader_group(config.app_id),
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "isolation.level": "read_committed",
        "auto.offset.reset": "error",
        "enable.partition.eof": "false",
        "fetch.queue.backoff.ms": str(QUEUE_BACKOFF_MS),
    }


def restore_consumer(config: WorkerConfig) -> Consumer:
    """A confluent-kafka consumer with the restore's settings (for offsets and watermarks)."""
    return Consumer(restore_settings(config))


class ChangelogUnusableError(RuntimeError):
    """A task's changelog cannot give its exact state (a foreign record, records deleted by
    retention). It fails that task only: the instance reports the error and goes on."""


def foreign_record_error(task: TaskId, where: str, error: ChangelogFormatError) -> str:
    return (
        f"task {task}: {where}: {error}. A changelog belongs to one smoothscale app: make sure "
        "nothing else writes to it, then restart the instance"
    )


def retention_error(task: TaskId, topic: str, log_start: int, needed: int) -> str:
    return (
        f"task {task}: changelog {topic}[{task}] starts at offset {log_start}, but the state "
        f"needs it from offset {needed}: retention deleted changelog records, so the state "
        "cannot be restored exactly. Set cleanup.policy=compact (without delete) on the "
        "changelog topics; the lost state can only be rebuilt by reprocessing the input"
    )


def replaced_changelog_error(task: TaskId, topic: str, end: int, needed: int) -> str:
    return (
        f"task {task}: changelog {topic}[{task}] ends at offset {end}, but the state has read it "
        f"up to offset {needed}: the topic was deleted and re-created, so it no longer holds "
        "the state. Restore the topic, or rebuild the state by reprocessing the input"
    )


class _Applier:
    """Folds the consumed changelog records of the followed tasks (one `Fold` per changelog
    partition) and writes what they fold to the tasks' stores."""

    def __init__(self, changelog_topics: Mapping[str, str]) -> None:
        self._topic_of = dict(changelog_topics)
        self._folds: dict[tuple[str, TaskId], Fold] = {}
        """Per changelog partition (topic, task) of a followed task, its fold: where it stands
        and the changes folded and not yet written to the task's store."""
        self.failures: dict[TaskId, str] = {}
        """Tasks whose changelog is unusable, with the error; their records are not read."""

    def follow(self, state: TaskState) -> None:
        """Fold `state`'s changelogs from its stores' positions on."""
        for store in state.stores:
            self._folds[(self._topic_of[store], state.task)] = resume(state, store)

    def _fold_of(self, state: TaskState, store: str) -> Fold | None:
        return self._folds.get((self._topic_of[store], state.task))

    def positions(self, state: TaskState) -> dict[str, int]:
        """Per store, the changelog offset the task's state is restored to: its store's
        position, or that of the changes folded and not written yet."""
        positions = {}
        for store in state.stores:
            fold = self._fold_of(state, store)
            positions[store] = state.position(store) if fold is None else fold.position
        return positions

    def read_to(self, state: TaskState) -> dict[str, int]:
        """Per store, the changelog offset the consumer has read up to for this task (ahead of
        the restore position while the last batch read is not closed)."""
        read = {}
        for store in state.stores:
            fold = self._fold_of(state, store)
            read[store] = state.position(store) if fold is None else fold.read_to
        return read

    def partitions(self, state: TaskState) -> list[TopicPartition]:
        positions = self.positions(state)
        return [
            TopicPartition(self._topic_of[store], state.task, positions[store])
            for store in state.stores
        ]

    def write(self, states: Mapping[TaskId, TaskState], task: TaskId | None = None) -> None:
        """Write what the folds of `task` (None: of every task) changed to their stores, each
        task's in one write batch."""
        for each in list(states) if task is None else [task]:
            state = states[each]
            folds = [(store, self._fold_of(state, store)) for store in state.stores]
            if not any(fold is not None and fold.changed for _store, fold in folds):
                continue
            changes = StateChanges()
            for store, fold in folds:
                if fold is not None:
                    take(fold, store, changes)
            state.apply(changes)

    def write_caught_up(
        self, consumer: RestoreConsumer, states: Mapping[TaskId, TaskState]
    ) -> None:
        """Write what the folds changed of the tasks read to the changelog end the consumer last
        saw (cached from its fetches; an unknown end counts as reached). A task still behind
        keeps folding: a key its changelog updates again before the end reaches RocksDB once,
        not once per pause in the fetches (`read` writes when the changes grow too large)."""
        for task, state in states.items():
            read = self.read_to(state)
            if all(read[store] >= end for store, end in self.cached_ends(consumer, state).items()):
                self.write(states, task)

    def cached_ends(self, consumer: RestoreConsumer, state: TaskState) -> dict[str, int]:
        """Per store, the end of the task's changelog partition as the consumer's last fetch
        response carried it (no request); a store whose end is not known yet is left out."""
        ends: dict[str, int] = {}
        for store in state.stores:
            partition = TopicPartition(self._topic_of[store], state.task)
            _low, high = consumer.get_watermark_offsets(partition, cached=True)
            if high >= 0:
                ends[store] = high
        return ends

    def check_retention(self, consumer: RestoreConsumer, state: TaskState, timeout: float) -> None:
        """Fail `state`'s task if retention deleted changelog records it still needs."""
        for store in state.stores:
            topic = self._topic_of[store]
            log_start, _end = watermarks(consumer, topic, state.task, timeout=timeout)
            needed = state.position(store)
            if log_start > needed:
                self._fail(state.task, retention_error(state.task, topic, log_start, needed))
                return

    def _fail(self, task: TaskId, error: str) -> None:
        """The task's changelog is unusable: its records are no longer read (what its folds
        changed before is still written)."""
        log.error("%s", error)
        self.failures[task] = error

    def _out_of_range(
        self, consumer: RestoreConsumer, task: TaskId | None, states: Mapping[TaskId, TaskState]
    ) -> None:
        """The broker has no record at a followed task's position any more: fail the task
        (retention deleted records it needs, or the topic was replaced), never skip records."""
        state = None if task is None else states.get(task)
        if state is None or state.task in self.failures:
            return
        self.write(states, state.task)
        self.check_retention(consumer, state, timeout=10)
        if state.task in self.failures:
            return
        for store in state.stores:
            topic = self._topic_of[store]
            _log_start, end = watermarks(consumer, topic, state.task, timeout=10)
            needed = state.position(store)
            if end < needed:
                self._fail(state.task, replaced_changelog_error(state.task, topic, end, needed))
                return

    def forget(self, task: TaskId) -> None:
        """Drop what is kept about `task` (what its folds changed too: `write` it first)."""
        self.failures.pop(task, None)
        for key in [key for key in self._folds if key[1] == task]:
            del self._folds[key]

    def read(
        self,
        consumer: RestoreConsumer,
        states: Mapping[TaskId, TaskState],
        count: int,
        timeout: float,
    ) -> tuple[int, dict[TaskId, int]]:
        """Consume up to `count` changelog messages (waiting at most `timeout` seconds) into the
        followed tasks' folds, and move their read positions past trailing commit markers
        (which deliver no message) to the consumer's; returns the messages consumed and the
        records read per task."""
        folds = self._folds
        if self.failures:
            folds = {key: fold for key, fold in folds.items() if key[1] not in self.failures}
        consumed, counts, errors = read(consumer.handle, count, timeout, folds, self._slow)
        for topic, partition, code, text in errors:
            if code == KafkaError._AUTO_OFFSET_RESET:
                self._out_of_range(consumer, partition, states)
            elif code != KafkaError._PARTITION_EOF:
                log.warning("changelog read error on %s[%s]: %s", topic, partition, text)
        if folds:
            keys = list(folds)
            found = consumer.position([TopicPartition(topic, task) for topic, task in keys])
            for key, position in zip(keys, found, strict=True):
                folds[key].advance(position.offset)
        if sum(fold.held for fold in self._folds.values()) >= WRITE_BEHIND_BYTES:
            self.write(states)
        return consumed, counts

    def _slow(
        self,
        fold: Fold,
        topic: str,
        partition: int,
        message: tuple[int, bytes | None, bytes | None, MessageHeaders],
    ) -> bool:
        """Fold a record `read` left to parse_record (its message: offset, key, value and
        headers); False if it is not one (the task fails)."""
        offset, key, value, headers = message
        try:
            add_record(fold, offset, parse_record(key, value, headers))
        except ChangelogFormatError as format_error:
            where = f"{topic}[{partition}] at offset {offset}"
            self._fail(partition, foreign_record_error(partition, where, format_error))
            return False
        return True


def end_offsets(
    consumer: WatermarkClient, changelog_topics: Mapping[str, str], task: TaskId, timeout: float
) -> dict[str, int]:
    """Per store, the end of the task's changelog partition a read_committed reader can reach."""
    return {
        store: watermarks(consumer, topic, task, timeout=timeout)[1]
        for store, topic in changelog_topics.items()
    }


def read_through(read: Mapping[str, int] | None, offsets: Mapping[str, int]) -> bool:
    """Whether a task's changelogs are read (`read`, per store; None: not followed) up to
    `offsets` (per store, the offset to reach)."""
    return read is not None and all(read.get(store, 0) >= o for store, o in offsets.items())


class RestoreTimeoutError(TimeoutError):
    """A task could not be restored to its target offsets in time."""


def catch_up(
    config: WorkerConfig,
    state: TaskState,
    targets: Mapping[str, int] | None,
    timeout: float,
    on_restored: RestoredCallback | None = None,
) -> dict[str, int]:
    """Restore `state` until the changelog has been read up to every store's target offset.

    (The stored position can stay behind a target while a batch there is not closed: an
    activating owner's epoch marker then drops that batch.) With no targets (no previous
    owner acknowledged a release: first start or failover), the targets are the changelog
    ends as of now. Returns the stored positions reached. Raises ChangelogUnusableError when
    the changelog cannot give the exact state.
    """
    changelog_topics = config.changelog_topics()
    applier = _Applier(changelog_topics)
    consumer = RestoreConsumer(restore_settings(config))
    try:
        if targets is None:
            targets = end_offsets(consumer, changelog_topics, state.task, timeout)

        def behind() -> bool:
            return not read_through(applier.read_to(state), targets)

        applier.check_retention(consumer, state, timeout)
        if state.task in applier.failures:
            raise ChangelogUnusableError(applier.failures[state.task])
        if not behind():
            return state.positions()
        applier.follow(state)
        consumer.assign(applier.partitions(state))
        states = {state.task: state}
        deadline = time.monotonic() + timeout
        while behind():
            if time.monotonic() > deadline:
                applier.write(states)
                raise RestoreTimeoutError(
                    f"task {state.task}: restored to {state.positions()} but needs "
                    f"{dict(targets)} within {timeout} s; is the changelog readable "
                    "(an open transaction holds back read_committed readers)?"
                )
            consumed, counts = applier.read(consumer, states, READ_CHUNK, 0.2)
            drained = consumed < READ_CHUNK
            if state.task in applier.failures:
                raise ChangelogUnusableError(applier.failures[state.task])
            if drained:
                applier.write_caught_up(consumer, states)
            if on_restored is not None and counts:
                on_restored(state.task, counts.get(state.task, 0))
        applier.write(states)
        return state.positions()
    finally:
        consumer.close()


class RestoreLoop:
    """A thread that keeps the followed tasks' states up to date with their changelogs."""

    def __init__(self, config: WorkerConfig, on_restored: RestoredCallback | None = None) -> None:
        self._topics = sorted(set(config.changelog_topics().values()))
        self._applier = _Applier(config.changelog_topics())
        self._consumer = RestoreConsumer(restore_settings(config))
        self._on_restored = on_restored
        self._states: dict[TaskId, TaskState] = {}
        self._lock = threading.Lock()
        self._callers = 0
        """Calls waiting for or holding `_lock`: the loop lets them go first."""
        self._no_callers = threading.Condition()
        self._stopping = threading.Event()
        self._followed = threading.Event()
        """Set by `follow` and `stop`: wakes the loop from waiting for a task to follow."""
        self._read: dict[TaskId, dict[str, int]] = {}
        """Per followed task, how far its changelogs are read, as of the loop's last turn (and
        of follow and unfollow since): what `wait_until_read` looks at, without the lock."""
        self._turned = threading.Condition()
        """Notified when `_read` changes."""
        self._thread = threading.Thread(target=self._run, name="restore-loop", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def follow(self, state: TaskState) -> None:
        """Keep `state` restored from now on; the loop owns it until `unfollow`.

        Returns at once: a position that retention deleted shows as the first fetch's
        out-of-range error, which fails the task (asking the broker here would wait behind the
        consumer's fetches, about half a second a task, measured)."""
        with self._held():
            if state.task in self._states:
                raise ValueError(f"task {state.task} is already being restored")
            self._states[state.task] = state
            self._applier.follow(state)
            self._consumer.incremental_assign(self._applier.partitions(state))
            self._publish()
            self._followed.set()

    def unfollow(self, task: TaskId) -> TaskState | None:
        """Stop restoring `task` and hand its state back (None if it was not followed), with
        everything the loop has folded written to it."""
        with self._held():
            if task in self._states:
                self._applier.write(self._states, task)
            state = self._states.pop(task, None)
            self._applier.forget(task)
            self._publish()
            if state is not None:
                self._consumer.incremental_unassign(
                    [TopicPartition(p.topic, p.partition) for p in self._applier.partitions(state)]
                )
            return state

    def failures(self) -> dict[TaskId, str]:
        """Followed tasks whose changelog is unusable, with the error (they are not restored)."""
        with self._held():
            return dict(self._applier.failures)

    def tasks(self) -> set[TaskId]:
        with self._held():
            return set(self._states)

    def positions(self) -> dict[TaskId, dict[str, int]]:
        """Per followed task, the restore position of each store (as folded: what the loop
        writes to the store before the state leaves it)."""
        with self._held():
            return {task: self._applier.positions(state) for task, state in self._states.items()}

    def positions_and_ends(self) -> dict[TaskId, tuple[dict[str, int], dict[str, int]]]:
        """Per followed task, the restore position of each store and the changelog end the
        consumer last saw (cached from fetch responses, no request), taken together: ends -
        positions is one consistent view of the lag. An unknown end is left out."""
        with self._held():
            applier, consumer = self._applier, self._consumer
            return {
                task: (applier.positions(state), applier.cached_ends(consumer, state))
                for task, state in self._states.items()
            }

    def read_positions(self) -> dict[TaskId, dict[str, int]]:
        """Per followed task, how far the changelog has been read, per store (ahead of the
        restore position while the last batch read is not closed)."""
        with self._held():
            return {task: self._applier.read_to(state) for task, state in self._states.items()}

    def wait_until_read(self, offsets: Mapping[TaskId, Mapping[str, int]], timeout: float) -> bool:
        """Wait until every task in `offsets` is read through its offsets (see read_through),
        at most `timeout` seconds; whether they are. Looks again after each turn of the loop
        that read: an activation's wait ends with the turn that reads its target (until
        2026-11-28 it looked every 20 ms, and each look took the loop's lock)."""

        def through() -> bool:
            read = self._read
            return all(read_through(read.get(task), wanted) for task, wanted in offsets.items())

        with self._turned:
            return self._turned.wait_for(through, timeout)

    def lags(self) -> dict[TaskId, int]:
        """Per followed task, changelog records not yet applied (summed over stores), as of the
        end offsets the last fetch responses carried (no extra request)."""
        with self._held():
            lags: dict[TaskId, int] = {}
            for task, state in self._states.items():
                positions = self._applier.positions(state)
                ends = self._applier.cached_ends(self._consumer, state)
                lags[task] = sum(max(0, end - positions[store]) for store, end in ends.items())
            return lags

    def _publish(self) -> None:
        """Publish how far the followed tasks are read (holding `_lock`)."""
        read = {task: self._applier.read_to(state) for task, state in self._states.items()}
        with self._turned:
            self._read = read
            self._turned.notify_all()

    @contextmanager
    def _held(self) -> Iterator[None]:
        """`_lock`, ahead of the loop: the loop holds it through a consume (_CONSUME_SECONDS) and
        takes it again at once, so a caller contends with it at every turn. Measured with one
        caller every 0.1 s (the instance's tick), a restore of 48,828 records took 1.34 s on a
        plain lock and 0.75 s this way. The loop waits while any caller does, and a caller wakes
        the consume it holds the lock through (`_changelog.wake`) rather than wait it out: an
        activation makes a few calls per task, and eight unfollows one after the other waited
        about 80 ms for consumes (measured)."""
        with self._no_callers:
            self._callers += 1
        try:
            if not self._lock.acquire(blocking=False):
                _changelog.wake(self._consumer.handle)  # its consume returns now
                self._lock.acquire()
            try:
                yield
            finally:
                self._lock.release()
        finally:
            with self._no_callers:
                self._callers -= 1
                self._no_callers.notify_all()

    def _learn_topics(self) -> None:
        """Ask the broker for the changelog topics' metadata before any task is followed.

        librdkafka learns a topic's partition leaders when it is first assigned, with a metadata
        request on the connection it has; when that request was sent on the bootstrap
        connection, which the client drops once it knows the brokers, the answer was lost and the
        partitions waited for the next scan of unknown topics, up to a second later: three of
        four restores of the throughput benchmark that followed their tasks 0.3 s after the
        loop started read their first record 0.6 s late (2026-11-28). Asked here, the leaders
        are in the client's metadata cache when the first task is followed. A topic not created
        yet, or a broker that does not answer (then the loop asks no more), is learnt the slow
        way: only the first read waits."""
        for topic in self._topics:
            if self._stopping.is_set():
                return
            try:
                self._consumer.list_topics(topic, timeout=_METADATA_SECONDS)
            except KafkaException as error:
                log.info("no changelog metadata yet (%s): learnt on the first read", error)
                return

    def _run(self) -> None:
        try:
            self._learn_topics()
            while not self._stopping.is_set():
                with self._no_callers:
                    self._no_callers.wait_for(lambda: not self._callers, timeout=1)
                with self._lock:
                    if not self._states:
                        self._followed.clear()
                        idle = True
                    else:
                        idle = False
                        consumed, counts = self._applier.read(
                            self._consumer, self._states, READ_CHUNK, _CONSUME_SECONDS
                        )
                        drained = consumed < READ_CHUNK
                        if drained:  # read all there was for now: written while it waits
                            self._applier.write_caught_up(self._consumer, self._states)
                        self._publish()
                if idle:
                    self._followed.wait(_IDLE_SECONDS)
                elif self._on_restored is not None:
                    for task, count in counts.items():
                        self._on_restored(task, count)
        except BaseException as error:
            log.exception("the restore loop failed")
            self.error = error

    def stop(self) -> None:
        """Stop the thread and close every followed state and the consumer."""
        self._stopping.set()
        self._followed.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._held():
            self._applier.write(self._states)
            for state in self._states.values():
                state.close()
            self._states.clear()
            self._consumer.close()
