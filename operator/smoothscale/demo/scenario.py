"""The scaling demo: a stateful PySpark app scaled out and back in under steady input.

Everything in it is real except Kubernetes: an embedded Kafka-protocol broker (librdkafka's mock
cluster), real `smoothscale worker` instances (each a Spark driver running the running-count
example pipeline), and the operator's own decision logic (the planner and the hand-over
sequencing) polling real changelog lag and writing real assignments. Instances are local
processes instead of pods until the operator's reconcile loop lands.

The story it prints:
1. One instance owns every task and processes a backlog, then steady input.
2. Scale out to two: the new instance warms up the tasks it will own while the first keeps
   processing them; each task moves only once its warm-up is caught up, in a hand-over that
   stops it for about one micro-batch.
3. Scale back in to one: the leaving instance's tasks warm up on the one that stays, move
   back, and only then is the leaving instance stopped.
4. The input stops; the final counts are checked against a reference computed from the input.
"""

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from smoothscale.demo.instances import LocalInstances
from smoothscale.kafka import names
from smoothscale.kafka.assignments import AssignmentWriter
from smoothscale.kafka.embedded import EmbeddedKafka
from smoothscale.kafka.progress import InputPositionCommitter, ProgressReader
from smoothscale.operator.handover import InstanceStatus, Ledger, Observation, Step, step
from smoothscale.planner.model import PlannerConfig
from smoothscale.runtime.config import WorkerConfig
from smoothscale.tasks import TaskRole

APP_ID = "demo.counts"
INPUT_TOPIC = "demo-clicks"
OUTPUT_TOPIC = "demo-click-counts"
STORE = "counts"
PIPELINE = "examples.pipelines.running_count:pipeline"
QUIET = {"log.connection.close": "false"}
"""The embedded broker goes away with the demo: its clients need not log that it did."""


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path
    tasks: int = 6
    keys: int = 20_000
    backlog: int = 200_000
    """Records produced before the first instance starts: the state to restore later."""
    rate: int = 2_000
    """Records per second produced during the demo."""
    trigger_interval: float = 1.0
    poll_interval: float = 1.0
    acceptable_recovery_lag: int = 10_000
    max_warmup_replicas: int = 2
    hold: float = 15.0
    """Seconds each replica count runs in steady state before the next change."""
    phase_timeout: float = 600.0
    examples_root: Path = field(default_factory=Path.cwd)
    """The directory that holds examples/ (the pipeline's package)."""


class DemoError(RuntimeError):
    """The demo could not go on; the message says why and where to look."""


