"""Randomised ownership histories on the real runtime: one task, several real instances, and a
test operator that hands the task over, fails it over (the old owner not told: a zombie that
keeps running), bumps its epoch, restarts its owner in place, races two activations, lets a
zombie's transaction straddle the new owner's marker and an owner die in the middle of a batch,
with gap reads that time out; on a broker that fences (the Kafka front) and on one that does
not (the bare mock).

After every step, the changelog (read as a restore reads it, through the real fold) must hold a
state that is the fold of an input prefix (nothing lost, applied twice or brought back), and
when the highest writer in the log is an active instance, exactly that instance's state and
input position. At the end a fresh owner takes the task over and processes all input: its
state, a fresh restore and every compaction of the log at every point of its history must be
the reference. `SMOOTHSCALE_HISTORIES` (default 1) histories run per broker; the seed of a
failing one is in its message, and `SMOOTHSCALE_HISTORY_SEED` replays it alone."""

import json
import os
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from confluent_kafka import Producer

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from smoothscale.kafka.assignments import Assignment, AssignmentWriter, TaskAssignment
from smoothscale.kafka.progress import ProgressReader, ReportedRole, TaskReport
from smoothscale.runtime import instance as instance_module
from smoothscale.runtime.changelog import ChangelogFormatError, RecordKind, parse_record
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.instance import Instance
from smoothscale.runtime.metrics import InstanceMetrics
from smoothscale.runtime.transactions import TaskProducer
from smoothscale.tasks import TaskRole
from tests.runtime.changelog_model import replay
from tests.runtime.instance_helpers import (
    PARTITIONS,
    app_config,
    cycling_count,
    cycling_reference,
    feed,
    for_instance,
    produce_to_partition,
)
from tests.runtime.test_one_writer import assert_compaction_safe, changelog, restored

TASK = 0
USERS = ["alice", "bob", "carol", "dave", "erin", "zed"]
SETTLE_SECONDS = 15.0

if "SMOOTHSCALE_HISTORY_SEED" in os.environ:
    SEEDS = [int(os.environ["SMOOTHSCALE_HISTORY_SEED"])]
else:
    SEEDS = list(range(int(os.environ.get("SMOOTHSCALE_HISTORIES", "1"))))


class Died(Exception):
    """Raised inside a commit: the process dies with its transaction open."""


@dataclass
class Process:
    name: str
    instance: Instance
    alive: bool = True


