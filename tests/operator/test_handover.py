"""The operator's hand-over sequencing, specified against instances that follow the protocol.

`Cluster` below plays the pods' side of docs/architecture.md as the runtime does it
(smoothscale.runtime.instance), never more kindly: each pod is a process with a uid; it follows
the assignments topic as `AssignmentFollower` does (only records meant for its own uid; one for
another uid of its name newer than any it was given means it was replaced: it steps down,
holding and reporting nothing more); it applies its newest assignment only every `apply_every`
polls; an activation takes several polls (restore to `restoreUntil` or to the changelog end
seen when assigned, write an epoch marker, restore through it) and reports `warmup` meanwhile,
and ends `refused` (the changelog holds a higher epoch) or `fenced` (a higher writer before its
own marker; Kafka fenced its producer, when the broker fences) instead of active; an epoch bump
of a task active on an instance is a new activation; an active commits a batch every poll and
is fenced by the first higher writer its batch finds before it; a revoked active releases after
`release_delay` polls (a micro-batch in flight). Warm-ups and standbys restore a fixed number of
changelog records per poll. Reports are committed per (pod name, task), each commit replacing
only the tasks it reports, so a pod's old reports and those of another process of its name
stay until overwritten; a pod reports every `report_every` polls, and at once where the runtime
does (an assignment applied, a release, a refusal, an activation won or lost, a batch). A
container can restart in place (same pod, same disk, a new process): its first process reports
released, against the first assignment it applies, the tasks its predecessor held or released
and that assignment does not give it at all; a task fenced is reported at once and until it is
given again. A pod can be deleted with its process, or deleted by force with its process living
on beside the pod the operator re-creates under its name.

The operator is driven as `AppController.poll` drives it (smoothscale.operator.reconcile): its
memory kept between polls, else rebuilt (`rebuild`) from the ledger and assignments in Kafka
and the current pods' reports; a live pod whose uid is not the one its name's last assignment
was written for is forgotten (`_memory`); only the current pods' reports count
(`current_pods_reports`). It persists each poll as it does for real: the ledger record, then
the assignments, then the status; it can be killed between any two of these writes.

A task's active owner, as the real system counts it: the writer whose activation completed
with the highest epoch marker in the task's changelog. Other processes may still believe they
hold it (a zombie, an owner yet to commit its next batch and find the higher marker): what
they write after that marker is ignored by every restore.
"""

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count

from hypothesis import example, given, settings
from hypothesis import strategies as st

from smoothscale.kafka.assignments import Assignment, TaskAssignment
from smoothscale.kafka.progress import ReportedRole, TaskProgress, TaskReport
from smoothscale.operator.handover import (
    HandOver,
    InstanceStatus,
    Ledger,
    Observation,
    Ownership,
    Step,
    current_pods_reports,
    forget,
    holds_nothing,
    release_all,
    step,
)
from smoothscale.operator.ledger import rebuild
from smoothscale.planner.model import MoveKind, PlannerConfig, TaskMoves
from smoothscale.runtime.writer import Writer
from smoothscale.tasks import TaskId, TaskRole

CONFIG = PlannerConfig(acceptable_recovery_lag=100, max_warmup_replicas=2)
STATE_SIZE = 1_000
"""Changelog records per task: a new replica starts this far behind."""
BATCH = 10
"""Changelog records an active commits per poll."""
STORE = "counts"
EXAMPLES = int(os.environ.get("HANDOVER_EXAMPLES", "100"))
"""Examples of the scaling property test; the faults one runs three times as many (set
HANDOVER_EXAMPLES=2000 for a longer search)."""


@dataclass
class Changelog:
    """One task's changelog partition: its end, the epoch markers in it, and which activation
    last initialised the task's transactional producer (fencing the others, on real Kafka)."""

    end: int = STATE_SIZE
    markers: list[tuple[int, Writer]] = field(default_factory=list)
    producer: tuple[str, Writer] | None = None

    def highest(self, before: int | None = None) -> Writer | None:
        """The highest writer of the records below offset `before` (all when None)."""
        return max(
            (w for offset, w in self.markers if before is None or offset < before), default=None
        )

    def mark(self, writer: Writer) -> int:
        """Append `writer`'s epoch marker (and its commit marker); the offset after them."""
        self.markers.append((self.end, writer))
        self.end += 2
        return self.end


@dataclass
class Activation:
    """A task assigned active, not processing yet (`_Activation` in the runtime)."""

    epoch: int
    target: int
    """The changelog offset to restore to before the marker: `restoreUntil`, else the end."""
    marker: Writer | None = None
    through: int = 0
    """Once marked: the offset to restore through before the task turns active."""


@dataclass
class Active:
    writer: Writer
    release_in: int | None = None
    """Polls until a revoked active is released (the batch in flight); None: not revoked."""


@dataclass
class Process:
    """One pod's process, playing `smoothscale.runtime.instance.Instance`."""

    name: str
    uid: str
    positions: dict[TaskId, int] = field(default_factory=dict)
    """The local store: per task, the next changelog offset applied (its disk)."""
    followed: set[TaskId] = field(default_factory=set)
    """Tasks the restore loop follows (warm-ups, standbys, activations)."""
    activating: dict[TaskId, Activation] = field(default_factory=dict)
    active: dict[TaskId, Active] = field(default_factory=dict)
    released: dict[TaskId, TaskReport] = field(default_factory=dict)
    refused: dict[TaskId, TaskReport] = field(default_factory=dict)
    fenced: dict[TaskId, TaskReport] = field(default_factory=dict)
    assignment: Assignment = field(default_factory=lambda: Assignment(generation=0))
    """The assignment applied last."""
    newest: Assignment | None = None
    """The newest assignment for this pod read and not yet applied."""
    read: int = 0
    """How far it has read the assignments topic."""
    own_generation: int = -1
    """The highest generation of a record meant for this pod."""
    replaced: bool = False
    """It saw its name given to another pod: it holds, commits and reports nothing more."""
    lives: int | None = None
    """For a process whose pod is gone: polls until it dies (None: until it steps down)."""
    phase: int = 0
    """When in the report interval its periodic report goes out."""
    down: int = 0
    """Polls until a restarted container's process starts."""
    starting: bool = False
    """A restarted container's process that has not started yet (`Instance.start`)."""
    interrupted: bool = False
    """Whether it still has to report the releases its predecessor did not."""


