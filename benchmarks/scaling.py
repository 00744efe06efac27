"""Availability while scaling, against what users would do instead:
`.venv/bin/python benchmarks/scaling.py`.

Not a test: it runs the same app, the same input and the same story three times in one run, on
the local control plane through the operator (as `make demo` does): a running count under
steady input, `kubectl scale` 1 -> 2, then 2 -> 1, once per `spec.scaling.strategy`:
`WarmUp` (smoothscale: warm-ups, a task moves once its new owner has caught up), `Cooperative`
(no warm-ups: a task moves once its new pod is ready and its new owner restores before it
processes, as Kafka Streams without KIP-441) and `Restart` (every pod stopped, the new count
started, every task restored before processing, as the Spark operators restart an app): the
same operator and runtime, one setting. Per strategy it reports, from the ownership timeline
the instances write into the changelogs: the longest and the 99th percentile per-partition
processing pause during the scaling, the time until balanced after each `kubectl scale`, the
records processed during the scaling, and the updates lost or applied twice (must be 0); then
each baseline's longest pause against smoothscale's. It writes the numbers as JSON, a markdown
table and a PNG of each partition's throughput over time (docs/benchmarks/ by default).
docs/benchmarks/scaling.md holds the latest results. `--protocol-worker` runs the pods without
Spark (devstack.protocolworker): a check of the benchmark itself, whose pauses say nothing of
Spark's.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from devstack.demo.scenario import (
    CHANGELOG_TOPIC,
    DemoOptions,
    Session,
    session,
)
from devstack.demo.timeline import TaskTimeline

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("WarmUp", "Cooperative", "Restart")
BIN_SECONDS = 2.0
"""The plot counts the records each partition committed per bin of this many seconds: a
partition that commits nothing in a bin (stopped) shows as 0."""


@dataclass
class Run:
    """One strategy's run: what the benchmark measured."""

    strategy: str
    marks: dict[str, float] = field(default_factory=dict)
    """Wall-clock times: scale-out / scale-in commands, and when each was balanced."""
    changelog_records: int = 0
    """Changelog records per task (the largest partition) when the scale-out began."""
    timelines: dict[int, TaskTimeline] = field(default_factory=dict)
    lost: int = 0
    doubled: int = 0
    overlaps: int = 0

    def window(self) -> tuple[float, float]:
        return self.marks["scale-out"], self.marks["end"]

    def summary(self) -> dict[str, Any]:
        start, end = self.window()
        pauses = [p for t in self.timelines.values() for p in t.pauses(start, end)]
        longest = max(pauses)
        processed = sum(t.processed(start, end) for t in self.timelines.values())
        return {
            "strategy": self.strategy,
            "max_pause_s": round(longest, 2),
            "p99_pause_s": round(_percentile(pauses, 99), 2),
            "scale_out_balanced_after_s": round(
                self.marks["scale-out balanced"] - self.marks["scale-out"], 1
            ),
            "scale_in_balanced_after_s": round(
                self.marks["scale-in balanced"] - self.marks["scale-in"], 1
            ),
            "records_processed_during_scaling": processed,
            "scaling_seconds": round(end - start, 1),
            "records_per_second_during_scaling": round(processed / (end - start)),
            "changelog_records_per_task": self.changelog_records,
            "updates_lost": self.lost,
            "updates_applied_twice": self.doubled,
            "tasks_with_two_owners_at_once": self.overlaps,
        }


def run_strategy(options: DemoOptions, story: Path) -> Run:
    """The story of `make demo`, with the strategy of `options`, measured."""
    run = Run(options.strategy)
    with story.open("w") as out, session(options, out) as running:
        watcher = running.watcher
        running.apply(replicas=1)
        watcher.run_until(lambda: watcher.settled(1), "the first instance running")
        watcher.run_until(lambda: watcher.input_lag() < options.rate * 5, "the backlog")
        running.feed.start()
        watcher.hold()
        run.changelog_records = _changelog_records(running)
        for replicas, phase in ((2, "scale-out"), (1, "scale-in")):
            run.marks[phase] = time.time()
            running.scale(replicas)
            watcher.run_until(_settled(running, replicas), phase)
            run.marks[f"{phase} balanced"] = time.time()
            watcher.hold()
        run.marks["end"] = time.time()
        running.finish()
        run.timelines = running.timelines
        run.lost, run.doubled = running.lost, running.doubled
        run.overlaps = len({o.task for t in running.timelines.values() for o in t.overlaps})
    return run


def _settled(running: Session, replicas: int) -> Callable[[], bool]:
    return lambda: running.watcher.settled(replicas)


def _changelog_records(running: Session) -> int:
    consumer = Consumer({"bootstrap.servers": running.bootstrap, "group.id": "bench"})
    try:
        return max(
            consumer.get_watermark_offsets(TopicPartition(CHANGELOG_TOPIC, task), timeout=10)[1]
            for task in range(running.options.tasks)
        )
    finally:
        consumer.close()


