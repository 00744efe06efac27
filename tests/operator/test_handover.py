"""The operator's hand-over sequencing, specified against instances that follow the protocol.

`Cluster` below plays the instances' side of docs/architecture.md: an instance holds a task
active from the moment it is assigned active until it has released it; when its assignment
drops an active task it releases it (immediately, or after some polls, as a micro-batch may
take); warm-ups and standbys catch up by a fixed number of records per poll. Each task's
changelog remembers the highest epoch written to it: an instance refuses an activation below
it, and an active finds itself fenced once a higher one is there. A pod recreated under the
same name starts empty, while its predecessor's reports linger in Kafka until it commits its
own. The operator persists each poll as it does for real: the ledger record, then the
assignments, then the status; it can be killed between any two of these writes and restarts
from `rebuild()`.
"""

from dataclasses import dataclass, field

from hypothesis import given, settings
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
from smoothscale.planner.model import PlannerConfig
from smoothscale.tasks import TaskId, TaskRole

CONFIG = PlannerConfig(acceptable_recovery_lag=100, max_warmup_replicas=2)
STATE_SIZE = 1_000
"""Changelog records per task: a new replica starts this far behind."""


@dataclass
class Replica:
    lag: int = STATE_SIZE
    role: ReportedRole = ReportedRole.WARMUP
    epoch: int = 0
    release_in: int | None = None
    """Polls until a revoked active is released; None when not revoked."""
    generation: int = 0
    """The generation of the assignment the instance last applied."""
    seen_epoch: int | None = None