@dataclass
class Cluster:
    tasks: int
    catch_up_per_poll: int = 400
    release_delay: int = 0
    apply_every: int = 1
    """A pod applies its newest assignment only every this many polls, so it may never see
    the generations written in between (as a busy instance between micro-batches)."""
    kafka_fences: bool = False
    """Whether the broker fences a task's older producer when a newer one initialises (real
    Kafka does; the test brokers do not)."""
    quick_activations: bool = False
    """Whether an activation may take two steps in one poll (the runtime waits for a target or
    marker just ahead of what it has read within the tick)."""
    report_every: int = 1
    """A pod's periodic report goes out every this many polls (report_interval against the
    operator's poll interval); some events are reported at once, as the runtime does."""
    config: PlannerConfig = CONFIG
    pods: dict[str, str] = field(default_factory=dict)
    """The live pods, name -> uid: what the operator observes."""
    processes: list[Process] = field(default_factory=list)
    """Every running process: the live pods' and those that outlived their pod."""
    changelogs: dict[TaskId, Changelog] = field(init=False)
    topic: list[tuple[str, Assignment | None]] = field(default_factory=list)
    """The assignments topic (instance records and tombstones), in order."""
    reports: dict[tuple[str, TaskId], tuple[TaskReport, int | None]] = field(default_factory=dict)
    """The committed reports per (pod name, task), with the changelog end each carries."""
    ledger: Ledger | None = field(default_factory=Ledger)
    """The operator's memory; None once restarted, until rebuilt."""
    rebuild_from: Ledger | None = None
    """The status a restarted operator finds (None: lost)."""
    polls: int = 0
    draining: set[str] = field(default_factory=set)
    history: list[Step] = field(default_factory=list)
    kafka_ledger: Ledger | None = None
    kafka_assignments: dict[str, Assignment] = field(default_factory=dict)
    statuses: list[Ledger] = field(default_factory=list)
    """Every status written, the newest last."""
    highest_generation: int = 0
    """The highest generation written to Kafka so far."""
    highest_epochs: dict[TaskId, int] = field(default_factory=dict)
    """The highest epoch of each task written to Kafka so far."""
    activations: dict[tuple[TaskId, int], str] = field(default_factory=dict)
    """Which pod (uid) began activating each task at each epoch."""
    uids: Iterator[int] = field(default_factory=count)
    nonces: Iterator[int] = field(default_factory=count)

    def __post_init__(self) -> None:
        self.changelogs = {task: Changelog() for task in range(self.tasks)}

    # The pods ------------------------------------------------------------------------------

    def start(self, *names: str) -> None:
        for name in names:
            number = next(self.uids)
            uid = f"{name}-{number}"
            self.pods[name] = uid
            self.processes.append(Process(name, uid, phase=number))

    def kill(self, name: str, lives: int | None = 0) -> None:
        """The pod `name` is gone; its process dies with it (`lives` 0) or lives on that many
        polls (None: until it sees its name given to another pod), deleted by force."""
        uid = self.pods.pop(name)
        self.draining.discard(name)
        for process in self.processes:
            if process.uid == uid:
                process.lives = lives
        self.processes = [p for p in self.processes if p.lives != 0]

    def recreate(self, name: str, lives: int | None = 0) -> None:
        """The pod `name` is replaced by a new, empty one under its name (the operator re-creates
        a kept pod that is gone); the old process dies or lives on (see `kill`). The operator
        is not told: it sees the new uid."""
        draining = name in self.draining
        self.kill(name, lives)
        self.start(name)
        if draining:
            self.draining.add(name)

    def restart_container(self, name: str, down: int = 0) -> None:
        """The container of pod `name` restarts in place (same pod, same uid, same disk): its
        process is gone at once; the new one starts `down` polls later, knowing only its disk
        and the reports it committed before."""
        old = self.process(name)
        self.processes.remove(old)
        positions = dict(old.positions)
        self.processes.append(
            Process(name, old.uid, positions, phase=old.phase, down=down, starting=True)
        )

    def zombie_marker(self, task: TaskId, epoch: int) -> None:
        """An owner the operator no longer remembers writes an epoch marker."""
        self.changelogs[task].mark(Writer(epoch, 0, next(self.nonces)))

    def current(self, process: Process) -> bool:
        """Whether `process` is the live pod its name stands for."""
        return self.pods.get(process.name) == process.uid

    # The operator --------------------------------------------------------------------------

    def observe(self, uids: dict[str, str | None]) -> Observation:
        reports = {}
        for (name, task), (report, ends) in self.reports.items():
            if name in self.pods:
                end = self.changelogs[task].end if ends is None else ends
                lag = max(0, end - report.positions[STORE])
                reports[(name, task)] = TaskProgress(name, report, lag)
        starting = {p.uid for p in self.processes if p.down or p.starting}
        statuses = {
            name: InstanceStatus(uid=uid, ready=uid not in starting, draining=name in self.draining)
            for name, uid in self.pods.items()
        }
        return Observation(instances=statuses, progress=current_pods_reports(reports, uids))

    def _memory(self) -> tuple[Ledger, bool]:
        """`AppController._memory`: the ledger (rebuilt after a restart), and whether every
        assignment is to be written again; a live pod that is not the one its name's last
        assignment was written for is a new instance: the old one is forgotten."""
        ledger, rewrite = self.ledger, self.ledger is None
        if ledger is None:
            uids = self._uids(self.kafka_assignments)
            reports = self.observe(uids).progress
            ledger = rebuild(self.rebuild_from, self.kafka_ledger, self.kafka_assignments, reports)
        for name, uid in sorted(self.pods.items()):
            held = ledger.assignments.get(name)
            if held is not None and held.uid and held.uid != uid:
                ledger, _events = forget(ledger, name)
                rewrite = True
        return ledger, rewrite

    def _uids(self, assignments: dict[str, Assignment]) -> dict[str, str | None]:
        """Per name, the pod it stands for (reconcile's `_pod_uids`)."""
        return {**{n: a.uid for n, a in assignments.items()}, **self.pods}

    def poll(self, killed_after_writes: int | None = None) -> Step:
        """One poll of the operator, then one of every process; `killed_after_writes`: the
        operator dies after that many writes."""
        ledger, rewrite_all = self._memory()
        result = step(
            ledger, self.observe(self._uids(dict(ledger.assignments))), self.tasks, self.config
        )
        self._check_nothing_goes_back(result)
        self.ledger = result.ledger
        self.history.append(result)
        writes: list[tuple[str, Assignment | None]] = [("ledger record", None)]
        # After a restart, or once a pod was forgotten, the operator writes every assignment
        # again (smoothscale.operator.reconcile): the one it died before writing reaches its pod.
        assignments = result.ledger.assignments if rewrite_all else result.writes
        writes += sorted(assignments.items())
        writes += [(name, None) for name in result.forget]
        writes += [("status", None)]
        for what, assignment in writes[:killed_after_writes]:
            if what == "ledger record":
                self.kafka_ledger = result.ledger
                for task, owner in result.ledger.tasks.items():
                    self.highest_epochs[task] = owner.epoch
            elif what == "status":
                self.statuses.append(result.ledger)
            else:
                self.topic.append((what, assignment))
                if assignment is None:
                    self.kafka_assignments.pop(what, None)
                else:
                    self.kafka_assignments[what] = assignment
                    self.highest_generation = max(self.highest_generation, assignment.generation)
        if killed_after_writes is None:
            for name in result.drained:
                self._delete_drained(name, result.ledger)
        self.polls += 1
        self._run_processes()
        return result

    def restart_operator(self, status: str) -> None:
        """A new operator process: at its next poll, its ledger is rebuilt from the `status`
        ("kept", "lost" or "older" than Kafka) and what Kafka holds."""
        self.rebuild_from = {
            "kept": self.statuses[-1] if self.statuses else None,
            "lost": None,
            "older": self.statuses[-3] if len(self.statuses) >= 3 else None,
        }[status]
        self.ledger = None

    def _delete_drained(self, name: str, ledger: Ledger) -> None:
        owned = [
            t
            for t, o in ledger.tasks.items()
            if name == o.active or (o.handover is not None and o.handover.source == name)
        ]
        assert not owned, f"{name} is stopped as drained while it owns tasks {owned}"
        for task in range(self.tasks):
            owning = [p.uid for p in self.owning(task)]
            assert self.pods[name] not in owning, f"{name} is deleted as the owner of {task}"
        self.kill(name)

    def _check_nothing_goes_back(self, result: Step) -> None:
        """Nothing the operator is about to write is older than what Kafka already has."""
        for assignment in result.writes.values():
            assert assignment.generation > self.highest_generation, "a generation went back"
            for task, held in assignment.tasks.items():
                assert held.epoch >= self.highest_epochs.get(task, 0), f"task {task}'s epoch"
        for task, owner in result.ledger.tasks.items():
            assert owner.epoch >= self.highest_epochs.get(task, 0), f"task {task}'s epoch"

    # The processes (smoothscale.runtime.instance) ------------------------------------------

    def _run_processes(self) -> None:
        turn = self.polls % self.apply_every == 0
        ordered = sorted(self.processes, key=lambda p: p.uid)
        shift = self.polls % max(1, len(ordered))
        for process in ordered[shift:] + ordered[:shift]:
            self._tick(process, turn)
            self._check_owners()
        for process in self.processes:
            if process.lives is not None:
                process.lives -= 1
        self.processes = [p for p in self.processes if p.lives != 0 and not p.replaced]

    def _tick(self, process: Process, turn: bool) -> None:
        if process.down:
            process.down -= 1
            return
        if process.starting:
            self._start(process)
            return
        self._follow_assignments(process)
        if process.replaced:
            # `Instance._step_down`: it lets go of everything, commits and reports nothing.
            process.active, process.activating, process.followed = {}, {}, set()
            return
        if turn and process.newest is not None:
            self._apply(process, process.newest)
            process.newest = None
        self._step_activations(process)
        for task in process.followed:
            end = self.changelogs[task].end
            process.positions[task] = min(end, process.positions[task] + self.catch_up_per_poll)
        if self.quick_activations:
            self._step_activations(process)
        self._batch(process)
        if (self.polls + process.phase) % self.report_every == 0:
            self._report(process)

    def _start(self, process: Process) -> None:
        """`Instance.start`: the newest assignment, and the releases a previous run of this pod
        may have left unreported; what the operator writes meanwhile is applied next."""
        process.starting = False
        self._follow_assignments(process)
        process.interrupted = True

    def _finish_interrupted_releases(self, process: Process, assignment: Assignment) -> None:
        """`Instance._finish_interrupted_releases`: a task its pod last reported active or
        released, that `assignment` does not give it active, and whose store is on its disk,
        is reported released."""
        for (name, task), (report, _ends) in sorted(self.reports.items()):
            if name != process.name or report.uid not in (None, process.uid):
                continue
            if task in assignment.tasks:
                continue
            if report.role not in (ReportedRole.ACTIVE, ReportedRole.RELEASED):
                continue
            if task not in process.positions:
                continue
            positions = {STORE: max(process.positions[task], report.positions[STORE])}
            released = TaskReport(
                task,
                ReportedRole.RELEASED,
                report.epoch,
                assignment.generation,
                positions,
                uid=process.uid,
            )
            process.released[task] = released
            self.reports[(name, task)] = (released, None)

    def _follow_assignments(self, process: Process) -> None:
        """`AssignmentFollower.poll`: the newest record meant for this pod, or that another pod
        has taken its name."""
        for name, assignment in self.topic[process.read :]:
            if name != process.name or assignment is None:
                continue
            if assignment.uid not in (None, process.uid):
                if -1 < process.own_generation < assignment.generation:
                    process.replaced = True
                continue
            process.own_generation = max(process.own_generation, assignment.generation)
            newest = process.newest or process.assignment
            if assignment.generation > newest.generation:
                process.newest = assignment
        process.read = len(self.topic)

    def _apply(self, process: Process, assignment: Assignment) -> None:
        """`Instance._apply`."""
        if process.interrupted:
            process.interrupted = False
            self._finish_interrupted_releases(process, assignment)
        wanted = assignment.tasks
        process.assignment = assignment
        for task in set(process.released) & set(wanted):
            if process.released[task].generation < assignment.generation:
                del process.released[task]
        process.refused = {}
        process.fenced = {
            task: report for task, report in process.fenced.items() if task not in wanted
        }
        for task, active in sorted(process.active.items()):
            held = wanted.get(task)
            if held is None or held.role is not TaskRole.ACTIVE:
                if active.release_in is None:
                    active.release_in = self.release_delay
            elif held.epoch != active.writer.epoch:
                # A new activation, restored to the changelog's end like any other.
                del process.active[task]
            else:
                active.release_in = None
        for task in set(process.activating) - set(wanted):
            del process.activating[task]
        process.followed &= set(wanted)
        for task, held in sorted(wanted.items()):
            if task in process.active:
                continue
            process.followed.add(task)
            process.positions.setdefault(task, 0)
            if held.role is not TaskRole.ACTIVE:
                process.activating.pop(task, None)
                continue
            activation = process.activating.get(task)
            if activation is None or activation.epoch != held.epoch:
                until = held.restore_until
                target = self.changelogs[task].end if until is None else until[STORE]
                process.activating[task] = Activation(held.epoch, target)
                first = self.activations.setdefault((task, held.epoch), process.uid)
                assert first == process.uid, f"task {task} epoch {held.epoch} given to two pods"
        self._report(process)

    def _step_activations(self, process: Process) -> None:
        """`Instance._step_activations`: restored to the target -> the epoch marker (or refused);
        restored through the marker -> active (or fenced by a higher writer before it)."""
        for task, activation in sorted(process.activating.items()):
            position = process.positions[task]
            changelog = self.changelogs[task]
            if position < (activation.through if activation.marker else activation.target):
                continue
            seen = changelog.highest(before=position)
            if activation.marker is None:
                if seen is not None and seen.epoch > activation.epoch:
                    del process.activating[task]
                    process.followed.discard(task)
                    process.refused[task] = self._report_of(
                        process, task, ReportedRole.REFUSED, activation.epoch, seen.epoch
                    )
                    self._report(process)
                    continue
                session = 0 if seen is None else seen.session + 1
                writer = Writer(activation.epoch, session, next(self.nonces))
                self._check_no_live_owner_superseded(process, task, writer)
                activation.marker, activation.through = writer, changelog.mark(writer)
                changelog.producer = (process.uid, writer)
                continue
            del process.activating[task]
            if seen is not None and seen > activation.marker:
                process.fenced[task] = self._report_of(
                    process, task, ReportedRole.FENCED, activation.epoch, seen.epoch
                )
                self._report(process)
                continue
            process.followed.discard(task)
            process.active[task] = Active(activation.marker)
            self._report(process)

    def _batch(self, process: Process) -> None:
        """A micro-batch: each active task commits a transaction, then checks that no higher
        writer came before it (`_verify`); a revoked one is released once its batch is done.
        Reported when a task committed (`commit_batch`); a task fenced alone is reported only
        by the next periodic report (`_fence` reports nothing itself)."""
        committed = False
        for task, active in sorted(process.active.items()):
            if active.release_in == 0:
                del process.active[task]
                released = self._report_of(
                    process, task, ReportedRole.RELEASED, active.writer.epoch
                )
                process.released[task] = released
                self.reports[(process.name, task)] = (released, None)
                if task in process.assignment.tasks:
                    process.followed.add(task)
                continue
            if active.release_in is not None:
                active.release_in -= 1
            changelog = self.changelogs[task]
            if self.kafka_fences and changelog.producer != (process.uid, active.writer):
                self._fence(process, task, None)
                continue
            changelog.end += BATCH
            process.positions[task] = changelog.end
            highest = changelog.highest()
            if highest is not None and highest > active.writer:
                self._fence(process, task, highest.epoch)
            else:
                committed = True
        if committed:
            self._report(process)

    def _fence(self, process: Process, task: TaskId, seen_epoch: int | None) -> None:
        """`Instance._fence`: stop the task, drop its (stale) store, report it fenced."""
        epoch = process.active.pop(task).writer.epoch
        process.fenced[task] = self._report_of(
            process, task, ReportedRole.FENCED, epoch, seen_epoch
        )
        del process.positions[task]

    def _report_of(
        self,
        process: Process,
        task: TaskId,
        role: ReportedRole,
        epoch: int,
        seen_epoch: int | None = None,
    ) -> TaskReport:
        return TaskReport(
            task,
            role,
            epoch,
            process.assignment.generation,
            {STORE: process.positions[task]},
            seen_epoch=seen_epoch,
            uid=process.uid,
        )

    def _report(self, process: Process) -> None:
        """`Instance._report`: one commit under the pod's name, replacing only these tasks."""
        committed: dict[TaskId, tuple[TaskReport, int | None]] = {
            task: (report, None)
            for kept in (process.released, process.refused, process.fenced)
            for task, report in kept.items()
        }
        for task, active in process.active.items():
            report = self._report_of(process, task, ReportedRole.ACTIVE, active.writer.epoch)
            committed[task] = (report, process.positions[task])
        wanted = process.assignment.tasks
        for task in sorted(process.followed):
            if task in committed or task not in wanted:
                continue
            held = wanted[task]
            role = ReportedRole.WARMUP if held.role is TaskRole.ACTIVE else ReportedRole(held.role)
            report = self._report_of(process, task, role, held.epoch)
            committed[task] = (report, self.changelogs[task].end)
        for task, entry in committed.items():
            self.reports[(process.name, task)] = entry

    # What the properties look at -----------------------------------------------------------

    def owning(self, task: TaskId) -> list[Process]:
        """The processes counting as `task`'s active owner: their activation completed, and
        their marker has the highest epoch in the changelog. Never more than one."""
        highest = self.changelogs[task].highest()
        return [
            p
            for p in self.processes
            if task in p.active
            and highest is not None
            and p.active[task].writer.epoch == highest.epoch
        ]

    def owners(self, task: TaskId) -> list[str]:
        return [p.name for p in self.owning(task)]

    def _check_owners(self) -> None:
        for task in range(self.tasks):
            assert len(self.owners(task)) <= 1, f"task {task} has two owners: {self.actives()}"

    def _check_no_live_owner_superseded(
        self, process: Process, task: TaskId, writer: Writer
    ) -> None:
        """A new activation never takes a task from a live pod still holding it as its owner:
        that owner released it first, or is gone, replaced, or already below another writer."""
        highest = self.changelogs[task].highest()
        for other in self.processes:
            held = other.active.get(task)
            if other is process or held is None or not self.current(other):
                continue
            assert held.writer != highest, (
                f"{process.name} marks task {task} as {writer} over {other.name}, its live owner"
            )

    def active_holders(self, task: TaskId) -> list[str]:
        """The live pods that hold `task` active (their activation completed)."""
        return sorted(p.name for p in self.processes if self.current(p) and task in p.active)

    def actives(self) -> dict[str, list[TaskId]]:
        return {
            p.name: sorted(p.active)
            for p in sorted(self.processes, key=lambda p: p.name)
            if self.current(p)
        }

    def process(self, name: str) -> Process:
        (found,) = [p for p in self.processes if self.current(p) and p.name == name]
        return found

    def role(self, name: str, task: TaskId) -> ReportedRole | None:
        """What pod `name` last reported for `task`."""
        entry = self.reports.get((name, task))
        return None if entry is None else entry[0].role

    def busy(self) -> bool:
        """A hand-over is under way, a warm-up is still restoring, an activation is not done,
        a pod has not yet applied an assignment written for it, or a task's recorded owner
        does not report it active at its epoch (reconcile's `_all_active`)."""
        ledger = self.ledger or Ledger()
        return (
            any(
                p.newest is not None or p.activating or p.starting or p.down
                for p in self.processes
                if self.current(p)
            )
            or any(o.handover for o in ledger.tasks.values())
            or any(a.tasks_in(TaskRole.WARMUP) for a in ledger.assignments.values())
            or any(
                o.active is not None
                and (
                    (e := self.reports.get((o.active, t))) is None
                    or (e[0].role, e[0].epoch) != (ReportedRole.ACTIVE, o.epoch)
                )
                for t, o in ledger.tasks.items()
            )
        )

    def run_until_settled(self, max_polls: int = 60) -> int:
        """Polls until nothing changes for as long as it takes every pod to apply and report."""
        quiet = 0
        for polls in range(1, max_polls + 1):
            result = self.poll()
            moving = result.writes or result.plan.moves or result.drained or self.busy()
            quiet = 0 if moving else quiet + 1
            if quiet >= max(self.report_every, self.apply_every):
                return polls
        raise AssertionError(f"not settled after {max_polls} polls: {self.actives()}")

    def check_settled(self) -> None:
        """Every hand-over has ended; every task's owner is the one the operator recorded, a
        live pod reporting it active at its epoch; the kept pods hold balanced actives."""
        ledger = self.ledger
        assert ledger is not None
        for task, owner in ledger.tasks.items():
            assert owner.handover is None, f"task {task}'s hand-over never ended"
            assert owner.active is not None, f"task {task} has no owner"
            assert self.owners(task) == [owner.active], (task, owner, self.owners(task))
            assert self.active_holders(task) == [owner.active], (task, self.actives())
            report, _ends = self.reports[(owner.active, task)]
            assert (report.role, report.epoch) == (ReportedRole.ACTIVE, owner.epoch)
        kept = [n for n in self.pods if n not in self.draining]
        counts = [len(self.actives()[n]) for n in kept]
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == self.tasks