class InputFeed:
    """Steady input: `rate` records per second, cycling over `keys` users."""

    def __init__(self, bootstrap_servers: str, keys: int, rate: int) -> None:
        self._producer = Producer(
            {"bootstrap.servers": bootstrap_servers, "linger.ms": 20, **QUIET}
        )
        self._keys = keys
        self._rate = rate
        self._sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="input-feed", daemon=True)

    def backlog(self, records: int) -> None:
        for _ in range(records):
            self._send()
        self._producer.flush(60)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        """Stop producing; how many records were sent in all."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._producer.flush(60)
        return self._sent

    def _send(self) -> None:
        user = f"user-{self._sent % self._keys}"
        while True:
            try:
                self._producer.produce(INPUT_TOPIC, key=user, value=json.dumps({"user": user}))
                break
            except BufferError:
                self._producer.poll(0.05)
        self._sent += 1

    def _run(self) -> None:
        tick = 0.05
        per_tick = max(1, round(self._rate * tick))
        while not self._stop.wait(tick):
            for _ in range(per_tick):
                self._send()
            self._producer.poll(0)


@dataclass
class PauseMeter:
    """How long each input partition went without progress while it had input waiting."""

    since: dict[int, float] = field(default_factory=dict)
    position: dict[int, int] = field(default_factory=dict)
    longest: dict[int, float] = field(default_factory=dict)

    def observe(self, now: float, committed: dict[int, int], ends: dict[int, int]) -> None:
        for partition, end in ends.items():
            position = committed.get(partition, -1)
            if position != self.position.get(partition) or position >= end:
                self.position[partition] = position
                self.since[partition] = now
            stalled = now - self.since.setdefault(partition, now)
            self.longest[partition] = max(self.longest.get(partition, 0.0), stalled)

    def reset(self, now: float) -> None:
        """Start a new phase: a stall that began before it counts from `now`."""
        self.longest.clear()
        self.since = dict.fromkeys(self.since, now)


class LocalConductor:
    """The operator's observe -> plan -> act loop, over local instances instead of pods."""

    def __init__(
        self,
        options: DemoOptions,
        kafka: EmbeddedKafka,
        instances: LocalInstances,
        say: Callable[[str], None],
    ) -> None:
        self.options = options
        self.instances = instances
        self.say = say
        self.config = PlannerConfig(
            acceptable_recovery_lag=options.acceptable_recovery_lag,
            max_warmup_replicas=options.max_warmup_replicas,
        )
        changelogs = {STORE: names.changelog_topic(APP_ID, STORE)}
        servers = kafka.bootstrap_servers
        self.writer = AssignmentWriter(servers, APP_ID, QUIET)
        self.reader = ProgressReader(servers, APP_ID, changelogs, QUIET)
        self.inputs = InputPositionCommitter(servers, APP_ID, QUIET)
        self._ends = Consumer({"bootstrap.servers": servers, "group.id": APP_ID, **QUIET})
        self.ledger = Ledger()
        self.draining: set[str] = set()
        self.pauses = PauseMeter()
        self.started = time.monotonic()

    def close(self) -> None:
        self.writer.close()
        self.reader.close()
        self.inputs.close()
        self._ends.close()

    def poll(self) -> Step:
        running = {i: inst for i, inst in self.instances.running.items() if inst.alive()}
        for gone in set(self.instances.running) - set(running):
            log = self.instances.running[gone].log_path
            raise DemoError(f"instance {gone} exited unexpectedly; its log is {log}")
        statuses = {
            i: InstanceStatus(ready=inst.ready(), draining=i in self.draining)
            for i, inst in running.items()
        }
        progress = self.reader.read(statuses, self.options.tasks)
        result = step(self.ledger, Observation(statuses, progress), self.options.tasks, self.config)
        for instance_id, assignment in result.writes.items():
            self.writer.write(instance_id, assignment)
        for instance_id in result.forget:
            self.writer.forget(instance_id)
            self.reader.forget(instance_id)
        self.ledger = result.ledger
        for event in result.events:
            self.say(event)
        for instance_id in result.drained:
            self.say(f"{instance_id} holds nothing any more: stopping it")
            self.instances.stop(instance_id, grace=30)
            self.draining.discard(instance_id)
        self._measure_pauses()
        return result

    def input_lag(self) -> int:
        committed, ends = self._input_positions()
        return sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())

    def _input_positions(self) -> tuple[dict[int, int], dict[int, int]]:
        committed: dict[int, int] = {}
        ends: dict[int, int] = {}
        for partition in range(self.options.tasks):
            position = self.inputs.committed([INPUT_TOPIC], partition).get(INPUT_TOPIC)
            if position is not None:
                committed[partition] = position
            _low, ends[partition] = self._ends.get_watermark_offsets(
                TopicPartition(INPUT_TOPIC, partition), timeout=10
            )
        return committed, ends

    def _measure_pauses(self) -> None:
        committed, ends = self._input_positions()
        self.pauses.observe(time.monotonic(), committed, ends)

    def settled(self, result: Step) -> bool:
        busy = any(o.handover for o in self.ledger.tasks.values()) or any(
            a.tasks_in(TaskRole.WARMUP) for a in self.ledger.assignments.values()
        )
        return not (busy or result.writes or result.plan.moves or result.drained)

    def run_until(self, done: Callable[[Step], bool], what: str) -> None:
        deadline = time.monotonic() + self.options.phase_timeout
        last_status = 0.0
        while True:
            result = self.poll()
            if done(result):
                return
            now = time.monotonic()
            if now - last_status >= 5:
                self.say(self.describe())
                last_status = now
            if now > deadline:
                raise DemoError(f"{what} did not happen within {self.options.phase_timeout} s")
            time.sleep(self.options.poll_interval)

    def hold(self) -> None:
        """Keep polling for `options.hold` seconds (the app runs at this replica count)."""
        until = time.monotonic() + self.options.hold
        self.run_until(lambda _r: time.monotonic() >= until, "holding steady")

    def describe(self) -> str:
        parts = []
        for instance_id, assignment in sorted(self.ledger.assignments.items()):
            actives = sorted(assignment.tasks_in(TaskRole.ACTIVE))
            warming = [
                f"{t} (lag {self._lag(instance_id, t)})"
                for t in sorted(assignment.tasks_in(TaskRole.WARMUP))
            ]
            text = f"{instance_id}: active {actives or '-'}"
            if warming:
                text += f", warm-up {', '.join(warming)}"
            parts.append(text)
        handovers = [t for t, o in sorted(self.ledger.tasks.items()) if o.handover]
        if handovers:
            parts.append(f"releasing {handovers}")
        return " | ".join(parts) + f" | input lag {self.input_lag():,}"

    def _lag(self, instance_id: str, task: int) -> str:
        progress = self.reader.read([instance_id], self.options.tasks).get((instance_id, task))
        return "unknown" if progress is None else f"{progress.lag:,}"


