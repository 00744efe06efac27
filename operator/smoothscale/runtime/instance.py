"""The instance state machine: which tasks this instance holds, in which role, and hand-overs.

The instance follows its assignment (smoothscale.kafka.assignments) and applies each new one
at a micro-batch boundary: the worker's main thread calls `tick`, and a micro-batch runs
`commit_batch`; both hold `lock`, so an assignment is never applied in the middle of a batch.

Per task, the instance is in one of these states:
- following (warm-up or standby): the restore loop keeps the task's local state up to date;
- activating (assigned active, not yet processing): still following, until the state reaches
  the assignment's restoreUntil (or, with none, the changelog end seen when it was assigned);
  then the instance writes an epoch marker in a transaction of the task's producer, restores
  through the marker, and the task becomes active;
- active: its input partitions are in the source's plan, each batch commits one transaction;
- released: an active task missing from a newer assignment; after the batch in flight has
  committed, the instance closes the task's producer and reports `released` with its final
  changelog offsets, until the task is assigned to this instance again (a restarted instance
  finds such tasks in its previous reports and reports them released again);
- refused: assigned active below the epoch its changelog holds; reported until the next
  assignment.
See docs/runtime.md for the full protocol and the exactly-once argument.
"""

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from smoothscale.kafka.assignments import Assignment, AssignmentFollower, describe
from smoothscale.kafka.progress import (
    InputPositionCommitter,
    ProgressCommitter,
    ProgressReader,
    ReportedRole,
    TaskReport,
)
from smoothscale.kafka.retention import DELETE_RETENTION, tombstone_retention_seconds
from smoothscale.kafka.watermarks import watermarks
from smoothscale.runtime.changelog import (
    ChangelogFormatError,
    ChangelogRecord,
    RecordKind,
    changes,
    closer,
    marker,
    parse_record,
    state_key_of,
    tombstone,
)
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.decode import PIPELINE_ERROR, pipeline_error
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.pipeline import Pipeline
from smoothscale.runtime.processor import PreparedProcessor, run_batch
from smoothscale.runtime.processor.loop import due_without_input, no_rows, rows_of_key
from smoothscale.runtime.restore import (
    RestoreLoop,
    end_offsets,
    read_through,
    restore_consumer,
)
from smoothscale.runtime.source import write_plan
from smoothscale.runtime.spark import SPARK_CORES
from smoothscale.runtime.store import (
    StateChanges,
    TaskState,
    record_key_of,
    task_directory,
    value_of,
)
from smoothscale.runtime.transactions import (
    ChangelogSpan,
    OutputRecord,
    TaskLost,
    TaskProducer,
    TransactionError,
    task_client,
)
from smoothscale.runtime.writer import Writer
from smoothscale.tasks import TaskId, TaskRole

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

RETENTION_TIMEOUT_SECONDS = 3.0
"""Longest an instance waits for the brokers to say how long they keep tombstones; without an
answer it reuses stores for up to state_reuse_seconds, and says so."""

DeadLetterSender = Callable[[Producer, list[Any]], int]
"""Queues a task's bad rows on the task's producer (inside its transaction); returns how many."""


TICK_LOCK_SECONDS = 0.5
"""How long a tick waits for the micro-batch in flight before trying again later."""

TOMBSTONES_PER_BATCH = 100
"""Garbage records a batch reclaims at most beyond one per key it changes: what drains a backlog
of garbage (a restored state's, or one left by batches that changed more keys)."""

GAP_READ_SECONDS = 5.0
"""Longest a batch reads changelog records others wrote between its own, to verify them."""

MARKER_READ_SECONDS = 1.0
"""How long a tick that wrote epoch markers waits for the restore loop to read them back (one
fetch, usually well under this) before it leaves the activation to a later tick."""
MARKER_NEAR_OFFSETS = 16
"""A marker is read back within the tick only when at most this many changelog offsets lie
between what the restore loop had read and the marker's end (the marker, its transaction's
commit, a few stray records): a longer restore through it goes on in the background."""

MARKER_ATTEMPTS = 3
"""Transactions an activation tries for its epoch marker before the error stops the worker: a
transaction can fail for a passing reason (a request timed out on a loaded broker)."""

TARGET_NEAR_OFFSETS = 20_000
"""An activation's restore target at most this many changelog offsets ahead of what the
restore loop has read is waited for within the tick, up to MARKER_READ_SECONDS; a farther one
restores in the background. It covers a caught-up warm-up's distance (the old owner's last
batches) and, twice over, the operator's default acceptableRecoveryLag (10,000): a task it
moves to a new owner as caught up within that lag, before the warm-up has read anything, is
restored in the tick (a warm-up restores about a million records a second) and joins the
first batch with the tasks moved beside it. At 5,000, the demo's third task (moved at 5,435-
5,727 offsets) restored in the background, was processed one batch after the other two, and
stopped 3.0-3.4 s where they stopped 1.8-2.3 s."""

WARM_UP_RECORDS = 1_000
"""Recent input records a new instance reads once, and discards, to warm its query."""

PIPELINE_ERROR_REPORTED_SECONDS = 60.0
"""For how long an active task's reports carry the pipeline's last error on its records (the
operator shows it as a TaskFailing problem), so that a pipeline raising on every batch stays
visible without flapping."""


_STATE_DECODER = json.JSONDecoder()
"""Reads a state's JSON: a stored value is the changelog encoder's ASCII, so it is decoded as
text at once (json.loads would first guess the encoding of the bytes, a third of its time)."""


def _state(stored: bytes) -> Any:
    """A stored state value. Digits alone are a non-negative int (a count, the commonest
    state): read without the decoder, whose call cost more than the rest (`json_bytes` writes
    such a state the same way)."""
    return int(stored) if stored.isdigit() else _STATE_DECODER.decode(stored.decode())


class BatchLock:
    """The instance's lock: re-entrant, and its next turn can be kept for one thread.

    `commit_behind` hands a batch's commit to a thread of its own while holding the lock; that
    thread must be the next to hold it, before any tick, shutdown or batch without input, or
    those would run before the commit they follow (a shutdown releasing the tasks with the
    batch not committed, a release reported at the position before it)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._turn = threading.Condition()
        self._kept_for: int | None = None
        """The thread whose turn is next (its ident), if one is kept."""
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._lock.acquire()
            self._depth += 1
            return True
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self._turn:
            while self._kept_for is not None and self._kept_for != me:
                left = None if deadline is None else deadline - time.monotonic()
                if not blocking or (left is not None and left <= 0):
                    return False
                self._turn.wait(left)
        left = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(blocking, left):
            return False
        self._owner, self._depth = me, 1
        with self._turn:
            if self._kept_for == me:
                self._kept_for = None
                self._turn.notify_all()
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()

    def keep_turn_for(self, thread: threading.Thread) -> None:
        """Make `thread` (started) the next to hold the lock after its holder, the caller."""
        with self._turn:
            self._kept_for = thread.ident

    def __enter__(self) -> "BatchLock":
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


@dataclass
class BatchInput:
    """One micro-batch, grouped by task (= input partition)."""

    ends: dict[TaskId, dict[str, int]] = field(default_factory=dict)
    """Per task, per input topic: the offset after the batch's last record."""
    read_from: dict[tuple[str, int], int] | None = None
    """The input positions the batch's rows were read at or after (`Instance.read_from`): a
    task whose position is no longer that when the batch commits (taken away, or taken again
    elsewhere, meanwhile) is left out. None: the positions when it commits."""
    counts: dict[TaskId, int] = field(default_factory=dict)
    """Per task: input records in the batch (good and bad)."""
    newest: dict[TaskId, float] = field(default_factory=dict)
    """Per task: the timestamp (seconds since the epoch) of the newest record in the batch,
    when its records carry one."""
    updates: dict[TaskId, list[tuple[str, Any]]] = field(default_factory=dict)
    """Per task: the pipeline's (key, update) pairs."""
    dead_letters: dict[TaskId, list[Any]] = field(default_factory=dict)
    """Per task: the bad rows to send to the dead-letter topic."""
    records_of: Callable[[TaskId, str], list[Any]] | None = None
    """The batch's records (as read) of a key in a task, for when `apply` raises on that key:
    they go to the dead-letter topic and the key's state stays as it was. None: `apply`
    raising fails the batch."""
    rows: "dict[TaskId, pd.DataFrame]" = field(default_factory=dict)
    """A processor pipeline's input, per task: the decoded good records (the value schema's
    fields and their `offset`), in input order. A task with none runs with no rows."""
    records_at: Callable[[TaskId, list[int]], list[Any]] | None = None
    """The batch's records (as read) of a task at the given input offsets, for when a
    processor's handleInputRows raises on a grouping key: they go to the dead-letter topic.
    None: a handler raising fails the batch."""


