"""Who processed each task when, read back from the changelog the instances wrote.

Every activation starts with a marker naming its instance, and every micro-batch an active
owner commits ends with a closer, in the same transaction as the batch's state changes
(docs/runtime.md, "The changelog format"). Read in offset order, a task's changelog partition is
its ownership timeline, recorded by the instances themselves at the moment they act, durable,
and the same on the local stack and on a real cluster (as long as the log cleaner has not
compacted those records away: it never cleans a partition's active segment). From it, the
checks every scenario makes:

- **two active owners at once**: a writer that commits a batch after a higher writer's marker
  was still processing the task when the newer owner had taken it;
- **each partition's longest processing pause**: the longest time, in a window, between two
  batch commits of its owner (under steady input every batch carries records of every task).

Times are the records' timestamps (the producing instance's clock), in seconds since the epoch.
"""

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from smoothscale.runtime.changelog import ChangelogFormatError, RecordKind, parse_record
from smoothscale.runtime.writer import Writer


@dataclass
class Stint:
    """One activation of one owner (one writer) on a task."""

    instance: str
    """The instance its marker names ("?" when the marker is missing)."""
    writer: str
    epoch: int
    started: float | None
    """When its marker was written."""
    first_commit: float | None = None
    last_commit: float | None = None
    batches: int = 0


@dataclass(frozen=True)
class Overlap:
    """A batch a lower writer committed after a higher writer's marker."""

    task: int
    stale: str
    """The instance still processing."""
    newer: str
    """The instance that had taken the task over."""
    at: float
    offset: int


@dataclass
class TaskTimeline:
    task: int
    stints: list[Stint] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    """The times of the batch commits of the task's owner (the highest writer so far)."""
    positions: list[int] = field(default_factory=list)
    """The task's input position after each of those commits (summed over input topics)."""
    overlaps: list[Overlap] = field(default_factory=list)
    unreadable: int = 0
    """Records that are not smoothscale changelog records (counted, otherwise ignored)."""

    def longest_pause(self, start: float, end: float) -> float:
        """The longest time within [start, end] without a batch commit of the task."""
        return max(self.pauses(start, end))

    def pauses(self, start: float, end: float) -> list[float]:
        """The times between consecutive batch commits of the task within [start, end]."""
        times = [start, *(t for t in self.commits if start < t < end), end]
        return [later - earlier for earlier, later in pairwise(times)]

    def processed(self, start: float, end: float) -> int:
        """Input records the task's owners committed within [start, end]."""
        before = [p for t, p in zip(self.commits, self.positions, strict=True) if t <= start]
        until = [p for t, p in zip(self.commits, self.positions, strict=True) if t <= end]
        return (until[-1] if until else 0) - (before[-1] if before else 0)


def read_timelines(
    bootstrap_servers: str,
    changelog_topic: str,
    partitions: int,
    config: Mapping[str, str] | None = None,
) -> dict[int, TaskTimeline]:
    """Each task's timeline, from partition `task` of `changelog_topic`, read to its end."""
    timelines = {task: TaskTimeline(task) for task in range(partitions)}
    highest: dict[int, Writer] = {}
    stints: dict[tuple[int, Writer], Stint] = {}
    for message in read_committed(bootstrap_servers, changelog_topic, partitions, config):
        task = message.partition()
        if task is None or task not in timelines:
            continue
        timeline = timelines[task]
        try:
            record = parse_record(message.key(), message.value(), message.headers())
        except ChangelogFormatError:
            timeline.unreadable += 1
            continue
        if record.kind not in (RecordKind.MARKER, RecordKind.CLOSE):
            continue
        at = message.timestamp()[1] / 1000
        writer = record.writer
        stint = stints.get((task, writer))
        if stint is None:
            instance = "?"
            if record.kind is RecordKind.MARKER and record.value is not None:
                instance = str(json.loads(record.value).get("instance", "?"))
            stint = Stint(instance, str(writer), writer.epoch, started=None)
            stints[(task, writer)] = stint
            timeline.stints.append(stint)
        if record.kind is RecordKind.MARKER:
            stint.started = at
        newest = highest.get(task)
        if newest is None or writer > newest:
            highest[task] = newest = writer
        if record.kind is not RecordKind.CLOSE:
            continue
        stint.batches += 1
        stint.first_commit = stint.first_commit if stint.first_commit is not None else at
        stint.last_commit = at
        if writer == newest:
            timeline.commits.append(at)
            inputs = json.loads(record.value or b"{}").get("input") or {}
            timeline.positions.append(sum(int(offset) for offset in inputs.values()))
        else:
            newer = stints[(task, newest)].instance
            offset = message.offset() or 0
            timeline.overlaps.append(Overlap(task, stint.instance, newer, at, offset))
    return timelines


def write_timelines(path: Path, timelines: Mapping[int, TaskTimeline]) -> None:
    """The timelines as JSON (one object per task), for a person or a plot to read."""
    document: dict[str, Any] = {
        "tasks": [
            {
                "task": timeline.task,
                "stints": [asdict(stint) for stint in timeline.stints],
                "commits": timeline.commits,
                "positions": timeline.positions,
                "overlaps": [asdict(overlap) for overlap in timeline.overlaps],
                "unreadable": timeline.unreadable,
            }
            for _task, timeline in sorted(timelines.items())
        ]
    }
    path.write_text(json.dumps(document, indent=1) + "\n")


def read_committed(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    config: Mapping[str, str] | None = None,
) -> Iterator[Message]:
    """Every committed message of `topic`, read to the end it had when reading began, each
    partition in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "smoothscale-checker",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            **(config or {}),
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        done: set[int] = {p for p, end in ends.items() if end <= 0}
        while len(done) < partitions:
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                if message.error() is None:
                    yield message
            for position in _positions(consumer, topic, set(range(partitions)) - done):
                if position.offset >= ends[position.partition]:
                    done.add(position.partition)
    finally:
        consumer.close()


def _positions(consumer: Consumer, topic: str, partitions: Iterable[int]) -> list[TopicPartition]:
    positions: list[TopicPartition] = consumer.position(
        [TopicPartition(topic, p) for p in partitions]
    )
    return positions