def _percentile(values: list[float], percent: int) -> float:
    if len(values) < 2:
        return max(values)
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def markdown(
    summaries: list[dict[str, Any]], ratios: dict[str, float], settings: dict[str, Any]
) -> str:
    rows = [
        ("longest per-partition pause", "max_pause_s", "s"),
        ("99th percentile pause", "p99_pause_s", "s"),
        ("balanced after scale-out", "scale_out_balanced_after_s", "s"),
        ("balanced after scale-in", "scale_in_balanced_after_s", "s"),
        (
            "scaling window (scale-out to the end of the steady hold after scale-in)",
            "scaling_seconds",
            "s",
        ),
        ("records processed in it", "records_processed_during_scaling", ""),
        ("records/s in it", "records_per_second_during_scaling", ""),
        ("changelog records per task at scale-out", "changelog_records_per_task", ""),
        ("updates lost / applied twice", None, ""),
    ]
    lines = ["| | " + " | ".join(s["strategy"] for s in summaries) + " |"]
    lines.append("| --- |" + " --- |" * len(summaries))
    for label, key, unit in rows:
        if key is None:
            cells = [f"{s['updates_lost']} / {s['updates_applied_twice']}" for s in summaries]
        else:
            cells = [f"{s[key]:,}{(' ' + unit) if unit else ''}" for s in summaries]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Longest pause against smoothscale's (WarmUp): "
        + ", ".join(f"{strategy} **{ratio:.1f}x**" for strategy, ratio in ratios.items())
        + "."
    )
    lines.append("")
    lines.append(
        "Settings: "
        + ", ".join(f"{key} {value}" for key, value in settings.items())
        + f"; {platform.machine()}, {_cores()} cores."
    )
    return "\n".join(lines) + "\n"


def _cores() -> int:
    return os.cpu_count() or 0


def plot(runs: list[Run], path: Path) -> None:
    """Each partition's committed records/s over time (2 s bins), one panel per strategy, the
    scaling shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), sharey=True)
    for axis, run in zip(axes, runs, strict=True):
        origin = run.marks["scale-out"] - 20
        end = run.marks["end"] + 10 - origin
        bins = [BIN_SECONDS * i for i in range(int(end / BIN_SECONDS) + 1)]
        for task, timeline in sorted(run.timelines.items()):
            committed = [0.0] * len(bins)
            pairs = list(zip(timeline.commits, timeline.positions, strict=True))
            for (_t0, p0), (t1, p1) in pairwise(pairs):
                index = int((t1 - origin) // BIN_SECONDS)
                if 0 <= index < len(bins):
                    committed[index] += (p1 - p0) / BIN_SECONDS
            axis.step(bins, committed, where="post", linewidth=0.9, label=f"partition {task}")
        for mark, style in (("scale-out", "--"), ("scale-in", ":")):
            axis.axvline(run.marks[mark] - origin, color="black", linestyle=style, label=mark)
        axis.axvspan(
            run.marks["scale-out"] - origin, run.marks["end"] - origin, color="grey", alpha=0.1
        )
        axis.set_title(f"{run.strategy}: records/s per partition (scaling shaded)")
        axis.set_xlabel("seconds")
        axis.set_ylabel("records/s")
    axes[0].legend(loc="upper right", fontsize="small", ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--backlog", type=int, default=40_000)
    parser.add_argument("--rate", type=int, default=300, help="records/s during the run")
    parser.add_argument("--hold", type=float, default=20.0, help="seconds steady between steps")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/smoothscale-bench"))
    parser.add_argument(
        "--protocol-worker",
        action="store_true",
        help="pods without Spark: checks the benchmark, measures nothing a user sees",
    )
    args = parser.parse_args()

    settings = {
        "tasks": args.tasks,
        "users": args.keys,
        "backlog": args.backlog,
        "records/s": args.rate,
        "trigger interval": "1 s",
        "lag poll": "1 s",
    }
    runs = []
    for strategy in STRATEGIES:
        workdir = args.workdir / strategy
        options = DemoOptions(
            workdir=workdir,
            tasks=args.tasks,
            keys=args.keys,
            backlog=args.backlog,
            rate=args.rate,
            hold=args.hold,
            strategy=strategy,
            examples_root=ROOT,
            spark=not args.protocol_worker,
        )
        workdir.mkdir(parents=True, exist_ok=True)
        print(f"{strategy}: running (its story is in {workdir / 'story.log'})", flush=True)
        runs.append(run_strategy(options, workdir / "story.log"))
    summaries = [run.summary() for run in runs]
    warm, *baselines = summaries
    ratios = {
        baseline["strategy"]: round(baseline["max_pause_s"] / warm["max_pause_s"], 2)
        if warm["max_pause_s"]
        else 0.0
        for baseline in baselines
    }
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"settings": settings, "strategies": summaries, "max_pause_ratios": ratios}
    (args.out / "scaling.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(summaries, ratios, settings)
    (args.out / "scaling-table.md").write_text(table)
    plot(runs, args.out / "scaling.png")
    print(table)
    exact = all(s["updates_lost"] == s["updates_applied_twice"] == 0 for s in summaries)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