class History:
    """The test operator, the processes, the input, and the checks."""

    def __init__(self, config: WorkerConfig, rng: random.Random, log: list[str]) -> None:
        self.config = config
        self.rng = rng
        self.log = log
        self.operator = AssignmentWriter(config.bootstrap_servers, config.app_id)
        self.reader = ProgressReader(
            config.bootstrap_servers, config.app_id, config.changelog_topics()
        )
        self.generation = 0
        self.epoch = 0
        self.owner: Process | None = None
        """The process the operator last gave the task to."""
        self.processes: list[Process] = []
        self.records: list[str] = []
        self.pods = 0
        self.slow: dict[str, int] = {}
        """Feed steps a new owner sits out before it processes."""
        self.hook: Hook | None = None
        """Runs inside the next transaction of the task that writes a record of its kind."""

    # The operator's side --------------------------------------------------------------

    def assign(self, process: Process, epoch: int | None, until: dict[str, int] | None) -> None:
        self.generation += 1
        tasks = {}
        if epoch is not None:
            tasks[TASK] = TaskAssignment(role=TaskRole.ACTIVE, epoch=epoch, restore_until=until)
        self.operator.write(process.name, Assignment(generation=self.generation, tasks=tasks))

    def new_process(self, name: str | None = None, state_dir: Path | None = None) -> Process:
        if name is None:
            self.pods += 1
            name = f"pod-{self.pods}"
        config = for_instance(self.config, name)
        if state_dir is not None:
            config = config.model_copy(update={"state_dir": state_dir})
        else:
            config = config.model_copy(update={"state_dir": config.state_dir / str(self.pods)})
        config.state_dir.mkdir(parents=True, exist_ok=True)
        instance = Instance(
            config, cycling_count(), InstanceMetrics(), config.state_dir / "plan.json"
        )
        instance.start(first_assignment_timeout=5)
        process = Process(name, instance)
        self.processes.append(process)
        return process

    def spare(self) -> Process:
        """A live process other than the owner, or a new one (told nothing yet)."""
        others = [p for p in self.processes if p.alive and p is not self.owner]
        if others and self.rng.random() < 0.5:
            return self.rng.choice(others)
        return self.new_process()

    def report(self, process: Process) -> TaskReport | None:
        return self.reader.reports(process.name, PARTITIONS).get(TASK)

    def settle(self, *processes: Process) -> None:
        """Tick until each process holds the task active or says it does not."""
        waiting = list(processes)
        deadline = threading.Event()
        timer = threading.Timer(SETTLE_SECONDS, deadline.set)
        timer.start()
        try:
            while waiting and not deadline.is_set():
                for process in list(waiting):
                    process.instance.tick()
                    report = self.report(process)
                    if TASK in process.instance.active_tasks() or (
                        report is not None
                        and report.role in (ReportedRole.FENCED, ReportedRole.REFUSED)
                    ):
                        waiting.remove(process)
        finally:
            timer.cancel()
        assert not waiting, f"{[p.name for p in waiting]} never settled"

    # Steps ----------------------------------------------------------------------------------

    def produce(self) -> None:
        users = [self.rng.choice(USERS) for _ in range(self.rng.randint(1, 6))]
        for user in users:
            produce_to_partition(self.config, TASK, 1, user)
        self.records.extend(users)

    def feed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every live process that holds the task active runs a batch (the owner and any
        zombie), some with their gap reads timing out."""
        holders = [p for p in self.processes if p.alive and TASK in p.instance.active_tasks()]
        # Not in lockstep: an owner and a zombie that process the same records change the same
        # keys, which would hide what one of them does to the other's. A new owner may be slow
        # to start processing, while the zombie it replaced goes on.
        running = [p for p in holders if self.slow.get(p.name, 0) == 0]
        for name in self.slow:
            self.slow[name] = max(0, self.slow[name] - 1)
        for process in [p for p in running if self.rng.random() < 0.6] or running[:1]:
            self._run_batch(process, monkeypatch)

    def _run_batch(self, process: Process, monkeypatch: pytest.MonkeyPatch) -> None:
        """One micro-batch of `process`, maybe with its gap reads timing out."""
        timeout = self.rng.random() < 0.25
        if timeout:
            monkeypatch.setattr(instance_module, "GAP_READ_SECONDS", 0.0)
        try:
            feed(process.instance, limit=self.rng.randint(1, 4))
        except Died:
            self.log.append(f"{process.name} died mid-batch")
            self.kill(process)
        finally:
            if timeout:
                monkeypatch.setattr(instance_module, "GAP_READ_SECONDS", 5.0)

    def zombies_run(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Only the processes that hold the task without being its owner run a batch: a zombie
        goes on while the new owner is still slow to start."""
        owner = self.owner
        for process in self.processes:
            if process is owner or not process.alive:
                continue
            if TASK in process.instance.active_tasks():
                self._run_batch(process, monkeypatch)

    def kill(self, process: Process) -> None:
        """The process stops at once: no release, no report (its transaction may stay open)."""
        held = threading.Event()
        done = threading.Event()

        def hold() -> None:
            with process.instance.lock:
                held.set()
                done.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        try:
            process.instance.shutdown(timeout=0.01)
        finally:
            done.set()
            holder.join()
        process.alive = False

    def hand_over(self) -> None:
        source, destination = self.owner, self.spare()
        assert source is not None
        self.assign(source, None, None)
        deadline = threading.Event()
        timer = threading.Timer(SETTLE_SECONDS, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                source.instance.tick()
                report = self.report(source)
                if report is not None and report.generation == self.generation:
                    break
        finally:
            timer.cancel()
        report = self.report(source)
        assert report is not None
        self.epoch += 1
        if report.role is ReportedRole.RELEASED:
            self.log.append(f"hand over {source.name} -> {destination.name} @{self.epoch}")
            self.assign(destination, self.epoch, dict(report.positions))
        else:  # it did not hold the task (it had lost it): fail over instead
            self.log.append(f"{source.name} reports {report.role.value}: fail over")
            self.assign(destination, self.epoch, None)
        self.owner = destination
        self.settle(destination)

    def fail_over(self) -> None:
        destination = self.spare()
        self.epoch += 1
        self.log.append(f"fail over to {destination.name} @{self.epoch} (old owner not told)")
        self.assign(destination, self.epoch, None)
        self.owner = destination
        self.slow[destination.name] = self.rng.randint(0, 3)
        self.settle(destination)

    def bump_epoch(self) -> None:
        assert self.owner is not None
        self.epoch += 1
        self.log.append(f"epoch bump of {self.owner.name} @{self.epoch}")
        self.assign(self.owner, self.epoch, None)
        self.settle(self.owner)

    def restart_in_place(self) -> None:
        owner = self.owner
        assert owner is not None
        self.log.append(f"{owner.name} restarted in place")
        if owner.alive:
            self.kill(owner)
        self.owner = self.new_process(owner.name, owner.instance.config.state_dir)
        self.settle(self.owner)

    def race(self) -> None:
        """Two operators' assignments, the old owner told by neither; the second activation
        starts while the first one's marker is in the log but not committed."""
        first, second = self.spare(), self.new_process()
        epochs = (self.epoch + 1, self.epoch + self.rng.randint(0, 1))
        self.epoch = max(epochs)
        self.log.append(f"race {first.name}@{epochs[0]} / {second.name}@{epochs[1]}")

        def second_activates() -> None:
            # While the first's marker transaction is open: the second restores through it.
            self.assign(second, epochs[1], None)
            self.settle(second)

        self.hook = Hook("marker", second_activates)
        self.assign(first, epochs[0], None)
        self.settle(first)
        if self.hook is not None:  # the first wrote no marker (it refused the task)
            self.hook = None
            second_activates()
        self.settle(second)
        holders = [p for p in (second, first) if TASK in p.instance.active_tasks()]
        self.owner = holders[0] if holders else second

    def straddle(self) -> None:
        """The owner's next batch is in the log but for its closer when the operator fails the
        task over (the owner not told) and the new owner activates."""
        self.hook = Hook("closer", self._fail_over_now)
        self.log.append("the next batch straddles a fail-over")

    def slot(self) -> None:
        """The owner's next batch is in the log, not committed, when the operator fails the
        task over and the new owner activates: its marker takes the slot of the commit."""
        self.hook = Hook("commit", self._fail_over_now)
        self.log.append("a fail-over in the commit slot of the next batch")

    def _fail_over_now(self) -> None:
        destination = self.new_process()
        self.epoch += 1
        self.assign(destination, self.epoch, None)
        self.owner = destination
        self.slow[destination.name] = self.rng.randint(0, 3)
        # While the old owner's transaction is open: the new marker lands inside it.
        self.settle(destination)

    def die_mid_batch(self) -> None:
        """The next batch dies with its transaction open, all but its closer in the log."""

        def die() -> None:
            raise Died

        self.hook = Hook("closer", die)
        self.log.append("the next batch dies mid-way")

    # Checks -----------------------------------------------------------------------------

    def check(self) -> None:
        """The changelog holds the fold of an input prefix, and the highest writer's state
        when it is active somewhere."""
        records = changelog(self.config, TASK)
        view = replay(records)
        topic = self.config.input_topics[0]
        position = view.input.get(topic, 0)
        assert view.visible() == cycling_reference(self.records[:position]), (
            f"the changelog restores a state that is no input prefix's (position {position})"
        )
        markers = [r for _o, r in records if r.kind is RecordKind.MARKER]
        if not markers:
            return
        highest = max(r.writer for r in markers)
        named = next(r for r in markers if r.writer == highest)
        name = json.loads(named.value or b"{}")["instance"]
        for process in self.processes:
            held = process.instance.active_tasks().get(TASK)
            if process.alive and process.name == name and held == highest.epoch:
                with process.instance.lock:
                    own = process.instance.state_snapshot(TASK)
                    starts = process.instance.read_from()
                assert view.visible() == own, f"the changelog is not {name}'s state"
                assert position == starts[(topic, TASK)], f"not {name}'s input position"

    def finish(self, tmp_path: Path) -> None:
        """A fresh owner takes the task over and processes everything."""
        for process in self.processes:
            if process.alive:
                self.kill(process)
        final = self.new_process()
        self.epoch += 1
        self.assign(final, self.epoch, None)
        self.owner = final
        self.settle(final)
        assert final.instance.active_tasks() == {TASK: self.epoch}
        while feed(final.instance):
            pass
        state = final.instance.state_snapshot(TASK)
        self.kill(final)
        reference = cycling_reference(self.records)
        assert state == reference, "the final owner's state is not the reference"
        assert restored(self.config, TASK, tmp_path) == reference
        self.check()
        assert_compaction_safe(changelog(self.config, TASK), sample=self.rng)

    def close(self) -> None:
        for process in self.processes:
            if process.alive:
                self.kill(process)
        self.operator.close()
        self.reader.close()


@dataclass
class Hook:
    where: Literal["marker", "closer", "commit"]
    """Where in the next transaction of the task that writes there it runs: right after its
    marker, right before a batch's closer, or after all of a batch's records (in the slot of
    its commit marker), the records before it flushed to the log."""
    action: Callable[[], None]


class HookedProducer:
    """A task producer's Kafka producer whose `produce` runs `before` and `after` each record
    (the records as `parse_record` reads them; None: an output record)."""

    def __init__(
        self,
        inner: Producer,
        before: Callable[[Any], None],
        after: Callable[[Any], None],
    ) -> None:
        self._inner, self._before, self._after = inner, before, after

    def produce(self, topic: str, value: Any = None, key: Any = None, **rest: Any) -> None:
        try:
            changelog = parse_record(key, value, rest.get("headers"))
        except ChangelogFormatError:  # an output record
            changelog = None
        self._before(changelog)
        self._inner.produce(topic, value, key, **rest)
        self._after(changelog)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextmanager
def hooked(history: History, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The task's producers run the history's hook, once, where it says."""
    init, commit = TaskProducer.__init__, TaskProducer.commit

    def run(producer: TaskProducer, where: str) -> None:
        hook = history.hook
        if hook is not None and hook.where == where and producer.task == TASK:
            history.hook = None
            producer._flush()
            hook.action()

    def with_hook(producer: TaskProducer, *args: Any, **kwargs: Any) -> None:
        init(producer, *args, **kwargs)

        def before(record: Any) -> None:
            if record is not None and record.kind is RecordKind.CLOSE and record.batch != 0:
                run(producer, "closer")  # a batch's closer, not a start position

        def after(record: Any) -> None:
            if record is not None and record.kind is RecordKind.MARKER:
                run(producer, "marker")

        producer._producer = HookedProducer(producer._producer, before, after)  # type: ignore[assignment]

    def with_commit_hook(
        producer: TaskProducer, changelog: Any, outputs: Any = (), also: Any = None
    ) -> dict[str, int]:
        if also is None:  # a marker's or a start position's transaction, not a batch
            return commit(producer, changelog, outputs)

        def then(kafka: Any) -> None:
            also(kafka)
            run(producer, "commit")

        return commit(producer, changelog, outputs, then)

    monkeypatch.setattr(TaskProducer, "__init__", with_hook)
    monkeypatch.setattr(TaskProducer, "commit", with_commit_hook)
    yield


STEPS: list[tuple[str, int]] = [
    ("produce", 6),
    ("feed", 8),
    ("zombies_run", 3),
    ("hand_over", 2),
    ("fail_over", 2),
    ("bump_epoch", 1),
    ("restart_in_place", 1),
    ("race", 1),
    ("straddle", 1),
    ("slot", 1),
    ("die_mid_batch", 1),
]


def run_history(
    config: WorkerConfig, seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    # Few tombstones a batch leave garbage waiting, as a busy owner's would.
    monkeypatch.setattr(instance_module, "TOMBSTONES_PER_BATCH", rng.choice([1, 2, 100]))
    steps: list[str] = []
    history = History(config, rng, steps)
    try:
        with hooked(history, monkeypatch):
            first = history.new_process()
            history.epoch = 1
            history.assign(first, 1, None)
            history.owner = first
            history.settle(first)
            names, weights = zip(*STEPS, strict=True)
            for _ in range(rng.randint(12, 24)):
                step = rng.choices(names, weights)[0]
                if step in ("hand_over", "bump_epoch") and (
                    history.owner is None or TASK not in history.owner.instance.active_tasks()
                ):
                    step = "fail_over"
                if step == "restart_in_place" and history.owner is None:
                    step = "fail_over"
                steps.append(step)
                method: Callable[..., None] = getattr(history, step)
                if step in ("feed", "zombies_run"):
                    method(monkeypatch)
                else:
                    method()
                if history.owner is not None and not history.owner.alive:
                    history.restart_in_place()
                history.check()
            history.hook = None
            history.finish(tmp_path)
    except BaseException as error:
        raise AssertionError(f"history seed {seed} failed after steps {steps}") from error
    finally:
        history.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_histories_on_a_broker_that_does_not_fence(
    embedded_kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    run_history(app_config(embedded_kafka, tmp_path), seed, tmp_path, monkeypatch)


@pytest.mark.parametrize("seed", SEEDS)
def test_histories_on_a_broker_that_fences(
    kafka_front: KafkaFront, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    run_history(app_config(kafka_front, tmp_path), 1_000 + seed, tmp_path, monkeypatch)