@dataclass
class Cluster:
    tasks: int
    instances: dict[str, dict[TaskId, Replica]] = field(default_factory=dict)
    catch_up_per_poll: int = 400
    release_delay: int = 0
    apply_every: int = 1
    """An instance takes its newest assignment only every this many polls, so it may never
    see the generations written in between (as a busy instance between micro-batches)."""
    ledger: Ledger = field(default_factory=Ledger)
    pending: dict[str, Assignment] = field(default_factory=dict)
    polls: int = 0
    draining: set[str] = field(default_factory=set)
    history: list[Step] = field(default_factory=list)
    changelog_epochs: dict[TaskId, int] = field(default_factory=dict)
    """The highest epoch each task's changelog holds (epoch markers written by activations)."""
    lingering: dict[tuple[str, TaskId], TaskProgress] = field(default_factory=dict)
    """Reports of pods that were replaced, still committed under their (reused) name."""
    activated: dict[tuple[TaskId, int], str] = field(default_factory=dict)
    """Which instance activated each task at each epoch."""
    kafka_ledger: Ledger | None = None
    kafka_assignments: dict[str, Assignment] = field(default_factory=dict)
    statuses: list[Ledger] = field(default_factory=list)
    """Every status written, the newest last."""
    highest_generation: int = 0
    """The highest generation written to Kafka so far."""
    highest_epochs: dict[TaskId, int] = field(default_factory=dict)
    """The highest epoch of each task written to Kafka so far."""
    rewrite_all: bool = False
    """Set by a restart: the next poll writes every assignment of the rebuilt ledger."""
    config: PlannerConfig = CONFIG

    def start(self, *names: str) -> None:
        for name in names:
            self.instances[name] = {}

    def kill(self, name: str) -> None:
        del self.instances[name]
        self.draining.discard(name)
        self.pending.pop(name, None)

    def recreate(self, name: str) -> None:
        """The pod `name` is replaced by a new, empty one; the operator forgets the old one."""
        self.lingering.update(
            {(n, t): p for (n, t), p in self.observe().progress.items() if n == name}
        )
        self.instances[name] = {}
        self.pending.pop(name, None)
        self.ledger, _events = forget(self.ledger, name)

    def observe(self) -> Observation:
        progress = {
            key: report for key, report in self.lingering.items() if key[0] in self.instances
        }
        progress |= {
            (name, task): TaskProgress(
                name,
                TaskReport(
                    task,
                    replica.role,
                    replica.epoch,
                    replica.generation,
                    {"counts": 10 * task},
                    seen_epoch=replica.seen_epoch,
                ),
                0 if replica.role is ReportedRole.ACTIVE else replica.lag,
            )
            for name, replicas in self.instances.items()
            for task, replica in replicas.items()
        }
        statuses = {name: InstanceStatus(draining=name in self.draining) for name in self.instances}
        return Observation(instances=statuses, progress=progress)

    def poll(self, killed_after_writes: int | None = None) -> Step:
        """One poll of the operator; `killed_after_writes`: it dies after that many writes."""
        result = step(self.ledger, self.observe(), self.tasks, self.config)
        self._check_nothing_goes_back(result)
        self.ledger = result.ledger
        self.history.append(result)
        writes: list[tuple[str, Assignment | None]] = [("ledger record", None)]
        # After a restart the operator writes every assignment of its rebuilt ledger again
        # (smoothscale.operator.reconcile): the one it died before writing reaches its pod.
        assignments = result.ledger.assignments if self.rewrite_all else result.writes
        self.rewrite_all = False
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
            elif assignment is None:
                self.kafka_assignments.pop(what, None)
            else:
                self.kafka_assignments[what] = assignment
                self.pending[what] = assignment
                self.highest_generation = max(self.highest_generation, assignment.generation)
        drained = result.drained if killed_after_writes is None else ()
        for name in drained:
            owned = [
                t
                for t, o in result.ledger.tasks.items()
                if name == o.active or (o.handover is not None and o.handover.source == name)
            ]
            assert not owned, f"{name} is stopped as drained while it owns tasks {owned}"
            assert not any(r.role is ReportedRole.ACTIVE for r in self.instances[name].values())
            self.kill(name)
        self.polls += 1
        if self.polls % self.apply_every == 0:
            for name, assignment in sorted(self.pending.items()):
                if name in self.instances:
                    self._apply(name, assignment)
            self.pending.clear()
        self._advance()
        return result

    def restart_operator(self, status: str) -> None:
        """A new operator process: its ledger rebuilt from the `status` ("kept", "lost" or
        "older" than Kafka) and what Kafka holds."""
        kept = {
            "kept": self.statuses[-1] if self.statuses else None,
            "lost": None,
            "older": self.statuses[-3] if len(self.statuses) >= 3 else None,
        }[status]
        self.ledger = rebuild(
            kept, self.kafka_ledger, self.kafka_assignments, self.observe().progress
        )
        self.rewrite_all = True

    def _check_nothing_goes_back(self, result: Step) -> None:
        """Nothing the operator is about to write is older than what Kafka already has."""
        for assignment in result.writes.values():
            assert assignment.generation > self.highest_generation, "a generation went back"
            for task, held in assignment.tasks.items():
                assert held.epoch >= self.highest_epochs.get(task, 0), f"task {task}'s epoch"
        for task, owner in result.ledger.tasks.items():
            assert owner.epoch >= self.highest_epochs.get(task, 0), f"task {task}'s epoch"

    def _apply(self, name: str, assignment: Assignment) -> None:
        replicas = self.instances[name]
        for task, replica in list(replicas.items()):
            if task in assignment.tasks:
                continue
            if replica.role is ReportedRole.ACTIVE:
                replica.release_in = self.release_delay
            elif replica.role is not ReportedRole.RELEASED:
                del replicas[task]
        for task in replicas:
            self.lingering.pop((name, task), None)
        for replica in replicas.values():
            replica.generation = assignment.generation
        for task, held in assignment.tasks.items():
            replica = replicas.setdefault(task, Replica(generation=assignment.generation))
            self.lingering.pop((name, task), None)
            if held.role is TaskRole.ACTIVE:
                if replica.role is ReportedRole.ACTIVE and replica.epoch == held.epoch:
                    continue
                seen = self.changelog_epochs.get(task, 0)
                if held.epoch <= seen:
                    replica.role, replica.epoch, replica.seen_epoch = (
                        ReportedRole.REFUSED,
                        held.epoch,
                        seen,
                    )
                    continue
                first = self.activated.setdefault((task, held.epoch), name)
                assert first == name, f"task {task} epoch {held.epoch} given to {first} and {name}"
                self.changelog_epochs[task] = held.epoch
                replica.role, replica.epoch, replica.lag, replica.release_in = (
                    ReportedRole.ACTIVE,
                    held.epoch,
                    0,
                    None,
                )
            elif replica.role is not ReportedRole.ACTIVE:
                replica.role = ReportedRole(held.role.value)
                replica.epoch = held.epoch

    def _advance(self) -> None:
        for replicas in self.instances.values():
            for task, replica in replicas.items():
                seen = self.changelog_epochs.get(task, 0)
                if replica.role is ReportedRole.ACTIVE and seen > replica.epoch:
                    replica.role, replica.seen_epoch, replica.release_in = (
                        ReportedRole.FENCED,
                        seen,
                        None,
                    )
                elif replica.release_in is not None:
                    if replica.release_in == 0:
                        replica.role, replica.release_in = ReportedRole.RELEASED, None
                    else:
                        replica.release_in -= 1
                elif replica.role in (ReportedRole.WARMUP, ReportedRole.STANDBY):
                    replica.lag = max(0, replica.lag - self.catch_up_per_poll)

    def active_holders(self, task: TaskId) -> list[str]:
        """Instances that hold `task` active: assigned, and not yet released."""
        return [
            name
            for name, replicas in self.instances.items()
            if task in replicas and replicas[task].role is ReportedRole.ACTIVE
        ]

    def actives(self) -> dict[str, list[TaskId]]:
        return {
            name: sorted(t for t, r in replicas.items() if r.role is ReportedRole.ACTIVE)
            for name, replicas in sorted(self.instances.items())
        }

    def busy(self) -> bool:
        """A hand-over is under way, a warm-up is still restoring, or an instance has not yet
        taken an assignment written for it."""
        return (
            bool(self.pending)
            or any(o.handover for o in self.ledger.tasks.values())
            or any(a.tasks_in(TaskRole.WARMUP) for a in self.ledger.assignments.values())
        )

    def run_until_settled(self, max_polls: int = 60) -> int:
        for polls in range(1, max_polls + 1):
            result = self.poll()
            for task in range(self.tasks):
                assert len(self.active_holders(task)) <= 1, (task, self.actives())
            if not (result.writes or result.plan.moves or result.drained or self.busy()):
                return polls
        raise AssertionError(f"not settled after {max_polls} polls: {self.actives()}")