def mid_hand_over(release_delay: int) -> tuple[Cluster, TaskId]:
    """Two tasks on `a`, then `b` joins: polled until one task's hand-over to `b` has begun."""
    cluster = Cluster(tasks=2, release_delay=release_delay)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    while not any(o.handover for o in (cluster.ledger or Ledger()).tasks.values()):
        cluster.poll()
    assert cluster.ledger is not None
    (task,) = [t for t, o in cluster.ledger.tasks.items() if o.handover]
    return cluster, task


def test_a_fresh_start_spreads_the_tasks_as_actives_at_epoch_1() -> None:
    cluster = Cluster(tasks=4)
    cluster.start("a", "b")
    first = cluster.poll()
    assert first.ledger.generation == 1
    assert {held.epoch for a in first.writes.values() for held in a.tasks.values()} == {1}
    assert cluster.actives() == {"a": [], "b": []}, "restoring to the changelog's end first"
    assert cluster.role("a", 0) is ReportedRole.WARMUP
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1], "b": [2, 3]}
    cluster.check_settled()


def test_polling_twice_on_the_same_facts_writes_nothing_new() -> None:
    cluster = Cluster(tasks=4)
    cluster.start("a", "b")
    cluster.run_until_settled()
    assert cluster.ledger is not None
    again = step(cluster.ledger, cluster.observe(dict(cluster.pods)), 4, CONFIG)
    assert again.writes == {}
    assert again.ledger.generation == cluster.ledger.generation