@dataclass
class _Active:
    writer: Writer
    state: TaskState
    producer: TaskProducer
    batch: int = 0
    """The writer's last committed batch (0: none, or only the start position)."""
    last_closer: bytes | None = None
    """The key of the writer's last closer, which its next closer supersedes."""
    input_time: float | None = None
    """The timestamp of the newest input record processed here (reported: the input lag in
    seconds)."""
    unverified_from: int = 0
    """The pipeline store's changelog offset right after the writer's last verified record
    (nobody above this writer wrote before it): from here on, nothing is verified yet, the
    slot of that record's commit marker included."""
    unverified: list[tuple[int, list[bytes]]] = field(default_factory=list)
    """Per committed batch not verified yet: the offset after its transaction, and the record
    keys it superseded (garbage once the batch is verified)."""

    @property
    def epoch(self) -> int:
        return self.writer.epoch


@dataclass
class _Marked:
    """An activation whose epoch marker is written: the task turns active once the restore
    loop has read the changelog through the marker (`through`)."""

    writer: Writer
    producer: TaskProducer
    through: dict[str, int]


@dataclass
class _Activation:
    epoch: int
    targets: dict[str, int] | None
    producer: TaskProducer | None = None
    """The task's producer, initialised at once for a failover (see `Instance._apply`)."""
    client: Producer | None = None
    """Otherwise the client its producer initialises at the marker, made while the task was a
    warm-up or standby here (`task_client`), if it was."""
    marked: _Marked | None = None

    def waits_for(self) -> dict[str, int]:
        """The changelog offsets the restore loop must have read before the next step."""
        return self.marked.through if self.marked is not None else dict(self.targets or {})

    def close(self) -> None:
        if self.marked is not None:
            self.marked.producer.close()
        elif self.producer is not None:
            self.producer.close()