def mid_hand_over(release_delay: int) -> tuple[Cluster, TaskId]:
    """Two tasks on `a`, then `b` joins: polled until one task's hand-over to `b` has begun."""
    cluster = Cluster(tasks=2, release_delay=release_delay)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    while not any(o.handover for o in cluster.ledger.tasks.values()):
        cluster.poll()
    (task,) = [t for t, o in cluster.ledger.tasks.items() if o.handover]
    return cluster, task


def test_a_fresh_start_spreads_the_tasks_as_actives_at_epoch_1() -> None:
    cluster = Cluster(tasks=4)
    cluster.start("a", "b")
    first = cluster.poll()
    assert first.ledger.generation == 1
    assert cluster.actives() == {"a": [0, 1], "b": [2, 3]}
    assert {held.epoch for a in first.writes.values() for held in a.tasks.values()} == {1}


def test_polling_twice_on_the_same_facts_writes_nothing_new() -> None:
    cluster = Cluster(tasks=4)
    cluster.start("a", "b")
    cluster.run_until_settled()
    again = step(cluster.ledger, cluster.observe(), 4, CONFIG)
    assert again.writes == {}
    assert again.ledger.generation == cluster.ledger.generation


def test_scale_out_warms_up_first_and_moves_nothing_while_the_warmups_are_behind() -> None:
    cluster = Cluster(tasks=4, catch_up_per_poll=0)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    for _ in range(5):
        result = cluster.poll()
    assert cluster.actives() == {"a": [0, 1, 2, 3], "b": []}
    assert result.ledger.assignments["b"].tasks_in(TaskRole.WARMUP) == {2, 3}