def test_scale_out_warms_up_first_and_moves_nothing_while_the_warmups_are_behind() -> None:
    cluster = Cluster(tasks=4)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.catch_up_per_poll = 5  # b restores slower than a's changelogs grow
    cluster.start("b")
    for _ in range(5):
        result = cluster.poll()
    assert cluster.actives() == {"a": [0, 1, 2, 3], "b": []}
    assert result.ledger.assignments["b"].tasks_in(TaskRole.WARMUP) == {2, 3}


def test_stop_the_world_hands_tasks_to_a_new_instance_at_once_through_the_release() -> None:
    eager = PlannerConfig(
        acceptable_recovery_lag=CONFIG.acceptable_recovery_lag, moves=TaskMoves.AT_ONCE
    )
    cluster = Cluster(tasks=4, config=eager)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1], "b": [2, 3]}
    assert cluster.ledger is not None
    assert all(
        held.role is not TaskRole.WARMUP
        for a in cluster.ledger.assignments.values()
        for held in a.tasks.values()
    )


def test_cooperative_hands_tasks_over_without_warm_ups_through_the_release() -> None:
    cooperative = PlannerConfig(
        acceptable_recovery_lag=CONFIG.acceptable_recovery_lag, moves=TaskMoves.WHEN_READY
    )
    cluster = Cluster(tasks=4, config=cooperative)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1], "b": [2, 3]}
    assert not any(
        move.kind is MoveKind.START_WARMUP for step in cluster.history for move in step.plan.moves
    ), "no warm-up was planned (the new owner restores from the release on)"
    cluster.draining.add("b")
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1, 2, 3]}, "b drained and gone"


