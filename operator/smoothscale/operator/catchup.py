"""Whether each warm-up gets closer to caught up (observed over polls; no I/O).

A warm-up whose changelog grows faster than it restores never reaches acceptableRecoveryLag:
the planner rightly never moves its task, and without a word the scaling would look stuck.
`CatchUpWatch` remembers each warm-up's lag over the last window and names the ones whose lag
did not shrink over a whole window while still above the acceptable lag. A warm-up that stops
reporting altogether (its process hung or starved) keeps its last, possibly caught-up, report:
`Heartbeats` names the instances whose reports stopped, so that their last word is not taken
for the present.
"""

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from smoothscale.kafka.progress import ReportedRole, TaskProgress
from smoothscale.tasks import TaskId

FIRST_REPORT_GRACE = timedelta(minutes=2)
"""How long an instance given tasks may take to send its first report (its process starting)."""

MIN_WINDOW = timedelta(seconds=30)
"""The shortest window judged: lag moves in steps of a micro-batch, so a short window would
name warm-ups that are merely between two restore bursts."""


@dataclass(frozen=True)
class Stalled:
    """A warm-up that did not get closer to caught up over a whole window."""

    instance: str
    task: TaskId
    lag: int
    window: timedelta


@dataclass
class CatchUpWatch:
    """Each warm-up's lag samples over the last window (`max(probingInterval, 30 s)`)."""

    _samples: dict[tuple[str, TaskId], deque[tuple[datetime, int]]] = field(default_factory=dict)

    def observe(
        self,
        progress: Mapping[tuple[str, TaskId], TaskProgress],
        acceptable_lag: int,
        window: timedelta,
        now: datetime,
    ) -> list[Stalled]:
        """Record this poll's warm-up lags; the warm-ups that did not catch up over `window`."""
        window = max(window, MIN_WINDOW)
        warmups = {
            key: item.lag
            for key, item in progress.items()
            if item.report.role is ReportedRole.WARMUP
        }
        for key in set(self._samples) - set(warmups):
            del self._samples[key]  # moved, promoted or gone: a new warm-up starts afresh
        stalled = []
        for key, lag in sorted(warmups.items()):
            samples = self._samples.setdefault(key, deque())
            samples.append((now, lag))
            while len(samples) > 1 and now - samples[1][0] >= window:
                samples.popleft()  # keep exactly one sample at least a window old
            since, then = samples[0]
            if now - since >= window and lag > acceptable_lag and lag >= then:
                stalled.append(Stalled(key[0], key[1], lag, window))
        return stalled


@dataclass
class Heartbeats:
    """When each instance's report beat last grew (see TaskReport.beat)."""

    _seen: dict[str, tuple[int | None, datetime]] = field(default_factory=dict)

    def silent(
        self,
        holding: Iterable[str],
        progress: Mapping[tuple[str, TaskId], TaskProgress],
        after: timedelta,
        now: datetime,
    ) -> set[str]:
        """Of the instances that hold something (`holding`), those whose beat has not grown
        for `after`, or that have not reported at all for max(`after`, FIRST_REPORT_GRACE)
        since they were first given something (a new pod's process may take that long to start
        on a busy node): hung, starved of CPU, or unable to reach Kafka. An instance whose
        reports carry no beat (an older version) is never judged."""
        holding = set(holding)
        for gone in set(self._seen) - holding:
            del self._seen[gone]
        beats: dict[str, int | None] = {}
        for (instance, _task), item in progress.items():
            if instance in holding:
                beat = item.report.beat
                before = beats.get(instance)
                beats[instance] = beat if before is None or beat is None else max(before, beat)
        silent = set()
        for instance in sorted(holding):
            if instance in beats and beats[instance] is None:
                continue  # reports without a beat: nothing to judge by
            beat = beats.get(instance)
            seen = self._seen.get(instance)
            if seen is None or beat != seen[0]:
                self._seen[instance] = (beat, now)
            elif now - seen[1] >= (after if beat is not None else max(after, FIRST_REPORT_GRACE)):
                silent.add(instance)
        return silent