def test_stop_the_world_hands_tasks_to_a_new_instance_at_once_through_the_release() -> None:
    eager = PlannerConfig(
        acceptable_recovery_lag=CONFIG.acceptable_recovery_lag, stop_the_world=True
    )
    cluster = Cluster(tasks=4, catch_up_per_poll=0, config=eager)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0, 1], "b": [2, 3]}, "moved with nothing restored yet"
    assert all(
        held.role is not TaskRole.WARMUP
        for a in cluster.ledger.assignments.values()
        for held in a.tasks.values()
    )


def test_the_new_owner_is_active_only_after_the_old_owner_released() -> None:
    cluster, task = mid_hand_over(release_delay=3)
    assert task not in cluster.ledger.assignments["a"].tasks
    assert cluster.ledger.assignments["b"].tasks[task].role is TaskRole.WARMUP
    for _ in range(3):
        assert cluster.active_holders(task) == ["a"]
        cluster.poll()
    assert cluster.instances["a"][task].role is ReportedRole.RELEASED
    assert cluster.active_holders(task) == []
    activated = cluster.poll()
    held = activated.writes["b"].tasks[task]
    assert held.role is TaskRole.ACTIVE
    assert held.epoch == 2
    assert held.restore_until == {"counts": 10 * task}


def test_scale_out_converges_to_balanced_actives_without_two_owners() -> None:
    cluster = Cluster(tasks=12, release_delay=1)
    cluster.start("a", "b")
    cluster.run_until_settled()
    cluster.start("c", "d")
    cluster.run_until_settled()
    assert {len(tasks) for tasks in cluster.actives().values()} == {3}


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
        assert "b" in cluster.instances
    assert deleted_at is not None
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
    while not any(
        a.tasks_in(TaskRole.ACTIVE) for n, a in cluster.ledger.assignments.items() if n == "b"
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
    assert cluster.actives() == {"a": [0, 1]}
    assert result.writes["a"].tasks[1].epoch == 2
    assert result.writes["a"].tasks[1].restore_until is None
    assert result.forget == ("b",)


def test_a_source_that_dies_before_releasing_hands_the_task_to_the_destination_at_once() -> None:
    cluster, task = mid_hand_over(release_delay=100)
    cluster.kill("a")
    result = cluster.poll()
    assert result.writes["b"].tasks[task].role is TaskRole.ACTIVE
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
        assert cluster.actives() in ({"a": [0, 1]}, {"a": []}, {"a": [0]}, {"a": [1]})
    assert result.drained == ("a",)
    assert all(r.role is ReportedRole.RELEASED for r in cluster.instances.get("a", {}).values())


def test_a_failover_after_a_hand_over_does_not_inherit_its_restore_until() -> None:
    cluster, task = mid_hand_over(release_delay=0)
    while cluster.active_holders(task) != ["b"]:
        cluster.poll()
    assert cluster.ledger.tasks[task].restore_until is not None
    cluster.kill("b")
    failover = cluster.poll()
    assert failover.writes["a"].tasks[task].role is TaskRole.ACTIVE
    assert failover.writes["a"].tasks[task].restore_until is None


def test_an_owner_that_refuses_the_task_fails_it_over_above_the_changelogs_epoch() -> None:
    cluster = Cluster(tasks=1)
    cluster.changelog_epochs[0] = 4  # written by an owner the operator no longer remembers
    cluster.start("a")
    cluster.poll()
    assert cluster.instances["a"][0].role is ReportedRole.REFUSED
    failover = cluster.poll()
    assert failover.writes["a"].tasks[0].epoch == 5
    assert any("refused" in event for event in failover.events)
    cluster.run_until_settled()
    assert cluster.actives() == {"a": [0]}


def test_a_fenced_owner_fails_the_task_over_to_a_higher_epoch() -> None:
    cluster = Cluster(tasks=2)
    cluster.start("a", "b")
    cluster.run_until_settled()
    cluster.changelog_epochs[1] = 7  # a zombie wrote a newer marker
    cluster.poll()
    assert cluster.instances["b"][1].role is ReportedRole.FENCED
    cluster.run_until_settled()
    assert cluster.ledger.tasks[1].epoch == 8
    assert cluster.actives() == {"a": [0], "b": [1]}


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


def test_a_recreated_pod_starts_as_a_new_instance_and_its_tasks_fail_over() -> None:
    cluster = Cluster(tasks=2, catch_up_per_poll=0)
    cluster.start("a", "b")
    cluster.run_until_settled()
    before = cluster.ledger.generation
    cluster.recreate("b")
    result = cluster.poll()
    assert result.writes["b"].generation > before
    assert result.ledger.joined["b"] == result.writes["b"].generation
    assert cluster.ledger.tasks[1].epoch == 2, "the task b's old pod held fails over"
    for _ in range(5):
        cluster.poll()
    assert cluster.actives() == {"a": [0], "b": [1]}


def test_deleting_the_app_gives_every_instance_nothing_and_keeps_the_epochs() -> None:
    cluster = Cluster(tasks=3, catch_up_per_poll=0)
    cluster.start("a")
    cluster.run_until_settled()
    cluster.start("b")  # mid-scale: warm-ups on b
    cluster.poll()
    before = cluster.ledger
    assert not holds_nothing(before)

    released = release_all(before)

    assert holds_nothing(released)
    assert released.generation == before.generation + 1
    assert set(released.assignments) == {"a", "b"}
    assert all(
        a == Assignment(generation=released.generation) for a in released.assignments.values()
    )
    assert {t: o.epoch for t, o in released.tasks.items()} == {
        t: o.epoch for t, o in before.tasks.items()
    }
    assert all(owner.active is None for owner in released.tasks.values())


@settings(max_examples=100, deadline=None)
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
            kept = sorted(n for n in cluster.instances if n not in cluster.draining)
            fresh = [f"j{n}" for n in range(max(0, rescale[1] - len(kept)))]
            cluster.start(*fresh)
            cluster.draining.update((kept + fresh)[rescale[1] :])
        if kill_at is not None and poll == kill_at:
            # A pod dies; the operator recreates a kept one under a new name.
            victim = sorted(cluster.instances)[0]
            was_kept = victim not in cluster.draining
            cluster.kill(victim)
            if was_kept:
                cluster.start(f"{victim}-again")
        if recreate_at is not None and poll == recreate_at:
            cluster.recreate(sorted(cluster.instances)[-1])
        if zombie_at is not None and poll == zombie_at[0]:
            task = zombie_at[1] % tasks
            cluster.changelog_epochs[task] = cluster.changelog_epochs.get(task, 0) + 2
        restart = next(((cut, status) for at, cut, status in restarts if at == poll), None)
        result = cluster.poll(killed_after_writes=None if restart is None else restart[0])
        if restart is not None:
            cluster.restart_operator(restart[1])
        for task in range(tasks):
            assert len(cluster.active_holders(task)) <= 1
    assert not result.plan.moves
    assert not cluster.busy()
    live_kept = [n for n in cluster.instances if n not in cluster.draining]
    counts = [len(cluster.actives()[n]) for n in live_kept]
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == tasks


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