def test_the_new_owner_is_active_only_after_the_old_owner_released() -> None:
    cluster, task = mid_hand_over(release_delay=3)
    assert cluster.ledger is not None
    assert task not in cluster.ledger.assignments["a"].tasks
    assert cluster.ledger.assignments["b"].tasks[task].role is TaskRole.WARMUP
    for _ in range(3):
        assert cluster.active_holders(task) == ["a"]
        cluster.poll()
    assert cluster.role("a", task) is ReportedRole.RELEASED
    assert cluster.active_holders(task) == []
    released = cluster.reports[("a", task)][0].positions
    activated = cluster.poll()
    held = activated.writes["b"].tasks[task]
    assert held.role is TaskRole.ACTIVE
    assert held.epoch == 2
    assert held.restore_until == released
    cluster.run_until_settled()
    assert cluster.owners(task) == ["b"]


def test_an_activation_takes_polls_and_reports_warmup_until_its_marker_is_restored() -> None:
    cluster = Cluster(tasks=1, catch_up_per_poll=300)
    cluster.start("a")
    cluster.poll()
    polls = 1
    while not cluster.active_holders(0):
        assert cluster.role("a", 0) is ReportedRole.WARMUP
        assert cluster.owners(0) == []
        cluster.poll()
        polls += 1
    assert polls == 6, "4 polls to restore 1000 records, one to mark, one to restore through it"
    assert cluster.owners(0) == ["a"]
    assert cluster.role("a", 0) is ReportedRole.ACTIVE


def test_scale_out_converges_to_balanced_actives_without_two_owners() -> None:
    cluster = Cluster(tasks=12, release_delay=1)
    cluster.start("a", "b")
    cluster.run_until_settled()
    cluster.start("c", "d")
    cluster.run_until_settled()
    assert {len(tasks) for tasks in cluster.actives().values()} == {3}
    cluster.check_settled()


def test_scale_in_moves_state_off_the_drained_instance_before_it_is_deleted() -> None:
    cluster = Cluster(tasks=4, release_delay=1)
    cluster.start("a", "b")
    cluster.run_until_settled()
    cluster.draining.add("b")
    deleted_at = None
    for poll in range(40):
        result = cluster.poll()
        if "b" in result.drained:
            deleted_at = poll
            break
        assert "b" in cluster.pods
    assert deleted_at is not None
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1, 2, 3]}
    moved = [h for h in cluster.history if any(o.handover for o in h.ledger.tasks.values())]
    assert moved, "the drained instance's tasks were handed over, not failed over"


def test_a_task_is_not_taken_back_before_its_new_owner_confirmed_it_holds_it() -> None:
    # Scale out, then at once scale back in: the new owner may never see the generation that
    # made it active, so it can neither process nor release the task. The operator must wait
    # for the owner to report the task active before asking for it back.
    cluster = Cluster(tasks=2, apply_every=3)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    while not (
        cluster.ledger
        and (held := cluster.ledger.assignments.get("b"))
        and held.tasks_in(TaskRole.ACTIVE)
    ):
        cluster.poll()
    cluster.draining.add("b")
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1]}


def test_a_dead_owner_fails_over_at_once_to_a_new_epoch() -> None:
    cluster = Cluster(tasks=2)
    cluster.start("a", "b")
    cluster.run_until_settled()
    cluster.kill("b")
    result = cluster.poll()
    assert result.writes["a"].tasks[1].role is TaskRole.ACTIVE
    assert result.writes["a"].tasks[1].epoch == 2
    assert result.writes["a"].tasks[1].restore_until is None
    assert result.forget == ("b",)
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1]}


def test_a_source_that_dies_before_releasing_hands_the_task_to_the_destination_at_once() -> None:
    cluster, task = mid_hand_over(release_delay=100)
    cluster.kill("a")
    result = cluster.poll()
    assert result.writes["b"].tasks[task].role is TaskRole.ACTIVE
    cluster.run_until_settled()
    assert cluster.active_holders(task) == ["b"]


def test_a_destination_that_dies_mid_hand_over_leaves_the_task_with_its_source() -> None:
    cluster, task = mid_hand_over(release_delay=2)
    cluster.kill("b")
    cluster.poll()
    assert cluster.active_holders(task) == ["a"], "a has not released yet: it still holds it"
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1]}


def test_scale_to_zero_releases_every_task_before_the_instances_go() -> None:
    cluster = Cluster(tasks=2, release_delay=1)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.draining.add("a")
    for _ in range(10):
        result = cluster.poll()
        if result.drained:
            break
    assert result.drained == ("a",)
    assert {cluster.role("a", t) for t in (0, 1)} == {ReportedRole.RELEASED}


def test_a_failover_after_a_hand_over_does_not_inherit_its_restore_until() -> None:
    cluster, task = mid_hand_over(release_delay=0)
    while cluster.active_holders(task) != ["b"]:
        cluster.poll()
    assert cluster.ledger is not None
    assert cluster.ledger.tasks[task].restore_until is not None
    cluster.kill("b")
    failover = cluster.poll()
    assert failover.writes["a"].tasks[task].role is TaskRole.ACTIVE
    assert failover.writes["a"].tasks[task].restore_until is None


def test_an_owner_that_refuses_the_task_fails_it_over_above_the_changelogs_epoch() -> None:
    cluster = Cluster(tasks=1)
    cluster.zombie_marker(0, epoch=4)  # written by an owner the operator no longer remembers
    cluster.start("a")
    while cluster.role("a", 0) is not ReportedRole.REFUSED:
        cluster.poll()
    failover = cluster.poll()
    assert failover.writes["a"].tasks[0].epoch == 5
    assert any("refused" in event for event in failover.events)
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0]}


def test_a_fenced_owner_fails_the_task_over_to_a_higher_epoch() -> None:
    cluster = Cluster(tasks=2)
    cluster.start("a", "b")
    cluster.run_until_settled()
    cluster.zombie_marker(1, epoch=7)  # a zombie wrote a newer marker
    cluster.poll()
    assert cluster.role("b", 1) is ReportedRole.FENCED
    cluster.run_until_settled()
    assert cluster.ledger is not None
    assert cluster.ledger.tasks[1].epoch == 8
    assert cluster.actives() == {"a": [0], "b": [1]}