def read_final_counts(bootstrap_servers: str, tasks: int) -> tuple[dict[str, int], dict[str, int]]:
    """(reference counts from the input, latest counts the app emitted), both read to the end."""
    reference: dict[str, int] = {}
    for _key, value in _read_all(bootstrap_servers, INPUT_TOPIC, tasks):
        user = json.loads(value)["user"]
        reference[user] = reference.get(user, 0) + 1
    emitted: dict[str, int] = {}
    for key, value in _read_all(bootstrap_servers, OUTPUT_TOPIC, tasks):
        emitted[key.decode()] = json.loads(value)
    return reference, emitted


def _read_all(bootstrap_servers: str, topic: str, partitions: int) -> Iterable[tuple[bytes, bytes]]:
    """Every committed record of `topic` as (key, value), each partition in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "demo-verifier",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        assigned = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        consumer.assign(assigned)
        done: set[int] = {p for p, end in ends.items() if end == 0}
        while len(done) < partitions:
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                key, value = message.key(), message.value()
                if message.error() is None and key is not None and value is not None:
                    yield key, value
            for position in consumer.position(
                [TopicPartition(topic, p) for p in range(partitions) if p not in done]
            ):
                if position.offset >= ends[position.partition]:
                    done.add(position.partition)
    finally:
        consumer.close()


def run(options: DemoOptions, out: TextIO) -> int:
    """Run the demo, printing the story to `out`; 0 when the final state is exact."""
    started = time.monotonic()

    def say(text: str) -> None:
        out.write(f"[{time.monotonic() - started:6.1f}s] {text}\n")
        out.flush()

    pipeline_package = options.examples_root / "examples" / "pipelines"
    if not pipeline_package.is_dir():
        raise DemoError(
            f"the example pipelines are not in {options.examples_root}/examples: run the demo "
            "from the root of a smoothscale checkout, or pass --examples-root"
        )
    with EmbeddedKafka(brokers=1) as kafka:
        # Every client lives in _on_cluster's frame, so all are gone before the broker is.
        return _on_cluster(options, kafka, say)


def _on_cluster(options: DemoOptions, kafka: EmbeddedKafka, say: Callable[[str], None]) -> int:
    changelog = names.changelog_topic(APP_ID, STORE)
    for topic in (INPUT_TOPIC, OUTPUT_TOPIC, changelog):
        kafka.create_topic(topic, options.tasks)
    kafka.create_topic(names.assignments_topic(APP_ID), 1)
    kafka.create_topic(names.dead_letter_topic(APP_ID), 1)
    say(f"embedded Kafka at {kafka.bootstrap_servers}; {options.tasks} tasks")

    feed = InputFeed(kafka.bootstrap_servers, options.keys, options.rate)
    feed.backlog(options.backlog)
    say(f"produced a backlog of {options.backlog:,} records over {options.keys:,} users")

    base = WorkerConfig(
        app_id=APP_ID,
        instance_id="template",
        bootstrap_servers=kafka.bootstrap_servers,
        input_topics=[INPUT_TOPIC],
        output_topic=OUTPUT_TOPIC,
        stores={STORE: None},
        pipeline=PIPELINE,
        trigger_interval=options.trigger_interval,
        state_dir=options.workdir,
    )
    instances = LocalInstances(
        base, options.workdir, {"PYTHONPATH": str(options.examples_root.resolve())}
    )
    conductor = LocalConductor(options, kafka, instances, say)
    try:
        return _story(options, kafka, feed, conductor, say)
    finally:
        feed.stop()
        instances.stop_all(grace=30)
        conductor.close()


def _story(
    options: DemoOptions,
    kafka: EmbeddedKafka,
    feed: InputFeed,
    conductor: LocalConductor,
    say: Callable[[str], None],
) -> int:
    instances = conductor.instances
    say("replicas 1: starting instance-0 (a Spark driver; it takes a few seconds)")
    instances.start("instance-0")
    conductor.run_until(lambda _r: instances.running["instance-0"].ready(), "instance-0 ready")
    conductor.run_until(
        lambda r: conductor.settled(r) and conductor.input_lag() < options.rate * 5,
        "instance-0 catching up with the backlog",
    )
    feed.start()
    say(f"steady input: {options.rate:,} records/s. {conductor.describe()}")
    conductor.hold()

    say("replicas 2: starting instance-1; it warms up before it takes anything over")
    conductor.pauses.reset(time.monotonic())
    instances.start("instance-1")
    conductor.run_until(lambda _r: "instance-1" in conductor.ledger.assignments, "instance-1 up")
    conductor.run_until(conductor.settled, "scale-out to 2")
    say(f"scaled out. {conductor.describe()}")
    conductor.hold()  # the moved tasks' first batches on their new owner fall in this phase
    scale_out_pause = max(conductor.pauses.longest.values(), default=0.0)

    say("replicas 1: instance-1 drains; its tasks warm up on instance-0 before they move back")
    conductor.pauses.reset(time.monotonic())
    conductor.draining.add("instance-1")
    conductor.run_until(lambda _r: "instance-1" not in instances.running, "scale-in to 1")
    conductor.run_until(conductor.settled, "scale-in settling")
    say(f"scaled in. {conductor.describe()}")
    conductor.hold()
    scale_in_pause = max(conductor.pauses.longest.values(), default=0.0)

    sent = feed.stop()
    say(f"input stopped after {sent:,} records; waiting for the last ones to be processed")
    conductor.run_until(lambda _r: conductor.input_lag() == 0, "processing the last records")
    reference, emitted = read_final_counts(kafka.bootstrap_servers, options.tasks)
    lost = sum(max(0, n - emitted.get(user, 0)) for user, n in reference.items())
    doubled = sum(max(0, emitted.get(user, 0) - n) for user, n in reference.items())
    unknown = set(emitted) - set(reference)
    say(
        f"longest stop of any partition: scale-out {scale_out_pause:.1f} s, "
        f"scale-in {scale_in_pause:.1f} s (trigger interval {options.trigger_interval} s, "
        f"poll interval {options.poll_interval} s)"
    )
    exact = lost == 0 and doubled == 0 and not unknown
    say(
        f"final state: {len(reference):,} users, {sum(reference.values()):,} records; "
        f"{lost} updates lost, {doubled} applied twice: " + ("EXACT" if exact else "NOT EXACT")
    )
    return 0 if exact else 1