class Instance:
    """One instance's tasks, their roles, and the hand-over protocol's instance side."""

    def __init__(
        self,
        config: WorkerConfig,
        pipeline: Pipeline | PreparedProcessor,
        metrics: InstanceMetrics,
        plan_path: Path,
        send_dead_letters: DeadLetterSender | None = None,
    ) -> None:
        if pipeline.store not in config.stores:
            raise ValueError(
                f"the pipeline updates store {pipeline.store!r}, which the worker config does "
                f"not declare (stores: {', '.join(config.stores)}); add it to kafka stores"
            )
        self.config = config
        self.pipeline = pipeline
        self.metrics = metrics
        self.plan_path = plan_path
        self._send_dead_letters = send_dead_letters
        self.lock = BatchLock()
        self.stopping = False
        self._closed = False
        self.assignment = Assignment(generation=0)
        """The assignment applied last (an empty one until the first arrives)."""
        self._applied_generation = -1
        self._pending: Assignment | None = None
        self._pending_lock = threading.Lock()
        """Guards `_pending` and the follower: the main thread's tick and the micro-batch's
        `after_batch` both poll it."""
        self._active: dict[TaskId, _Active] = {}
        self._activating: dict[TaskId, _Activation] = {}
        self._clients: dict[TaskId, Producer] = {}
        """Per task held here as a warm-up or standby: the client of its producer, connected
        before it is given as active (`task_client`)."""
        self._released: dict[TaskId, TaskReport] = {}
        self._pipeline_errors: dict[TaskId, tuple[float, str]] = {}
        """Per active task, when the pipeline last raised on some of its records, and what."""
        self._refused: dict[TaskId, TaskReport] = {}
        """Tasks assigned active below the epoch their changelog holds: reported `refused`
        until a new assignment arrives."""
        self._fenced: dict[TaskId, TaskReport] = {}
        """Tasks this instance found a higher writer for: reported `fenced` until a new
        assignment arrives."""
        self._plan_starts: dict[tuple[str, int], int] = {}
        self._warm_up: dict[tuple[str, int], int] = {}
        """Sample ranges of recent input the query reads once before the instance is ready."""
        self.warmed = threading.Event()
        """Set once a micro-batch has run the pipeline over the warm-up sample."""
        self.last_read = time.monotonic()
        """When a micro-batch last read input (its tasks' or a warm-up sample's)."""
        self._activations: dict[tuple[str, int], int] = {}
        """Per input partition, how often it was activated: the source restarts a partition
        from its plan start whenever this changes, even at an unchanged start offset."""
        self._plan_version = 0
        self._last_report = 0.0
        self._restored_since: dict[TaskId, int] = {}
        self._restored_lock = threading.Lock()
        client = config.kafka_config
        self._follower = AssignmentFollower(
            config.bootstrap_servers,
            config.app_id,
            config.instance_id,
            client,
            on_bad_record=metrics.count_bad_assignment_record,
            uid=config.instance_uid,
        )
        self._reports = ProgressCommitter(
            config.bootstrap_servers,
            config.app_id,
            config.instance_id,
            config.changelog_topics(),
            client,
            uid=config.instance_uid,
        )
        self._in_flight: list[float] = []
        """When each micro-batch in flight began: one reading its input, and one whose commit
        runs behind it (`commit_behind`)."""
        self._reading: float | None = None
        """When the micro-batch reading its input now began, until it ends in `commit_behind`:
        an assignment that stops one of its tasks waits for that end (`_between_batches`)."""
        self._committer: threading.Thread | None = None
        """The thread committing a micro-batch behind the next one's reading, if any."""
        self._committer_error: BaseException | None = None
        self._promised: dict[tuple[str, int], int] | None = None
        """While a batch commits behind: the input positions once it has committed."""
        self._progressed_at = time.monotonic()
        """When the instance last made progress: a batch completed, a task turned active."""
        self._input_waiting = False
        """Whether its active tasks had input waiting when it last looked."""
        self._reports_lock = threading.Lock()
        """Orders report commits: the micro-batch's and a tick's beat (`_beat`)."""
        self._latest_reports: dict[TaskId, TaskReport] = {}
        self._reported_at = 0.0
        self._previous_reports: dict[TaskId, TaskReport] = {}
        """What a previous run of this pod reported last, until the first assignment is
        applied (`_finish_interrupted_releases`)."""
        self.replaced = False
        """Another pod has taken this instance's name (this process outlived its pod): it
        holds nothing, commits nothing and reports nothing any more; the worker exits."""
        self._inputs = InputPositionCommitter(config.bootstrap_servers, config.app_id, client)
        self._offsets = restore_consumer(config)
        self._restore = RestoreLoop(config, self._count_restored)
        self._reuse_seconds: Future[float] = Future()
        """How long after its last write a local store is reused (`_state_reuse_limit`), read
        from the brokers in the background from `start`."""

    # Lifecycle -------------------------------------------------------------------------

    def start(self, first_assignment_timeout: float = 5.0) -> None:
        """Start the restore loop, write the (empty) plan, read what a previous run of this
        pod reported last, and take the first assignment."""
        self._write_plan()
        self._restore.start()
        threading.Thread(
            target=lambda: self._reuse_seconds.set_result(self._read_state_reuse_limit()),
            name="delete-retention",
            daemon=True,
        ).start()
        self._previous_reports = self._read_previous_reports()
        first = self._follower.poll(timeout=first_assignment_timeout)
        if first is not None:
            self._pending = first
        self.tick()

    def _state_reuse_limit(self) -> float:
        """How long after its last write a local store may be reused: state_reuse_seconds, but
        at most half the shortest `delete.retention.ms` of the changelogs, so that every delete
        written since is still there to read (the other half is the restore's margin). The
        brokers are asked once, as the instance starts; a store to reuse waits for their answer
        (at most RETENTION_TIMEOUT_SECONDS)."""
        return self._reuse_seconds.result()

    def _read_state_reuse_limit(self) -> float:
        configured = self.config.state_reuse_seconds
        topics = sorted(set(self.config.changelog_topics().values()))
        try:
            retention = tombstone_retention_seconds(
                self.config.client_config(), topics, RETENTION_TIMEOUT_SECONDS
            )
        except Exception as error:  # whatever the brokers answer, a store must not wait for ever
            log.warning(
                "cannot read %s of the changelogs %s (%s): local stores are reused for up to "
                "state_reuse_seconds (%.0f s), which is safe only while that is at most half "
                "of it; grant the instance's Kafka principal DescribeConfigs on its changelogs",
                DELETE_RETENTION,
                ", ".join(topics),
                error,
                configured,
            )
            return configured
        limit = min([configured, *(seconds / 2 for seconds in retention.values())])
        if limit < configured:
            log.info(
                "local stores are reused for up to %.0f s after their last write: half the "
                "changelogs' shortest %s, below state_reuse_seconds (%.0f s)",
                limit,
                DELETE_RETENTION,
                configured,
            )
        return limit

    def _read_previous_reports(self) -> dict[TaskId, TaskReport]:
        """This pod's last reports, from a previous run of it (a container restarted in
        place), if any: what it held when it stopped."""
        topics = self.config.changelog_topics()
        metadata = self._offsets.list_topics(timeout=10).topics
        tasks = max(
            (len(metadata[t].partitions) for t in topics.values() if t in metadata), default=0
        )
        reader = ProgressReader(
            self.config.bootstrap_servers, self.config.app_id, topics, self.config.kafka_config
        )
        try:
            previous = reader.reports(self.config.instance_id, tasks)
        finally:
            reader.close()
        return {
            task: report
            for task, report in previous.items()
            # Not another pod's of the same name (a predecessor's, or a zombie's).
            if report.uid is None or report.uid == self.config.instance_uid
        }

    def _finish_interrupted_releases(self, assignment: Assignment) -> None:
        """A previous run of this instance (a container restarted in place mid-hand-over) may
        have held tasks active, or released them, that `assignment` (the first this run
        applies) does not give it at all, and died before the operator saw their release:
        report them released now, so the hand-over can end. (A task it gives back, in any
        role, was seen released: the operator gives a source a replica only after.)"""
        previous, self._previous_reports = self._previous_reports, {}
        for task, report in sorted(previous.items()):
            if task in assignment.tasks:
                continue
            if report.role not in (ReportedRole.ACTIVE, ReportedRole.RELEASED):
                continue
            if not task_directory(self.config.state_dir, task).exists():
                # Not this disk's task: a new pod under the same name, which the operator takes
                # for a new instance (the old one's tasks fail over); it owes no release.
                continue
            positions = dict(report.positions)
            state = self._open_state(task)
            positions = {
                store: max(p, positions.get(store, 0)) for store, p in state.positions().items()
            }
            state.close()
            # At the generation of `assignment`: only a newer one can end the release.
            self._released[task] = TaskReport(
                task, ReportedRole.RELEASED, report.epoch, assignment.generation, positions
            )
        if self._released:
            log.info("reporting tasks released by a previous run: %s", sorted(self._released))
            self._best_effort("report the releases", self._commit_reports, self._released.values())

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One micro-batch done whole under the lock (an assignment is applied before or after
        it, never in the middle), timed for the stall watch: a batch without input (a
        processor's timers), a test's. A streaming engine's batches read without the lock and
        end in `commit_behind`."""
        with self.lock:
            started = self._began()
            try:
                yield
            finally:
                self.batch_ended(started)

    def batch_began(self) -> float:
        """A streaming engine's micro-batch began reading, without the lock; returns its start,
        for `commit_behind`."""
        self._reading = self._began()
        return self._reading

    def _began(self) -> float:
        """A micro-batch began (for the stall watch); returns its start, for `batch_ended`."""
        started = time.monotonic()
        self._in_flight.append(started)
        return started

    def batch_ended(self, started: float) -> None:
        self._in_flight.remove(started)
        if self._reading == started:
            self._reading = None
        self._progressed_at = time.monotonic()

    def commit_behind(self, batch: BatchInput | None, started: float) -> None:
        """End the micro-batch that began at `started` (`batch_began`): commit what it read
        (None: nothing), then do what `after_batch` does.

        The commit runs behind, on a thread of its own, and this returns at once: the engine
        plans and reads its next batch meanwhile (reading takes most of a batch, committing
        a quarter, and they use different processes). The next batch reads from where this
        one will have left each task (`read_from`), and its own commit waits for this one.
        Whenever something waits on the batch's end (an assignment to apply, a task being
        activated, the instance stopping), it commits here instead, and the assignment is
        applied before the engine plans the next batch, as a hand-over needs. A commit that
        failed behind fails the next call, or the next tick."""
        handed_over = False
        try:
            self._join_committer()
            with self.lock:
                if self._reading == started:
                    self._reading = None  # read: an assignment waiting for it applies below
                if self.stopping:
                    return  # shut down or replaced meanwhile: nothing more is committed
                self._poll_assignment()
                waited_on = (
                    self._pending is not None
                    or self._activating
                    or self._follower.replaced_by is not None
                )
                if batch is None or not batch.ends or waited_on:
                    if batch is not None:
                        self.commit_batch(batch)
                        self.metrics.observe_batch(time.monotonic() - started)
                    self.after_batch()
                    return
                self._promised = self._positions_after(batch)
                self._committer = threading.Thread(
                    target=self._commit, args=(batch, started), name="commit", daemon=True
                )
                self._committer.start()
                self.lock.keep_turn_for(self._committer)
                handed_over = True  # the committer ends the batch
        finally:
            if not handed_over:
                self.batch_ended(started)

    def _commit(self, batch: BatchInput, started: float) -> None:
        """The committer: a batch's commit, then what `after_batch` does, under the lock."""
        try:
            with self.lock:
                try:
                    if self._closed:
                        return  # a shutdown that gave up waiting closed the channels
                    self.commit_batch(batch)
                    self.metrics.observe_batch(time.monotonic() - started)
                    self.after_batch()
                finally:
                    self._promised = None
        except BaseException as error:
            log.exception("a micro-batch's commit failed")
            self._committer_error = error
        finally:
            self.batch_ended(started)

    def _join_committer(self) -> None:
        """Wait for the commit running behind, if any; raise its error if it failed."""
        committer = self._committer
        if committer is not None:
            committer.join()
        self._raise_commit_error()

    def _raise_commit_error(self) -> None:
        if self._committer_error is not None:
            raise RuntimeError("a micro-batch's commit failed") from self._committer_error

    def stalled_for(self) -> float | None:
        """How long the instance has been stalled, if it is: once its query runs (it is
        ready), a micro-batch running longer than the stall timeout, or none completed for
        that long while its active tasks have input waiting."""
        if not self.metrics.ready:
            return None
        now, timeout = time.monotonic(), self.config.stall_timeout
        started = min(self._in_flight, default=None)
        if started is not None and now - started > timeout:
            return now - started
        idle = now - self._progressed_at
        if started is None and self._active and self._input_waiting and idle > timeout:
            return idle
        return None

    def _watch_progress(self) -> None:
        """Keep the liveness endpoint in step with the stall watch."""
        stalled = self.stalled_for()
        why = None
        if stalled is not None:
            why = (
                f"no micro-batch completed for {stalled:.0f} s while input waits (stall timeout "
                f"{self.config.stall_timeout:.0f} s): the pipeline or the query is stuck"
            )
        if why is not None and self.metrics.stalled is None:
            log.error("instance %s is stalled: %s", self.config.instance_id, why)
        self.metrics.set_stalled(why)

    def tick(self) -> None:
        """Called often by the worker's main thread: between micro-batches, apply a new
        assignment, activate caught-up tasks, report progress. Never runs during a batch: if
        one is in flight, it returns and the next call (or the batch's own `after_batch`)
        does the work."""
        if self._restore.error is not None:
            raise RuntimeError("the restore loop failed") from self._restore.error
        self._raise_commit_error()
        self._watch_progress()
        self._poll_assignment()
        # A batch in flight holds the lock: try again at the next tick rather than queue up
        # behind it, so the caller stays responsive (SIGTERM).
        if not self.lock.acquire(timeout=TICK_LOCK_SECONDS):
            self._beat()
            return
        try:
            self._between_batches()
        finally:
            self.lock.release()

    def after_batch(self) -> None:
        """Called at a micro-batch's end, holding the lock (by `commit_behind`, before the
        engine plans the next one when something waits on it): the tick's work, done there.
        On a busy instance batches run back to back, and a main-thread tick often comes only
        after Spark has planned the next batch from the old plan: a task handed over during a
        batch would then sit out one more batch on both sides (on its old owner, read and
        dropped; on its new one, not read)."""
        if self._closed:
            return  # a shutdown that gave up waiting for this batch closed the channels
        self._poll_assignment()
        self._between_batches()

    def _poll_assignment(self) -> None:
        """Take the newest assignment the operator wrote, if any, as the one to apply next."""
        with self._pending_lock:
            newest = self._follower.poll(timeout=0)
            if newest is not None:
                self._pending = newest

    def _between_batches(self) -> None:
        """Apply the pending assignment, step activations, report when due (holding the lock)."""
        if self._follower.replaced_by is not None and not self.replaced:
            self._step_down(self._follower.replaced_by)
        if self.stopping:
            return
        with self._pending_lock:
            assignment = self._pending
            if assignment is not None and not self._waits_for_batch(assignment):
                self._pending = None
            else:
                assignment = None
        if assignment is not None:
            self._apply(assignment)
        self._activate_caught_up()
        if time.monotonic() - self._last_report >= self.config.report_interval:
            self._report()

    def _waits_for_batch(self, assignment: Assignment) -> bool:
        """Whether `assignment` waits for the end of the micro-batch reading now: it stops a
        task active here (released, or taken at a new epoch), whose input that batch reads.
        Applied now, the batch's records of the task would be dropped and read again by
        the next owner, and the task would stand still from its last commit, up to a batch
        before the release, until the next owner's first. Applied at the batch's end
        (`commit_behind`), the old owner commits them, and releases right after. A batch
        reading for longer than the stall timeout is not waited for: the operator fails the
        tasks of a stalled instance over, and its word to let them go applies at once, so that
        the batch, should it end after all, commits nothing of them."""
        if self._reading is None or assignment.generation <= self._applied_generation:
            return False
        if time.monotonic() - self._reading > self.config.stall_timeout:
            return False
        for task, active in self._active.items():
            held = assignment.tasks.get(task)
            if held is None or held.role is not TaskRole.ACTIVE or held.epoch != active.epoch:
                return True
        return False

    def _step_down(self, successor: str) -> None:
        """This process outlived its pod: another pod (`successor`) runs under its name. Let go
        of everything at once, with no commit and no report: the tasks are the operator's to
        give, and what this process would say is about a pod that no longer exists."""
        log.error(
            "instance %s: the pod this process belongs to (uid %s) has been replaced by pod %s "
            "under the same name: stopping every task without committing anything",
            self.config.instance_id,
            self.config.instance_uid,
            successor,
        )
        self.replaced = self.stopping = True
        for task in list(self._active):
            self._stop_processing(task).state.close()
        for task in list(self._activating):
            self._activating.pop(task).close()
        for task in self._restore.tasks():
            dropped = self._restore.unfollow(task)
            if dropped is not None:
                dropped.close()
        self._released, self._refused, self._fenced = {}, {}, {}
        self._clients.clear()
        with self._reports_lock:
            self._latest_reports = {}

    def shutdown(self, timeout: float) -> bool:
        """Release every task and close everything. Waits up to `timeout` for a batch in
        flight to finish; returns False if it did not (the tasks are then not released)."""
        if self._closed:
            return True
        acquired = self.lock.acquire(timeout=timeout)
        self._closed = True
        try:
            self.stopping = True
            if acquired:
                for task in sorted(self._active):
                    self._release(task)
                self._report()
            self._restore.stop()
            for task in list(self._active):
                active = self._active.pop(task)
                active.producer.close()
                active.state.close()
            self._clients.clear()
        finally:
            if acquired:
                self.lock.release()
            self._follower.close()
            self._reports.close()
            self._inputs.close()
            self._offsets.close()
        return acquired

    # Queries -----------------------------------------------------------------------------

    def active_tasks(self) -> dict[TaskId, int]:
        """Active task -> its ownership epoch."""
        with self.lock:
            return {task: active.epoch for task, active in self._active.items()}

    def warm_up(
        self,
        records: int = WARM_UP_RECORDS,
        partitions: int = SPARK_CORES,
        lock_timeout: float = -1,
    ) -> bool:
        """Have the query read a sample of recent input once (the last `records` of each of up
        to `partitions` input partitions this instance does not own), so that its next
        micro-batch runs the whole path of a real batch (the source's Python readers, one per
        partition read at once, decode, aggregate, their code generation) while nothing
        depends on it: the first batch of a task handed over later is then as fast as a steady
        one. Nothing of the sample is applied or committed. False when there is no input to
        sample (then there is nothing to warm with), or when a micro-batch holds the instance
        for longer than `lock_timeout` seconds (-1: wait as long as it does; a batch that hangs
        would keep the caller for ever)."""
        if not self.lock.acquire(timeout=lock_timeout):
            return False
        try:
            owned = {(topic, task) for topic in self.config.input_topics for task in self._active}
            sample: dict[tuple[str, int], int] = {}
            try:
                for topic in self.config.input_topics:
                    for partition in self._partitions_of(topic):
                        if len(sample) == partitions:
                            break
                        if (topic, partition) in owned:
                            continue
                        low, high = watermarks(self._offsets, topic, partition, timeout=10)
                        if high > low:
                            sample[(topic, partition)] = max(low, high - records)
            except KafkaException as error:
                log.warning("no warm-up sample (%s): the instance is ready cold", error)
                return False
            if not sample:
                return False
            self._warm_up = sample
            self.warmed.clear()
            self._write_plan()
            return True
        finally:
            self.lock.release()

    def end_warm_up(self, lock_timeout: float = -1) -> bool:
        """Take the warm-up sample out of the plan; False if a micro-batch held the instance
        for longer than `lock_timeout` seconds (-1: wait as long as it does)."""
        if not self.lock.acquire(timeout=lock_timeout):
            return False
        try:
            if self._warm_up:
                self._warm_up = {}
                self._write_plan()
            return True
        finally:
            self.lock.release()

    def warm_up_from(self) -> dict[tuple[str, int], int]:
        """The warm-up sample's start offsets, while it is in the plan and not yet run. Without
        the lock (a batch asks it while the one before commits): a sample newer than the plan
        the batch was planned from finds nothing to read in it, and waits for the next."""
        sample = self._warm_up
        return {} if self.warmed.is_set() else dict(sample)

    def _partitions_of(self, topic: str) -> list[int]:
        metadata = self._offsets.list_topics(topic, timeout=10).topics.get(topic)
        return sorted(metadata.partitions) if metadata is not None else []

    def read_from(self) -> dict[tuple[str, int], int]:
        """Per (input topic, partition) of the active tasks, the first offset still to process:
        rows below it are already in the task's state and must not be applied again. While a
        batch commits behind (`commit_behind`), where it will have left them: the batch
        reading now must not wait for it."""
        promised = self._promised
        if promised is not None:
            return dict(promised)
        with self.lock:
            return self._positions()

    def _positions(self) -> dict[tuple[str, int], int]:
        return {
            (topic, task): self._input_position(active.state, topic)
            for task, active in self._active.items()
            for topic in self.config.input_topics
        }

    def _positions_after(self, batch: BatchInput) -> dict[tuple[str, int], int]:
        """The active tasks' input positions once `batch` has committed (holding the lock,
        nothing committing behind): the tasks active now, not those the batch read, so that
        a task taken meanwhile is in the next batch's positions."""
        positions = self._positions()
        for task in set(batch.ends) & set(self._active):
            if self._reads_on(task, batch):
                for topic, end in batch.ends[task].items():
                    positions[(topic, task)] = end
        return positions

    def state_snapshot(self, task: TaskId) -> dict[str, Any]:
        """The pipeline store's content of an active task (for tools and tests), once every
        batch handed to the instance has committed."""
        self._join_committer()
        with self.lock:
            return self._active[task].state.snapshot(self.pipeline.store)

    # Micro-batches -----------------------------------------------------------------------

    def commit_batch(self, batch: BatchInput) -> None:
        """Apply one micro-batch: per active task, one transaction, then the local store."""
        with self.lock:
            self._poll_assignment()  # a successor under this name may have been given tasks
            if self._follower.replaced_by is not None and not self.replaced:
                self._step_down(self._follower.replaced_by)
            if self.stopping:
                return
            committed: dict[tuple[str, int], int] = {}
            for task in sorted(set(batch.ends) & set(self._active)):
                if not self._reads_on(task, batch):
                    log.info("task %d: the batch read it from elsewhere: left out", task)
                    continue
                self._commit_task(task, batch)
                if task not in self._active:
                    continue  # fenced: another instance owns it
                for topic, offset in batch.ends[task].items():
                    committed[(topic, task)] = offset
            if committed:
                self._report(with_input_lag=False)
                self._best_effort("commit the input positions", self._inputs.commit, committed)

    def _reads_on(self, task: TaskId, batch: BatchInput) -> bool:
        """Whether the batch read the active task from where its state is now (see
        BatchInput.read_from)."""
        if batch.read_from is None:
            return True
        state = self._active[task].state
        return all(
            batch.read_from.get((topic, task)) == self._input_position(state, topic)
            for topic in batch.ends[task]
        )

    def run_due_without_input(self) -> list[TaskId]:
        """Spark runs a batch without data when a stateful processor has something to do with
        no input (a timer or TTL deadline due, the watermark to move): for a processor
        pipeline, run one for each active task that has (`due_without_input`), committed like
        any batch, its input position unchanged. Returns those tasks. Waits at most
        TICK_LOCK_SECONDS for a batch in flight (the caller is the worker's main thread, once
        per trigger interval), else leaves it to the next call."""
        prepared = self.pipeline
        if not isinstance(prepared, PreparedProcessor):
            return []
        if not self.lock.acquire(timeout=TICK_LOCK_SECONDS):
            return []
        try:
            clock = round(time.time() * 1000)
            due = [
                task
                for task, active in sorted(self._active.items())
                if due_without_input(prepared, active.state, clock)
            ]
            if due:
                with self.batch():
                    self.commit_batch(BatchInput(ends={task: {} for task in due}))
            return due
        finally:
            self.lock.release()

    def _note_pipeline_errors(self, task: TaskId, bad: list[Any]) -> None:
        raised = [row for row in bad if row["reason"] == PIPELINE_ERROR]
        if raised:
            self._pipeline_errors[task] = (
                time.monotonic(),
                f"the pipeline raised on {len(raised)} record(s) of a batch, sent to the "
                f"dead-letter topic {self.config.dead_letters()} (the last: "
                f"{raised[-1]['error']}); fix the pipeline, then replay them from there",
            )

    def _pipeline_error(self, task: TaskId) -> str | None:
        """What to report for an active task whose pipeline raised lately (for a minute)."""
        noted = self._pipeline_errors.get(task)
        if noted is None or time.monotonic() - noted[0] > PIPELINE_ERROR_REPORTED_SECONDS:
            return None
        return noted[1]

    def _commit_task(self, task: TaskId, batch: BatchInput) -> None:
        active = self._active[task]
        store = self.pipeline.store
        if isinstance(self.pipeline, PreparedProcessor):
            changed, outputs, bad = self._run_processor(self.pipeline, task, active, batch)
            state_keys = [key.encode() for key in changed]
            replaced = active.state.record_keys(store, state_keys)
        else:
            changed, outputs, bad, held = self._apply_updates(self.pipeline, task, active, batch)
            state_keys = [key.encode() for key in changed]
            replaced = [held[key] for key in changed]
        positions = {**active.state.input_positions(), **batch.ends[task]}
        number = active.batch + 1
        writer = active.writer
        records = changes(writer, number, changed, replaced)
        closing = closer(writer, number, positions, active.last_closer)
        reclaim = self._tombstones(active, set(changed))
        self._note_pipeline_errors(task, bad)
        sender = self._send_dead_letters

        def queue_dead_letters(producer: Producer) -> None:
            if bad and sender is not None:
                sender(producer, bad)

        try:
            delivered = active.producer.commit(
                {store: [*records, closing, *reclaim]}, outputs, queue_dead_letters
            )
        except TaskLost as lost:
            self._fence(task, f"{lost}; stopped processing it")
            return
        applied = StateChanges(
            positions=delivered,
            closed_batches={store: number},
            input_positions=dict(batch.ends[task]),
        )
        for state_key, record in zip(state_keys, records, strict=True):
            if record.kind is RecordKind.DATA and record.value is not None:
                applied.put(store, state_key, record.key, record.value)
            else:
                applied.delete(store, state_key, record.key)
        reclaimed = [record.key for record in reclaim]
        applied.reclaim(store, reclaimed, [state_key_of(key) for key in reclaimed])
        active.state.apply(applied)
        active.batch, active.last_closer = number, closing.key
        newest = batch.newest.get(task)
        if newest is not None:
            active.input_time = max(newest, active.input_time or newest)
        superseded = [r.supersedes for r in [*records, closing] if r.supersedes is not None]
        span = active.producer.delivered[store]
        active.unverified.append((span.last + 1, superseded))
        self.metrics.count_processed(task, batch.counts.get(task, 0))
        self._verify(task, active, span)

    def _run_processor(
        self, prepared: PreparedProcessor, task: TaskId, active: _Active, batch: BatchInput
    ) -> tuple[dict[str, Any], list[OutputRecord], list[Any]]:
        """A processor pipeline's batch of one task (processor.run_batch): its state changes,
        outputs, and dead letters (the bad records, and the records of the grouping keys whose
        handleInputRows raised). Late rows are dropped and counted."""
        rows = batch.rows.get(task)
        if rows is None:
            rows = no_rows(prepared)
        outcome = run_batch(prepared, active.state, rows, round(time.time() * 1000))
        self.metrics.count_late_rows(task, outcome.late_rows)
        bad = list(batch.dead_letters.get(task, []))
        for key, error in outcome.failed_keys:
            if batch.records_at is None:
                raise error
            read = batch.records_at(task, rows_of_key(prepared, rows, key)["offset"].tolist())
            bad += self._dead_letters_of_key(
                task, f"the processor's handleInputRows raised on grouping key {key!r}", error, read
            )
        for key, expiry, error in outcome.failed_timers:
            why = (
                f"the processor's handleExpiredTimer raised on grouping key {key!r}, timer "
                f"{expiry} ({type(error).__name__}: {error}); the timer is deleted, the "
                "handler's state changes undone: fix the processor"
            )
            log.warning("task %d: %s", task, why)
            self._pipeline_errors[task] = (time.monotonic(), why)
        return outcome.changes, outcome.outputs, bad

    def _dead_letters_of_key(
        self, task: TaskId, what: str, error: BaseException, read: list[Any]
    ) -> list[Any]:
        """A key's records of this batch, as dead letters of `error` (`what` raised on it):
        logged and counted; the key's state stays as it was."""
        log.warning(
            "task %d: %s (%s: %s); its %d records of this batch go to the dead-letter topic, its "
            "state stays as it was",
            task,
            what,
            type(error).__name__,
            error,
            len(read),
        )
        self.metrics.count_dead_letters(PIPELINE_ERROR for _ in read)
        return [pipeline_error(record, error) for record in read]

    def _apply_updates(
        self, pipeline: Pipeline, task: TaskId, active: _Active, batch: BatchInput
    ) -> tuple[dict[str, Any], list[OutputRecord], list[Any], dict[str, bytes | None]]:
        """An aggregate/apply pipeline's batch of one task: `apply` folds each update into its
        key's state; the new states, the outputs, the dead letters (the bad records, and the
        records of the keys `apply` raised on), and per key of the batch the changelog record
        key of its value before (None: none), read with it."""
        store = pipeline.store
        updates = batch.updates.get(task, [])
        current: dict[str, Any] = {}
        held: dict[str, bytes | None] = {}
        keys = list(dict.fromkeys(key for key, _ in updates))
        entries = active.state.entries(store, [key.encode() for key in keys])
        for key, stored in zip(keys, entries, strict=True):
            if stored is None:
                current[key] = held[key] = None
                continue
            held[key] = record_key_of(stored)
            raw = value_of(stored)
            current[key] = None if raw is None else _state(raw)
        outputs: list[OutputRecord] = []
        changed: dict[str, Any] = {}
        bad = list(batch.dead_letters.get(task, []))
        for key, update in updates:
            try:
                new_state, emitted = pipeline.apply(key, current[key], update)
            except Exception as error:
                if batch.records_of is None:
                    raise
                bad += self._dead_letters_of_key(
                    task,
                    f"the pipeline's apply raised on key {key!r}",
                    error,
                    batch.records_of(task, key),
                )
                continue
            current[key] = new_state
            changed[key] = new_state
            outputs.extend(emitted)
        return changed, outputs, bad, held

    def _tombstones(self, active: _Active, changing: set[str]) -> list[ChangelogRecord]:
        """Tombstones for verified garbage records of the pipeline store, as many as the batch
        changes keys plus TOMBSTONES_PER_BATCH, and for the delete records whose key has no
        older record left (a delete's successor is absence: it can go once nothing older can
        reappear).

        A batch supersedes at most one record per key it changes, so reclaiming as many keeps
        pace with the garbage the batches make, and the rest drains a backlog: the compacted
        changelog stays about as long as the live state (plus one batch of garbage not
        verified yet), however long the app runs."""
        store, state, writer = self.pipeline.store, active.state, active.writer
        garbage = state.garbage(store, TOMBSTONES_PER_BATCH + len(changing))
        chosen = set(garbage)
        reclaim = [tombstone(writer, key) for key in garbage]
        # Superseded by batches not verified yet: not garbage yet, but not gone either.
        unverified = {key for _end, keys in active.unverified for key in keys}
        candidates: dict[bytes, None] = {}
        for key in garbage:
            state_key = state_key_of(key)
            if state_key is not None and state_key.decode() not in changing:
                candidates[state_key] = None
        keys = list(candidates)
        for state_key, current in zip(keys, state.deletes(store, keys), strict=True):
            if current is None:
                continue  # not a delete
            prefix = b"d:" + state_key + b"@"
            if any(pending.startswith(prefix) for pending in unverified):
                continue  # the delete's own batch, or one before it, is not verified
            older = state.garbage(store, len(chosen) + 1, prefix)
            if set(older) <= chosen:
                reclaim.append(tombstone(writer, current))
        return reclaim

    def _verify(self, task: TaskId, active: _Active, span: ChangelogSpan) -> None:
        """Verify the writer's batches: no record of a higher writer precedes them. The batch
        just committed took `span`: if it follows the last verified record with only one
        offset between (the previous commit marker), nobody else wrote (verified for free);
        else read the gap from the offset after the last verified record. A higher writer
        there fences this instance for the task."""
        last = span.last
        if not _follows_on(active.unverified_from, span):
            higher = self._higher_writer(task, active, last + 1)
            if higher is None:
                return
            if higher > active.writer:
                self._fence(
                    task,
                    f"task {task}: writer {active.writer} found the records of writer {higher} "
                    "before its own in the changelog: another instance owns the task; stopped "
                    "processing it",
                    higher.epoch,
                )
                return
        active.unverified_from = last + 1
        position = active.state.position(self.pipeline.store)
        changes = StateChanges(verified={self.pipeline.store: min(position, last + 1)})
        for _end, superseded in active.unverified:
            for key in superseded:
                changes.supersede(self.pipeline.store, key)
        active.unverified.clear()
        active.state.apply(changes)

    def _higher_writer(self, task: TaskId, active: _Active, end: int) -> Writer | None:
        """The highest writer of the records in [unverified_from, end) of the pipeline store's
        changelog, or None when the range could not be read in time (verification waits for
        a later batch)."""
        topic = self.config.changelog_topics()[self.pipeline.store]
        highest = self._highest_writer_in(topic, task, active.unverified_from, end)
        return None if highest is None else max(highest, active.writer)

    def _highest_writer_in(self, topic: str, task: TaskId, start: int, end: int) -> Writer | None:
        """The highest writer of the records in [start, end) of partition `task` of `topic`
        (Writer(-1, -1, -1) when there are none), or None when the range could not be read
        within GAP_READ_SECONDS or holds a record smoothscale did not write."""
        consumer = self._offsets
        consumer.assign([TopicPartition(topic, task, start)])
        highest = Writer(-1, -1, -1)
        deadline = time.monotonic() + GAP_READ_SECONDS
        try:
            while time.monotonic() < deadline:
                for message in consumer.consume(num_messages=500, timeout=0.1):
                    offset = message.offset()
                    if message.error() is not None or offset is None or offset >= end:
                        continue
                    try:
                        record = parse_record(message.key(), message.value(), message.headers())
                    except ChangelogFormatError:
                        return None
                    highest = max(highest, record.writer)
                if consumer.position([TopicPartition(topic, task)])[0].offset >= end:
                    return highest
            return None
        finally:
            consumer.unassign()

    def _fence(self, task: TaskId, error: str, seen_epoch: int | None = None) -> None:
        """Another instance owns the task (a higher writer wrote before this one's records, or
        Kafka fenced its producer): this one is a zombie for it. Stop processing it, drop its
        local store (stale), and report `fenced`, with the higher epoch seen if known."""
        active = self._stop_processing(task)
        positions = active.state.positions()
        active.state.destroy()
        log.error("%s", error)
        self._fenced[task] = TaskReport(
            task,
            ReportedRole.FENCED,
            active.epoch,
            self.assignment.generation,
            positions,
            seen_epoch=seen_epoch,
            error=error,
        )
        self.metrics.forget_task(task)
        self._report(with_input_lag=False)  # the operator moves the task on this word

    # Assignments ---------------------------------------------------------------------------

    def _apply(self, assignment: Assignment) -> None:
        if assignment.generation <= self._applied_generation:
            return
        if self._applied_generation < 0:
            self._finish_interrupted_releases(assignment)
        self._applied_generation = assignment.generation
        log.info("assignment generation %d: %s", assignment.generation, describe(assignment))
        wanted = assignment.tasks
        self.assignment = assignment
        for task in set(self._released) & set(wanted):
            if self._released[task].generation < assignment.generation:
                del self._released[task]
        self._refused = {}
        # Fenced, like released, until the task is given again: the operator may have taken
        # the task from this instance on its last `active` report, and waits for a word on it.
        self._fenced = {task: report for task, report in self._fenced.items() if task not in wanted}
        for task in sorted(self._active):
            held = wanted.get(task)
            if held is None or held.role is not TaskRole.ACTIVE:
                state = self._release(task)
            elif held.epoch != self._active[task].epoch:
                # A new epoch for a task active here is a new activation, restored to the
                # changelog's end with its marker proven the highest, as for any owner: the
                # operator may give a task back to an instance it failed over from, whose copy
                # is stale.
                state = self._stop_processing(task).state
            else:
                continue
            if held is not None:
                self._restore.follow(self._checked(state))
            else:
                state.close()
        for task in sorted(set(self._activating) - set(wanted)):
            self._activating.pop(task).close()
        for task in set(self._clients) - set(wanted):
            del self._clients[task]
        for task in sorted(self._restore.tasks() - set(wanted)):
            dropped = self._restore.unfollow(task)
            if dropped is not None:
                dropped.close()
            self.metrics.forget_task(task)
        followed = self._restore.tasks()
        for task, held in sorted(wanted.items()):
            if task in self._active:
                continue
            activation = self._activating.get(task)
            starts = held.role is TaskRole.ACTIVE and (
                activation is None or activation.epoch != held.epoch
            )
            client = self._clients.pop(task, None) if starts else None
            producer = None
            if starts and held.restore_until is None:
                # A failover: the previous owner may have died, or live on, in the middle of a
                # transaction, which read_committed restores cannot read past until it ends (on
                # Kafka, at its timeout). Initialising the task's producer first, before
                # anything of the task is read, aborts it, and fences the previous owner if it
                # lives on.
                producer, client = TaskProducer(self.config, task, held.epoch, client=client), None
            if task not in followed:
                self._restore.follow(self._open_state(task))
            if starts:
                if activation is not None:
                    activation.close()
                targets = held.restore_until
                if targets is None:
                    targets = end_offsets(
                        self._offsets, self.config.changelog_topics(), task, timeout=10
                    )
                self._activating[task] = _Activation(held.epoch, dict(targets), producer, client)
            elif held.role is not TaskRole.ACTIVE:
                if activation is not None:
                    self._activating.pop(task).close()
                if task not in self._clients:
                    self._clients[task] = task_client(self.config, task)
        self._report()

    def _activate_caught_up(self) -> None:
        """Move each activating task on once the restore loop has read far enough: restored to
        its target -> write its epoch marker (or refuse a stale epoch); restored through its
        marker -> active. Neither step waits for a restore: a task that needs a long one stays
        activating (reported as a warm-up with its progress) while the other tasks keep
        processing. A target or marker just ahead of what the loop has read (the old owner's
        last batch, the marker's own transaction) is one or two fetches away, so that much is
        waited for here: the task turns active in this tick, not after the next micro-batch."""
        active_before = len(self._active)
        near = self._near_targets()
        if near:
            self._restore.wait_until_read(near, MARKER_READ_SECONDS)
        marked = self._step_activations()
        if marked:
            self._restore.wait_until_read(
                {task: self._activating[task].waits_for() for task in marked},
                MARKER_READ_SECONDS,
            )
            self._step_activations()
        if len(self._active) > active_before:
            # One plan for every task this tick activated: the source, which plans a batch as
            # soon as it sees a new partition, must not start one with only the first of them.
            self._write_plan()
            # The operator ends the hand-over (and drains the old owner's pod) on this report:
            # sent now, not at the next report interval.
            self._report(with_input_lag=False)

    def _near_targets(self) -> dict[TaskId, dict[str, int]]:
        """The restore targets of unmarked activations that lie at most TARGET_NEAR_OFFSETS
        changelog offsets ahead of what the restore loop has read."""
        if not self._activating:
            return {}  # every tick asks: no need to contend for the restore loop's lock
        positions = self._restore.read_positions()
        near: dict[TaskId, dict[str, int]] = {}
        for task, activation in self._activating.items():
            reached = positions.get(task)
            if activation.marked is not None or reached is None:
                continue
            wanted = activation.waits_for()
            unread = sum(max(0, o - reached.get(s, 0)) for s, o in wanted.items())
            if 0 < unread <= TARGET_NEAR_OFFSETS:
                near[task] = wanted
        return near

    def _step_activations(self) -> list[TaskId]:
        """One step of every activating task the restore loop has read far enough for; returns
        the tasks it wrote a marker for right after what the loop had read (nothing else in
        between to restore)."""
        positions = self._restore.read_positions()
        failures = self._restore.failures()
        marked: list[TaskId] = []
        for task, activation in sorted(self._activating.items()):
            reached = positions.get(task)
            if task in failures or reached is None:
                continue
            if not read_through(reached, activation.waits_for()):
                continue
            state = self._restore.unfollow(task)
            if state is None:
                continue
            if activation.marked is None:
                seen = max(state.epoch(store) for store in state.stores)
                if seen > activation.epoch:
                    del self._activating[task]
                    self._refuse(task, activation.epoch, seen, state.positions())
                else:
                    try:
                        activation.marked = self._mark(task, activation, state)
                    except TaskLost as lost:
                        del self._activating[task]
                        self._lose_activation(task, activation, state, f"{lost}; not taking it")
                        continue
                    unread = sum(o - reached.get(s, 0) for s, o in activation.waits_for().items())
                    if unread <= MARKER_NEAR_OFFSETS:
                        marked.append(task)
                # Restores on through the marker in the background (the loop resumes from the
                # state's own position).
                self._restore.follow(state)
                continue
            del self._activating[task]
            above = self._writers_above(activation.marked.writer, state)
            if above:
                highest = max(above.values())
                stores = ", ".join(f"{store} ({writer})" for store, writer in sorted(above.items()))
                error = (
                    f"task {task}: activation as writer {activation.marked.writer} found a "
                    f"higher writer before its own marker in the changelog of {stores}: another "
                    "activation owns the task; not taking it (the operator must assign it above "
                    f"epoch {highest.epoch})"
                )
                self._lose_activation(task, activation, state, error, highest.epoch)
                continue
            try:
                self._activate(task, activation.marked, state)
            except TaskLost as lost:
                self._lose_activation(task, activation, state, f"{lost}; not taking it")
        return marked

    @staticmethod
    def _writers_above(writer: Writer, state: TaskState) -> dict[str, Writer]:
        """Per store whose changelog, restored through `writer`'s marker, holds a higher
        writer: that writer. Empty when `writer` is the highest of every store."""
        above: dict[str, Writer] = {}
        for store in state.stores:
            highest = state.writer(store)
            if highest is not None and highest > writer:
                above[store] = highest
        return above

    def _lose_activation(
        self,
        task: TaskId,
        activation: _Activation,
        state: TaskState,
        error: str,
        seen_epoch: int | None = None,
    ) -> None:
        """Another activation owns the task (its marker is above this one's, or Kafka fenced
        this one's producer): this one must not go active, whoever holds the live producer.
        Report the task fenced, with the epoch seen if known; the restored state stays
        followed, it is exact."""
        activation.close()
        log.error("%s", error)
        self._restore.follow(state)
        self._fenced[task] = TaskReport(
            task,
            ReportedRole.FENCED,
            activation.epoch,
            self.assignment.generation,
            state.positions(),
            seen_epoch=seen_epoch,
            error=error,
        )
        self._report()

    def _refuse(self, task: TaskId, epoch: int, seen: int, positions: dict[str, int]) -> None:
        error = (
            f"task {task}: assigned active at epoch {epoch}, but its changelog already holds "
            f"epoch {seen}: refused; the operator must assign it above epoch {seen}"
        )
        log.error("%s", error)
        self._refused[task] = TaskReport(
            task,
            ReportedRole.REFUSED,
            epoch,
            self.assignment.generation,
            positions,
            seen_epoch=seen,
            error=error,
        )
        self._report()

    def _mark(self, task: TaskId, activation: _Activation, state: TaskState) -> _Marked:
        """Write the new writer's epoch marker to every store's changelog partition. Whatever
        an older owner committed before it becomes part of the state (every later restore
        applies it too); whatever it commits after it is ignored."""
        epoch = activation.epoch
        writer = Writer.next_after(epoch, state.highest_writer())
        producer = activation.producer or TaskProducer(
            self.config, task, epoch, client=activation.client
        )
        activation.producer = activation.client = None  # the marked activation owns it now
        markers = {store: [marker(writer, self.config.instance_id)] for store in state.stores}
        try:
            for _ in range(MARKER_ATTEMPTS - 1):
                try:
                    return _Marked(writer, producer, producer.commit(markers))
                except TaskLost:
                    raise
                except TransactionError as error:
                    # Aborted (commit aborts a failed transaction): readers never see it.
                    log.warning("task %d: epoch marker not written (%s): again", task, error)
            return _Marked(writer, producer, producer.commit(markers))
        except TaskLost:
            producer.close()
            raise

    def _activate(self, task: TaskId, marked: _Marked, state: TaskState) -> None:
        """Make a task restored through its own marker active."""
        writer, producer, through = marked.writer, marked.producer, marked.through
        store = self.pipeline.store
        # The marker is verified (restored through, and no higher writer before it); any
        # record after it, its commit marker's slot included, is not yet.
        unverified_from = through[store]
        known = state.input_positions()
        missing = [topic for topic in self.config.input_topics if topic not in known]
        last_closer = None
        if missing:
            # Only now, restored through the marker, is the state final: an older owner may
            # have started the task (and moved its position) after the restore target. An
            # input without a position starts at its earliest offset, and the owner says so in
            # its changelog: a start position only ever comes from the owner's own write.
            starts = {**known, **self._earliest_offsets(task, missing)}
            start = closer(writer, 0, starts, None)
            delivered = producer.commit({store: [start]})
            changes = StateChanges(
                positions=delivered, closed_batches={store: 0}, input_positions=starts
            )
            state.apply(changes)
            last_closer = start.key
            span = producer.delivered[store]
            if _follows_on(unverified_from, span):
                unverified_from = span.last + 1
        self._active[task] = _Active(
            writer, state, producer, last_closer=last_closer, unverified_from=unverified_from
        )
        self._progressed_at = time.monotonic()
        for topic in self.config.input_topics:
            self._plan_starts[(topic, task)] = state.input_positions()[topic]
            self._activations[(topic, task)] = self._activations.get((topic, task), 0) + 1
        log.info("task %d active as writer %s from %s", task, writer, state.input_positions())

    def _stop_processing(self, task: TaskId) -> _Active:
        """Take an active task out of the plan and close its producer."""
        active = self._active.pop(task)
        active.producer.close()
        for topic in self.config.input_topics:
            self._plan_starts.pop((topic, task), None)
        self._write_plan()
        return active

    def _release(self, task: TaskId) -> TaskState:
        active = self._stop_processing(task)
        report = TaskReport(
            task,
            ReportedRole.RELEASED,
            active.epoch,
            self.assignment.generation,
            active.state.positions(),
        )
        self._released[task] = report
        self._best_effort("report the release", self._commit_reports, [report])
        self.metrics.forget_task(task)
        log.info("task %d released at %s", task, report.positions)
        return active.state

    # Helpers -------------------------------------------------------------------------------

    def _open_state(self, task: TaskId) -> TaskState:
        """The task's local store (see `_checked`)."""
        return self._checked(TaskState(self.config.state_dir, task, self.config.stores))

    def _checked(self, state: TaskState) -> TaskState:
        """`state`, or a new empty store for its task when it is stale: last written longer
        ago than stores are reused (`_state_reuse_limit`: the changelog may have been compacted
        since, its tombstones gone: a key deleted meanwhile would come back), or it applied its
        own writes past its verified offset and a higher writer wrote there (this instance was a
        zombie)."""
        task = state.task
        written = state.last_written()
        if written is not None and time.time() - written > self._state_reuse_limit():
            log.warning(
                "task %d: the local store was last written %.0f s ago, longer than stores are "
                "reused (%.0f s): the changelog may have been compacted since, so it is "
                "restored from scratch",
                task,
                time.time() - written,
                self._state_reuse_limit(),
            )
            return self._wiped(state)
        for store in state.stores:
            verified, position = state.verified(store), state.position(store)
            if verified >= position:
                continue
            own = state.writer(store)
            topic = self.config.changelog_topics()[store]
            highest = self._highest_writer_in(topic, task, verified, position)
            if highest is not None and (own is None or highest <= own):
                state.apply(StateChanges(verified={store: position}))
                continue
            log.warning(
                "task %d: the local store of %s is stale (writer %s above its own %s in "
                "[%d, %d), or unreadable): restoring it from scratch",
                task,
                store,
                highest,
                own,
                verified,
                position,
            )
            return self._wiped(state)
        return state

    def _wiped(self, state: TaskState) -> TaskState:
        self.metrics.count_stale_store()
        state.destroy()
        return TaskState(self.config.state_dir, state.task, self.config.stores)

    def _input_position(self, state: TaskState, topic: str) -> int:
        """The next input offset of an active task (its activation wrote one for every input)."""
        return state.input_positions()[topic]

    def _earliest_offsets(self, task: TaskId, topics: list[str]) -> dict[str, int]:
        """Per topic, the earliest offset of the task's partition."""
        offsets: dict[str, int] = {}
        for topic in topics:
            low, _high = watermarks(self._offsets, topic, task, timeout=10)
            offsets[topic] = max(0, low)
        return offsets

    def _write_plan(self) -> None:
        self._plan_version += 1
        starts = {**self._warm_up, **self._plan_starts}
        activations = {
            # A partition sampled for the warm-up and owned later must never continue from
            # where the sample stopped: the sample's activation, 0, is one no owner uses (an
            # owner's first activation is 1).
            partition: self._activations.get(partition, 0) if partition in self._plan_starts else 0
            for partition in starts
        }
        write_plan(self.plan_path, starts, self._plan_version, activations)

    def _count_restored(self, task: TaskId, records: int) -> None:
        self.metrics.count_restored(task, records)
        with self._restored_lock:
            self._restored_since[task] = self._restored_since.get(task, 0) + records

    def _report(self, with_input_lag: bool = True) -> None:
        now = time.monotonic()
        elapsed = max(1e-3, now - self._last_report)
        self._last_report = now
        generation = self.assignment.generation
        reports: list[TaskReport] = [
            *self._released.values(),
            *self._refused.values(),
            *self._fenced.values(),
        ]
        inputs = self.config.input_topics
        stalled = self.stalled_for()
        for task, active in self._active.items():
            reports.append(
                TaskReport(
                    task,
                    ReportedRole.ACTIVE,
                    active.epoch,
                    generation,
                    active.state.positions(),
                    {topic: self._input_position(active.state, topic) for topic in inputs},
                    input_time=active.input_time,
                    stalled_for=stalled,
                    error=self._pipeline_error(task),
                )
            )
        wanted = self.assignment.tasks
        lags = self._restore.lags()
        with self._restored_lock:
            restored, self._restored_since = self._restored_since, {}
        failures = self._restore.failures()
        for task, (positions, ends) in self._restore.positions_and_ends().items():
            if task in self._released or task in self._refused or task in self._fenced:
                continue
            if task not in wanted:
                continue
            held = wanted[task]
            role = TaskRole.WARMUP if held.role is TaskRole.ACTIVE else held.role
            reported = ReportedRole(role.value)
            error = failures.get(task)
            reports.append(
                TaskReport(
                    task,
                    reported,
                    held.epoch,
                    generation,
                    positions,
                    ends=ends or None,
                    error=error,
                )
            )
            self.metrics.set_lag(task, role, lags.get(task, 0))
            self.metrics.set_restore_rate(task, restored.get(task, 0) / elapsed)
        self._best_effort("commit the progress reports", self._commit_reports, reports, True)
        if with_input_lag:
            self._best_effort("measure the input lag", self._set_input_lags, self._active)

    def _commit_reports(self, reports: Iterable[TaskReport], whole: bool = False) -> None:
        """Commit reports, and keep them as the latest said of each task (`whole`: of every
        task this instance holds, forgetting any other)."""
        reports = list(reports)
        with self._reports_lock:
            if whole:
                self._latest_reports = {}
            self._latest_reports.update({report.task: report for report in reports})
            self._reports.commit(reports)
            self._reported_at = time.monotonic()

    def _beat(self) -> None:
        """Commit the latest reports again (a new beat), without the instance lock: while a
        long micro-batch holds it (a new pod's first batches on a cold JVM take tens of
        seconds on a loaded node), the operator still hears that this process lives, and
        never takes a busy instance for a hung one. What the reports say is what this instance
        said last, never older."""
        with self._reports_lock:
            if self.replaced or time.monotonic() - self._reported_at < self.config.report_interval:
                return
            latest = list(self._latest_reports.values())
        stalled = self.stalled_for()
        latest = [
            replace(report, stalled_for=stalled) if report.role is ReportedRole.ACTIVE else report
            for report in latest
        ]
        self._best_effort("beat", self._commit_reports, latest)

    @staticmethod
    def _best_effort(what: str, action: Callable[..., None], *arguments: Any) -> None:
        """Reports and lag are repeated every report_interval: a failure to send one (broker
        briefly away) is logged, and the next report carries the same facts again (a release
        is reported again until the next assignment)."""
        try:
            action(*arguments)
        except KafkaException as error:
            log.warning("could not %s: %s", what, error)

    def _set_input_lags(self, active: Mapping[TaskId, _Active]) -> None:
        waiting = False
        for task, held in active.items():
            lag = 0
            for topic in self.config.input_topics:
                _low, high = watermarks(self._offsets, topic, task, timeout=10)
                lag += max(0, high - self._input_position(held.state, topic))
            self.metrics.set_lag(task, TaskRole.ACTIVE, lag)
            waiting = waiting or lag > 0
        self._input_waiting = waiting


def _follows_on(unverified_from: int, span: ChangelogSpan) -> bool:
    """Whether a transaction's records, `span` of a changelog partition, follow the writer's
    last verified record with nothing of anyone else's in between: the one offset before them
    is then the writer's previous commit marker (a committed transaction takes exactly one
    offset per partition for its commit marker), and they are contiguous."""
    return span.first == unverified_from + 1 and span.last - span.first + 1 == span.records