def test_an_activation_that_finds_a_higher_marker_before_its_own_is_fenced_not_active() -> None:
    cluster = Cluster(tasks=1, catch_up_per_poll=2_000)
    cluster.start("a")
    cluster.poll()  # a restores to the end
    cluster.poll()  # and writes its marker at epoch 1
    changelog = cluster.changelogs[0]
    ((offset, _marker),) = changelog.markers
    # A zombie's marker lands between a's marker and a's restore through it.
    changelog.markers.insert(0, (offset - 1, Writer(3, 0, 0)))
    cluster.poll()
    assert cluster.role("a", 0) is ReportedRole.FENCED
    assert cluster.reports[("a", 0)][0].seen_epoch == 3
    assert cluster.owners(0) == []
    cluster.run_until_settled()
    assert cluster.ledger is not None
    assert cluster.ledger.tasks[0].epoch == 4
    cluster.check_settled()


def _two_polls_before_its_hand_over(cluster: Cluster) -> Cluster:
    """`cluster`, of one task, once a owns it and drains while b warms it up, two polls before
    the operator takes it from a."""
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    cluster.draining.add("a")
    cluster.poll()
    cluster.poll()
    return cluster


def _fenced_just_before_its_hand_over() -> Cluster:
    """A writer a does not know of marks the task just before the operator takes it from a:
    a's next batch finds the marker and stops the task, but a's last report, `active`, is the
    one the operator sees when it begins the hand-over (a reports every other poll)."""
    cluster = Cluster(tasks=1, report_every=2)
    _two_polls_before_its_hand_over(cluster).zombie_marker(0, epoch=3)
    return cluster


def test_a_source_fenced_before_its_hand_over_began_fails_the_task_over_above_the_marker() -> None:
    cluster = _fenced_just_before_its_hand_over()
    cluster.run_until_settled()
    assert any(o.handover for h in cluster.history for o in h.ledger.tasks.values())
    assert cluster.ledger is not None
    assert cluster.ledger.tasks[0].epoch == 4
    cluster.check_settled()


def _restarted_just_before_its_hand_over() -> Cluster:
    """a's container restarts in place: its new process reads its assignment (the task
    active) and finds nothing to release; then the operator, on a's last report (`active`, its
    predecessor's), takes the task from it, and the new process applies that assignment."""
    cluster = Cluster(tasks=1)
    _two_polls_before_its_hand_over(cluster).restart_container("a")
    return cluster


def test_a_source_restarted_in_place_releases_what_its_first_applied_assignment_takes() -> None:
    cluster = _restarted_just_before_its_hand_over()
    cluster.run_until_settled()
    assert any(o.handover for h in cluster.history for o in h.ledger.tasks.values())
    assert cluster.actives() == {"b": [0]}
    cluster.check_settled()


def _restarted_after_releasing() -> Cluster:
    """a hands task 1 over to b and releases it; then b is scaled in and a's container
    restarts in place: the operator gives task 1 back to a as a warm-up, to move it off b."""
    cluster = Cluster(tasks=2, catch_up_per_poll=150)
    cluster.start("a")
    cluster.poll()
    cluster.start("b")
    while cluster.role("a", 1) is not ReportedRole.RELEASED:
        cluster.poll()
    cluster.draining.add("b")
    cluster.restart_container("a")
    return cluster


def test_a_pod_restarted_in_place_warms_up_again_what_it_had_released() -> None:
    cluster = _restarted_after_releasing()
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1]}
    cluster.check_settled()


def test_after_a_restart_a_report_made_before_the_pods_newest_assignment_still_counts() -> None:
    # Pod a-1 got its first assignment at generation 1. At generation 3 it held task 0 active
    # at epoch 2; the operator, not knowing a marker above it had fenced it, began handing the
    # task over to b at generation 4, which a has not applied yet. The operator restarts with
    # its status lost, then a's report of generation 3 arrives: the task is not a's any more.
    ledger = Ledger(
        generation=4,
        tasks={0: Ownership(epoch=2, handover=HandOver("a", "b"))},
        assignments={
            "a": Assignment(generation=4, uid="a-1"),
            "b": Assignment(
                generation=4, uid="b-1", tasks={0: TaskAssignment(role=TaskRole.WARMUP, epoch=2)}
            ),
        },
        joined={"a": 1, "b": 2},
    )
    rebuilt = rebuild(None, ledger, dict(ledger.assignments), {})
    assert rebuilt.joined == {"a": 1, "b": 2}, "the first generation of each pod, as recorded"
    fenced = TaskReport(0, ReportedRole.FENCED, 2, 3, {STORE: 50}, seen_epoch=3, uid="a-1")
    statuses = {"a": InstanceStatus(uid="a-1"), "b": InstanceStatus(uid="b-1")}
    observed = Observation(statuses, {("a", 0): TaskProgress("a", fenced, 0)})
    result = step(rebuilt, observed, 1, CONFIG)
    assert result.ledger.tasks[0].handover is None, "still waiting for a's release"
    assert result.ledger.tasks[0].epoch == 4


def test_a_recreated_pod_starts_as_a_new_instance_and_its_tasks_fail_over() -> None:
    cluster = Cluster(tasks=2)
    cluster.start("a", "b")
    cluster.run_until_settled()
    before = cluster.ledger.generation if cluster.ledger else 0
    cluster.recreate("b")
    result = cluster.poll()
    assert result.writes["b"].generation > before
    assert result.writes["b"].uid == cluster.pods["b"]
    assert result.ledger.joined["b"] == result.writes["b"].generation
    assert result.ledger.tasks[1].epoch == 2, "the task b's old pod held fails over"
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0], "b": [1]}


def test_a_process_that_outlived_its_pod_steps_down_once_its_successor_is_written_to() -> None:
    cluster = Cluster(tasks=2)
    cluster.start("a", "b")
    cluster.run_until_settled()
    old = cluster.process("b")
    cluster.recreate("b", lives=None)
    assert old in cluster.processes
    assert not cluster.current(old)
    old_reports = [report for report, _ends in cluster.reports.values() if report.uid == old.uid]
    result = cluster.poll()
    assert result.writes["b"].uid == cluster.pods["b"]
    assert old.replaced
    assert old not in cluster.processes
    assert all(
        report in old_reports for report, _ends in cluster.reports.values() if report.uid == old.uid
    ), "it stepped down without reporting anything more"
    cluster.run_until_settled()
    cluster.check_settled()


def test_a_process_that_outlived_its_pod_is_fenced_by_its_tasks_next_owner() -> None:
    cluster = Cluster(tasks=2)
    cluster.start("a", "b")
    cluster.run_until_settled()
    zombie = cluster.process("b")
    cluster.kill("b", lives=None)  # deleted by force, not re-created
    cluster.draining.discard("b")
    while 1 not in cluster.process("a").active:
        assert cluster.owners(1) in (["b"], [])
        cluster.poll()
    assert 1 not in zombie.active
    assert cluster.owners(1) == ["a"]
    assert cluster.reports[("b", 1)][0].role is ReportedRole.FENCED


def test_a_live_report_of_a_higher_epoch_raises_the_next_owners_epoch() -> None:
    ledger = Ledger(
        generation=3,
        tasks={0: Ownership(epoch=2)},
        assignments={"a": Assignment(generation=3, tasks={})},
        joined={"a": 1},
    )
    seen = TaskProgress("a", TaskReport(0, ReportedRole.STANDBY, 6, 3, {"counts": 0}), 0)
    result = step(ledger, Observation({"a": InstanceStatus()}, {("a", 0): seen}), 1, CONFIG)
    assert result.writes["a"].tasks[0].epoch == 7


def test_a_release_counts_only_at_the_hand_overs_epoch() -> None:
    ledger = Ledger(
        generation=5,
        tasks={0: Ownership(epoch=2, handover=HandOver("a", "b"))},
        assignments={
            "a": Assignment(generation=5, tasks={}),
            "b": Assignment(generation=5, tasks={0: TaskAssignment(role=TaskRole.WARMUP, epoch=2)}),
        },
        joined={"a": 1, "b": 4},
    )
    other = TaskProgress("a", TaskReport(0, ReportedRole.RELEASED, 3, 5, {"counts": 9}), 0)
    statuses = {"a": InstanceStatus(), "b": InstanceStatus()}
    result = step(ledger, Observation(statuses, {("a", 0): other}), 1, CONFIG)
    assert result.ledger.tasks[0].handover == HandOver("a", "b")
    assert "b" not in result.writes


def _task_1_after_b_reports(role: ReportedRole, epoch: int, generation: int) -> Ownership:
    """a owns tasks 0 and 1; b, whose current pod got its first assignment at generation 5,
    warms task 1 up at epoch 1. b reports task 1 with lag 0 as given: is a hand-over begun?"""
    ledger = Ledger(
        generation=5,
        tasks={0: Ownership(epoch=1, active="a"), 1: Ownership(epoch=1, active="a")},
        assignments={
            "a": Assignment(
                generation=4,
                tasks={
                    0: TaskAssignment(role=TaskRole.ACTIVE, epoch=1),
                    1: TaskAssignment(role=TaskRole.ACTIVE, epoch=1),
                },
            ),
            "b": Assignment(generation=5, tasks={1: TaskAssignment(role=TaskRole.WARMUP, epoch=1)}),
        },
        joined={"a": 1, "b": 5},
    )
    progress = {
        ("a", t): TaskProgress("a", TaskReport(t, ReportedRole.ACTIVE, 1, 4, {"counts": 0}), 0)
        for t in (0, 1)
    }
    progress[("b", 1)] = TaskProgress("b", TaskReport(1, role, epoch, generation, {"counts": 0}), 0)
    statuses = {"a": InstanceStatus(), "b": InstanceStatus()}
    return step(ledger, Observation(statuses, progress), 2, CONFIG).ledger.tasks[1]


def test_a_caught_up_warmup_reporting_what_it_was_given_takes_the_task_over() -> None:
    assert _task_1_after_b_reports(ReportedRole.WARMUP, 1, 5).handover == HandOver("a", "b")


def test_an_earlier_pods_reports_never_make_a_recreated_pod_caught_up() -> None:
    # The predecessor's report of the same role and epoch is still committed under the name b.
    assert _task_1_after_b_reports(ReportedRole.WARMUP, 1, 3).handover is None


def test_a_report_of_another_role_or_epoch_than_given_is_not_counted_for_lag() -> None:
    assert _task_1_after_b_reports(ReportedRole.STANDBY, 1, 5).handover is None
    assert _task_1_after_b_reports(ReportedRole.WARMUP, 0, 5).handover is None


def test_deleting_the_app_gives_every_instance_nothing_and_keeps_the_epochs() -> None:
    cluster = Cluster(tasks=3)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")  # mid-scale: warm-ups on b
    cluster.poll()
    before = cluster.ledger
    assert before is not None
    assert not holds_nothing(before)

    released = release_all(before)

    assert holds_nothing(released)
    assert released.generation == before.generation + 1
    assert set(released.assignments) == {"a", "b"}
    assert all(
        a == Assignment(generation=released.generation, uid=cluster.pods[name])
        for name, a in released.assignments.items()
    )
    assert {t: o.epoch for t, o in released.tasks.items()} == {
        t: o.epoch for t, o in before.tasks.items()
    }
    assert all(owner.active is None for owner in released.tasks.values())


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    tasks=st.integers(1, 10),
    before=st.integers(1, 4),
    after=st.integers(1, 5),
    release_delay=st.integers(0, 3),
    apply_every=st.integers(1, 3),
    kill_at=st.one_of(st.none(), st.integers(0, 6)),
    rescale=st.one_of(st.none(), st.tuples(st.integers(1, 16), st.integers(1, 5))),
    recreate_at=st.one_of(st.none(), st.integers(0, 8)),
    zombie_at=st.one_of(st.none(), st.tuples(st.integers(0, 8), st.integers(0, 9))),
    restarts=st.lists(
        st.tuples(
            st.integers(0, 12), st.integers(0, 6), st.sampled_from(["kept", "lost", "older"])
        ),
        max_size=4,
    ),
)
def test_never_two_active_holders_and_always_settles_balanced(
    tasks: int,
    before: int,
    after: int,
    release_delay: int,
    apply_every: int,
    kill_at: int | None,
    rescale: tuple[int, int] | None,
    recreate_at: int | None,
    zombie_at: tuple[int, int] | None,
    restarts: list[tuple[int, int, str]],
) -> None:
    """Also with pods recreated under their name, zombies writing newer epoch markers, and the
    operator killed between any two of its writes and restarted with a lost or older status."""
    cluster = Cluster(tasks=tasks, release_delay=release_delay, apply_every=apply_every)
    cluster.start(*(f"i{n}" for n in range(before)))
    cluster.run_until_settled()
    names = [f"i{n}" for n in range(max(before, after))]
    cluster.start(*(n for n in names[before:]))
    cluster.draining.update(names[after:])
    for poll in range(120):
        if rescale is not None and poll == rescale[0]:
            # A second scaling decision while the first is under way (kubectl scale twice).
            kept = sorted(n for n in cluster.pods if n not in cluster.draining)
            fresh = [f"j{n}" for n in range(max(0, rescale[1] - len(kept)))]
            cluster.start(*fresh)
            cluster.draining.update((kept + fresh)[rescale[1] :])
        if kill_at is not None and poll == kill_at:
            # A pod dies; the operator re-creates a kept one under its name.
            victim = sorted(cluster.pods)[0]
            if victim in cluster.draining:
                cluster.kill(victim)
            else:
                cluster.recreate(victim)
        if recreate_at is not None and poll == recreate_at:
            cluster.recreate(sorted(cluster.pods)[-1])
        if zombie_at is not None and poll == zombie_at[0]:
            task = zombie_at[1] % tasks
            highest = cluster.changelogs[task].highest()
            cluster.zombie_marker(task, (0 if highest is None else highest.epoch) + 2)
        restart = next(((cut, status) for at, cut, status in restarts if at == poll), None)
        result = cluster.poll(killed_after_writes=None if restart is None else restart[0])
        if restart is not None:
            cluster.restart_operator(restart[1])
    assert not result.plan.moves
    assert not cluster.busy()
    cluster.check_settled()


Fault = tuple[str, int, int | None]

faults = st.one_of(
    # A pod dies (its process with it, or living on that many polls, or until it steps down:
    # deleted by force, a partitioned node); a kept one is re-created under its name.
    st.tuples(st.just("kill"), st.integers(0, 9), st.one_of(st.none(), st.integers(0, 6))),
    # A writer the operator does not know of marks a task above its epoch.
    st.tuples(st.just("marker"), st.integers(0, 9), st.integers(1, 3)),
    # A pod's container restarts in place; its new process starts that many polls later.
    st.tuples(st.just("container"), st.integers(0, 9), st.integers(0, 3)),
    # The operator dies after that many writes and restarts with its status lost.
    st.tuples(st.just("restart"), st.integers(0, 6), st.none()),
    # kubectl scale.
    st.tuples(st.just("scale"), st.integers(1, 5), st.none()),
)


def _inject(cluster: Cluster, fault: Fault) -> int | None:
    """Apply `fault`; for an operator restart, the writes of the next poll it dies after."""
    kind, number, extra = fault
    if kind == "kill" and cluster.pods:
        victim = sorted(cluster.pods)[number % len(cluster.pods)]
        if victim in cluster.draining:
            cluster.kill(victim, extra)
        else:
            cluster.recreate(victim, extra)
    elif kind == "marker":
        # Mostly a task about to move (warmed up elsewhere), where a marker hurts most.
        ledger = cluster.ledger or Ledger()
        moving = sorted(
            {t for a in ledger.assignments.values() for t in a.tasks_in(TaskRole.WARMUP)}
        )
        candidates = moving or list(range(cluster.tasks))
        task = candidates[number % len(candidates)]
        highest = cluster.changelogs[task].highest()
        cluster.zombie_marker(task, (0 if highest is None else highest.epoch) + (extra or 1))
    elif kind == "container" and cluster.pods:
        cluster.restart_container(sorted(cluster.pods)[number % len(cluster.pods)], extra or 0)
    elif kind == "restart":
        return number
    elif kind == "scale":
        kept = sorted(n for n in cluster.pods if n not in cluster.draining)
        fresh = [f"k{cluster.polls}-{n}" for n in range(max(0, number - len(kept)))]
        cluster.start(*fresh)
        cluster.draining.update((kept + fresh)[number:])
    return None


@settings(max_examples=3 * EXAMPLES, deadline=None)
@example(  # found by it: a fenced report of generation 1 set aside after a restart
    tasks=2,
    pods=3,
    release_delay=0,
    apply_every=3,
    catch_up_per_poll=2_000,
    kafka_fences=False,
    quick_activations=False,
    report_every=3,
    schedule=[
        (0, ("kill", 1, None)),
        (24, ("scale", 1, None)),
        (27, ("marker", 0, 1)),
        (28, ("restart", 0, None)),
    ],
)
@given(
    tasks=st.integers(1, 8),
    pods=st.integers(1, 4),
    release_delay=st.integers(0, 2),
    apply_every=st.integers(1, 3),
    catch_up_per_poll=st.sampled_from([150, 400, 2_000]),
    kafka_fences=st.booleans(),
    quick_activations=st.booleans(),
    report_every=st.integers(1, 4),
    schedule=st.lists(st.tuples(st.integers(0, 30), faults), max_size=6),
)
def test_processes_that_outlive_their_pods_and_slow_activations_never_make_two_owners(
    tasks: int,
    pods: int,
    release_delay: int,
    apply_every: int,
    catch_up_per_poll: int,
    kafka_fences: bool,
    quick_activations: bool,
    report_every: int,
    schedule: list[tuple[int, Fault]],
) -> None:
    """Faults at any poll, while activations are under way: pods deleted by force whose process
    lives on beside the pod re-created under its name, owners the operator does not know of
    marking a task, operator restarts with the status lost, scaling. Checked throughout (in
    `Cluster`): never two owners, no activation taking a task from a live owner, epochs and
    generations never going back; and once the faults stop, every hand-over ends and the
    cluster settles balanced, each task owned by the pod the operator recorded."""
    cluster = Cluster(
        tasks=tasks,
        release_delay=release_delay,
        apply_every=apply_every,
        catch_up_per_poll=catch_up_per_poll,
        kafka_fences=kafka_fences,
        quick_activations=quick_activations,
        report_every=report_every,
    )
    cluster.start(*(f"i{n}" for n in range(pods)))
    last = max((at for at, _fault in schedule), default=0)
    for poll in range(last + 1):
        cut = None
        for at, fault in schedule:
            if at == poll:
                cut = _inject(cluster, fault) if cut is None else cut
        cluster.poll(killed_after_writes=cut)
        if cut is not None:
            cluster.restart_operator("lost")
    cluster.run_until_settled(max_polls=80)
    cluster.check_settled()


def test_only_the_reports_of_the_pod_a_name_stands_for_now_count() -> None:
    def report(instance: str, uid: str | None) -> TaskProgress:
        return TaskProgress(
            instance, TaskReport(1, ReportedRole.ACTIVE, 1, 4, {"counts": 0}, uid=uid), 0
        )

    reports = {
        ("a", 1): report("a", "a-1"),  # a predecessor's, or a process that outlived its pod
        ("b", 1): report("b", "b-2"),
        ("c", 1): report("c", None),  # an instance of an older version
        ("d", 1): report("d", "d-1"),  # no pod known for d
    }
    kept = current_pods_reports(reports, {"a": "a-2", "b": "b-2", "c": "c-1"})
    assert set(kept) == {("b", 1), ("c", 1), ("d", 1)}


def test_assignments_are_addressed_to_a_pod_and_written_again_for_its_successor() -> None:
    statuses = {"a": InstanceStatus(uid="a-1")}
    first = step(Ledger(), Observation(statuses, {}), 1, CONFIG)
    assert first.writes["a"].uid == "a-1"
    again = step(first.ledger, Observation(statuses, {}), 1, CONFIG)
    assert again.writes == {}
    successor = step(first.ledger, Observation({"a": InstanceStatus(uid="a-2")}, {}), 1, CONFIG)
    assert successor.writes["a"].uid == "a-2"


def test_a_stalled_owner_loses_its_tasks_at_once_and_gets_none_back() -> None:
    """An owner that reports itself stalled (its micro-batch hangs) processes nothing and may
    never release: its task fails over at once, to another instance, at the next epoch."""
    ledger = Ledger(
        generation=4,
        tasks={0: Ownership(epoch=2, active="a"), 1: Ownership(epoch=1, active="b")},
        assignments={
            "a": Assignment(generation=4, tasks={0: TaskAssignment(role=TaskRole.ACTIVE, epoch=2)}),
            "b": Assignment(
                generation=4,
                tasks={
                    1: TaskAssignment(role=TaskRole.ACTIVE, epoch=1),
                    0: TaskAssignment(role=TaskRole.STANDBY, epoch=2),
                },
            ),
        },
        joined={"a": 1, "b": 1},
    )
    stalled = TaskReport(0, ReportedRole.ACTIVE, 2, 4, {"counts": 0}, stalled_for=130.0)
    progress = {
        ("a", 0): TaskProgress("a", stalled, 0),
        ("b", 1): TaskProgress("b", TaskReport(1, ReportedRole.ACTIVE, 1, 4, {"counts": 0}), 0),
        ("b", 0): TaskProgress("b", TaskReport(0, ReportedRole.STANDBY, 2, 4, {"counts": 0}), 0),
    }
    statuses = {"a": InstanceStatus(), "b": InstanceStatus()}
    result = step(ledger, Observation(statuses, progress), 2, CONFIG)

    assert result.ledger.tasks[0].active == "b"
    assert result.ledger.tasks[0].epoch == 3
    assert result.writes["b"].tasks[0].role is TaskRole.ACTIVE
    assert result.writes["a"].tasks_in(TaskRole.ACTIVE) == set()
    assert any("a has completed no micro-batch for 130 s" in event for event in result.events)
