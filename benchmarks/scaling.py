"""Pause against state size while scaling, smoothscale against what users would do instead:
`.venv/bin/python benchmarks/scaling.py` (`--smoke`: the small CI run).

Not a test. For each state size and each `spec.scaling.strategy` it runs the same app, the
same input and the same story on the local control plane through the operator (as `make demo`
does), each in a control plane of its own: a running count whose state per user carries a
padding of the size's bytes (examples.pipelines.padded_count: the state a task restores grows
with it), a backlog of one record per user (which builds the state), steady input over one
user per task, `kubectl scale` 1 -> 2, then 2 -> 1. The strategies: `WarmUp` (smoothscale:
warm-ups, a task moves once its new owner has caught up), `Cooperative` (no warm-ups: a task
moves once its new pod is ready, and its new owner restores before it processes, as Kafka
Streams without KIP-441) and `Restart` (every pod stopped, the new count started, every task
restored before processing, as the Spark operators restart an app).

Per strategy and size, from the ownership timeline the instances write into the changelogs:
the longest and the 99th percentile per-partition pause from scale-out to the end of the hold
after scale-in, the time until balanced after each `kubectl scale`, and the updates lost or
applied twice (must be 0). Per size: each task's changelog records and bytes when the scaling
began and at the end (the embedded broker keeps ~5 MB per partition and drops the oldest
beyond: the end's log start must be 0). The constants, measured in the same runs: the
restore rate of one task and of all tasks restored together (one pod restoring several), by
the instances' restore loop (`RestoreLoop`) in this process from the app's changelog once the
input stopped, and each pod's start to ready (its creationTimestamp to its Ready condition,
both to the second). From them, a projection of each strategy's longest pause at 1 GB and
10 GB of state per task (`projection`). It writes scaling.json, scaling-table.md,
scaling.png (pause against state size, measured and projected) and scaling-throughput.png
(each partition's throughput at the largest size) to docs/benchmarks/ by default;
docs/benchmarks/scaling.md holds the latest results. `--protocol-worker` runs the pods without
Spark (devstack.protocolworker): a check of the benchmark itself, whose pauses say nothing of
Spark's.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from examples.pipelines.padded_count import PADDING_VARIABLE
from restoring import restore_seconds

from devstack.demo.scenario import (
    APP_ID,
    CHANGELOG_TOPIC,
    INPUT_TOPIC,
    NAMESPACE,
    OUTPUT_TOPIC,
    QUIET,
    STORE,
    DemoOptions,
    Session,
    session,
)
from devstack.demo.timeline import TaskTimeline, read_committed
from smoothscale.runtime.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("WarmUp", "Cooperative", "Restart")
PIPELINE = "examples.pipelines.padded_count:pipeline"
SIZES = (0, 512, 1_536, 3_072, 5_120)
"""Padding bytes per user state. With 400 users per task, the largest is about 2.1 MB of
changelog per task from the backlog, plus one state written per second by the steady input:
under the embedded broker's ~5 MB per partition for a whole run (checked at the end)."""
SMOKE = {
    "tasks": 2,
    "keys": 200,
    "sizes": [1_024],
    "hold": 3.0,
    "rate": 20,
    "protocol_worker": True,
}
"""The CI smoke run: every strategy at one small size, on the protocol worker (no Spark)."""
PROJECTED_MB = (1_000, 10_000)
RESTORE_REPEATS = 3
BIN_SECONDS = 2.0
"""The throughput plot counts the records each partition committed per bin of this many
seconds: a partition that commits nothing in a bin (stopped) shows as 0."""
MB = 1_000_000


@dataclass
class Changelog:
    """Per task: records and bytes (keys and values) of its changelog partition, and its log
    start offset (above 0: the broker dropped its head)."""

    records: dict[int, int]
    bytes: dict[int, int]
    log_start: dict[int, int]


@dataclass
class Run:
    """One strategy's run at one state size: what the benchmark measured."""

    strategy: str
    padding: int
    marks: dict[str, float] = field(default_factory=dict)
    """Wall-clock times: scale-out / scale-in commands, and when each was balanced."""
    at_scale_out: Changelog | None = None
    at_end: Changelog | None = None
    timelines: dict[int, TaskTimeline] = field(default_factory=dict)
    pod_start_to_ready: list[float] = field(default_factory=list)
    restore: dict[str, float] = field(default_factory=dict)
    lost: int = 0
    doubled: int = 0
    overlaps: int = 0
    load: str = ""
    """The machine's load averages (1, 5, 15 min) when the run ended."""

    def window(self) -> tuple[float, float]:
        return self.marks["scale-out"], self.marks["end"]

    def summary(self) -> dict[str, Any]:
        start, end = self.window()
        pauses = [p for t in self.timelines.values() for p in t.pauses(start, end)]
        assert self.at_scale_out is not None
        assert self.at_end is not None
        return {
            "strategy": self.strategy,
            "padding_bytes": self.padding,
            "max_pause_s": round(max(pauses), 2),
            "p99_pause_s": round(_percentile(pauses, 99), 2),
            "scale_out_balanced_after_s": round(
                self.marks["scale-out balanced"] - self.marks["scale-out"], 1
            ),
            "scale_in_balanced_after_s": round(
                self.marks["scale-in balanced"] - self.marks["scale-in"], 1
            ),
            "records_processed_during_scaling": sum(
                t.processed(start, end) for t in self.timelines.values()
            ),
            "changelog_mb_per_task_at_scale_out": round(
                max(self.at_scale_out.bytes.values()) / MB, 3
            ),
            "changelog_records_per_task_at_scale_out": max(self.at_scale_out.records.values()),
            "changelog_mb_per_task_at_end": round(max(self.at_end.bytes.values()) / MB, 3),
            "changelog_log_start_at_end": max(self.at_end.log_start.values()),
            "pod_start_to_ready_s": self.pod_start_to_ready,
            "restore": self.restore,
            "updates_lost": self.lost,
            "updates_applied_twice": self.doubled,
            "tasks_with_two_owners_at_once": self.overlaps,
            "load_average": self.load,
        }


def run_strategy(options: DemoOptions, padding: int, story: Path) -> Run:
    """The story of `make demo` at one state size, with the strategy of `options`, measured."""
    run = Run(options.strategy, padding)
    pods: dict[str, dict[str, Any]] = {}
    with story.open("w") as out, session(options, out) as running:
        watcher = running.watcher
        running.apply(replicas=1)
        watcher.run_until(lambda: watcher.settled(1), "the first instance running")
        watcher.run_until(lambda: watcher.input_lag() == 0, "the backlog")
        _note_pods(running, pods)
        running.feed.start()
        watcher.hold()
        run.at_scale_out = read_changelog(running.bootstrap, options.tasks)
        for replicas, phase in ((2, "scale-out"), (1, "scale-in")):
            run.marks[phase] = time.time()
            running.scale(replicas)
            watcher.run_until(_settled(running, replicas), phase)
            run.marks[f"{phase} balanced"] = time.time()
            _note_pods(running, pods)
            watcher.hold()
        run.marks["end"] = time.time()
        running.finish()
        run.at_end = read_changelog(running.bootstrap, options.tasks)
        run.restore = measure_restore(running, options, run.at_end)
        run.timelines = running.timelines
        run.lost, run.doubled = running.lost, running.doubled
        run.overlaps = len({o.task for t in running.timelines.values() for o in t.overlaps})
    run.pod_start_to_ready = sorted(
        round(_seconds(p["ready"]) - _seconds(p["created"]), 1) for p in pods.values()
    )
    run.load = load_average()
    return run


def _settled(running: Session, replicas: int) -> Callable[[], bool]:
    return lambda: running.watcher.settled(replicas)


def _note_pods(running: Session, pods: dict[str, dict[str, Any]]) -> None:
    """Remember each ready pod of the app (by uid): when it was created, when it turned Ready."""
    listing = json.loads(running.kubectl("get", "-n", NAMESPACE, "pods", "-o", "json", quiet=True))
    for pod in listing["items"]:
        ready = [
            c["lastTransitionTime"]
            for c in pod.get("status", {}).get("conditions") or []
            if c["type"] == "Ready" and c["status"] == "True"
        ]
        if ready and pod["metadata"]["uid"] not in pods:
            created = pod["metadata"]["creationTimestamp"]
            pods[pod["metadata"]["uid"]] = {"created": created, "ready": ready[0]}


def _seconds(timestamp: str) -> float:
    return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def read_changelog(bootstrap: str, tasks: int) -> Changelog:
    """Each task's changelog partition, read to its end: records, bytes, log start."""
    records = dict.fromkeys(range(tasks), 0)
    sizes = dict.fromkeys(range(tasks), 0)
    for message in read_committed(bootstrap, CHANGELOG_TOPIC, tasks, QUIET):
        task = message.partition() or 0
        records[task] += 1
        sizes[task] += len(message.key() or b"") + len(message.value() or b"")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", **QUIET})
    try:
        starts = {
            task: consumer.get_watermark_offsets(TopicPartition(CHANGELOG_TOPIC, task), 10)[0]
            for task in range(tasks)
        }
    finally:
        consumer.close()
    return Changelog(records, sizes, starts)


def measure_restore(
    running: Session, options: DemoOptions, changelog: Changelog
) -> dict[str, float]:
    """The instances' restore loop, in this process, restoring the app's changelog into fresh
    local stores once the input stopped: task 0 alone, then every task together (what one pod
    restores at once), the median of RESTORE_REPEATS each. Records/s and MB/s (keys and
    values) of each, and the marginal rate: what every task restores beyond task 0 over the
    time it takes beyond task 0's restore. Starting a restore costs a fixed time (the
    consumer's first fetch, about 0.1 s here) that a changelog of a few MB does not outweigh:
    the marginal rate leaves it out, and it is what a larger state adds per MB."""
    config = WorkerConfig(
        app_id=APP_ID,
        instance_id="benchmark-restore",
        bootstrap_servers=running.bootstrap,
        input_topics=[INPUT_TOPIC],
        output_topic=OUTPUT_TOPIC,
        stores={STORE: None},
        pipeline=PIPELINE,
        state_dir=options.workdir / "restore",
        metrics_port=0,
    )
    measured: dict[str, float] = {}
    taken: dict[str, tuple[int, int, float]] = {}
    for name, tasks in (("one_task", [0]), ("all_tasks", list(range(options.tasks)))):
        seconds = statistics.median(
            restore_seconds(config, STORE, tasks).seconds for _ in range(RESTORE_REPEATS)
        )
        records = sum(changelog.records[t] for t in tasks)
        size = sum(changelog.bytes[t] for t in tasks)
        taken[name] = (records, size, seconds)
        measured[f"{name}_seconds"] = round(seconds, 3)
        measured[f"{name}_records_per_s"] = round(records / seconds)
        measured[f"{name}_mb_per_s"] = round(size / MB / seconds, 2)
    (one_records, one_size, one_seconds) = taken["one_task"]
    (all_records, all_size, all_seconds) = taken["all_tasks"]
    beyond = all_seconds - one_seconds
    measured["marginal_records_per_s"] = (
        round((all_records - one_records) / beyond) if beyond > 0 else 0
    )
    measured["marginal_mb_per_s"] = (
        round((all_size - one_size) / MB / beyond, 2) if beyond > 0 else 0.0
    )
    return measured


def load_average() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _percentile(values: list[float], percent: int) -> float:
    if len(values) < 2:
        return max(values)
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def aggregate(summaries: list[dict[str, Any]], tasks: int) -> dict[str, Any]:
    """The sweep's results: per size and strategy the median and worst over its runs; the
    constants; the projection."""
    sizes = sorted({s["padding_bytes"] for s in summaries})
    cells: dict[str, dict[str, Any]] = {}
    for padding in sizes:
        for strategy in STRATEGIES:
            runs = [
                s for s in summaries if s["padding_bytes"] == padding and s["strategy"] == strategy
            ]
            if not runs:
                continue
            pauses = [s["max_pause_s"] for s in runs]
            cells[f"{padding}/{strategy}"] = {
                "runs": len(runs),
                "max_pause_s_median": round(statistics.median(pauses), 2),
                "max_pause_s_worst": max(pauses),
                "p99_pause_s_median": round(statistics.median(s["p99_pause_s"] for s in runs), 2),
                "scale_out_balanced_after_s_median": round(
                    statistics.median(s["scale_out_balanced_after_s"] for s in runs), 1
                ),
                "scale_in_balanced_after_s_median": round(
                    statistics.median(s["scale_in_balanced_after_s"] for s in runs), 1
                ),
                "state_mb_per_task": round(
                    statistics.median(s["changelog_mb_per_task_at_scale_out"] for s in runs), 3
                ),
            }
    constants = measured_constants(summaries, sizes)
    return {
        "sizes": sizes,
        "cells": cells,
        "constants": constants,
        "projection": projection(cells, constants, sizes, tasks),
    }


def measured_constants(summaries: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """Per size the median restore rates over its runs; pod start to ready over every run."""
    restore: dict[str, dict[str, float]] = {}
    for padding in sizes:
        runs = [s["restore"] for s in summaries if s["padding_bytes"] == padding]
        restore[str(padding)] = {
            key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]
        }
    starts = [t for s in summaries for t in s["pod_start_to_ready_s"]]
    return {
        "restore_by_padding": restore,
        "pod_start_to_ready_s": {
            "median": round(statistics.median(starts), 1),
            "max": max(starts),
            "pods": len(starts),
        },
    }


def projection(
    cells: dict[str, dict[str, Any]], constants: dict[str, Any], sizes: list[int], tasks: int
) -> dict[str, Any]:
    """Each strategy's longest pause at PROJECTED_MB of state per task, from the measured
    constants: pause(S) = pause(smallest) + n * S / R, with n the tasks one pod restores
    before they process: Cooperative tasks / 2 (the tasks moved to or back from the second
    pod), Restart all tasks (the one pod left after scale-in), WarmUp none (a task moves once
    caught up: its pause stays one hand-over; its warm-up, and so the time until balanced,
    grows by tasks / 2 * S / R instead). R is the restore rate of one pod restoring all its
    tasks at the largest value size measured, as a range: from the whole restore's rate (its
    fixed start included: a rate too low for a large state) to the marginal rate (what the
    local changelogs, restored in a fraction of a second, let through: too uncertain to stand
    alone)."""
    largest = str(sizes[-1])
    measured = constants["restore_by_padding"][largest]
    slow, fast = measured["all_tasks_mb_per_s"], measured["marginal_mb_per_s"]
    fast = max(fast, slow)
    restoring = {"WarmUp": 0.0, "Cooperative": tasks / 2, "Restart": float(tasks)}
    projected: dict[str, Any] = {
        "formula": "pause(S) = pause at the smallest size + n * S / R",
        "restore_rate_mb_per_s": [slow, fast],
        "padding_bytes_of_the_rate": sizes[-1],
        "strategies": {},
    }

    def seconds(base: float, n: float, megabytes: float) -> list[float]:
        return [round(base + n * megabytes / rate, 1) for rate in (fast, slow)]

    for strategy, n in restoring.items():
        smallest = cells.get(f"{sizes[0]}/{strategy}")
        if smallest is None:
            continue
        base = smallest["max_pause_s_median"]
        row: dict[str, Any] = {"n": n, "base_s": base}
        largest_cell = cells.get(f"{largest}/{strategy}")
        if largest_cell is not None:
            row["at_largest_measured"] = {
                "state_mb": largest_cell["state_mb_per_task"],
                "projected_s": seconds(base, n, largest_cell["state_mb_per_task"]),
                "measured_s": largest_cell["max_pause_s_median"],
            }
        for megabytes in PROJECTED_MB:
            row[f"{megabytes}_mb_s"] = seconds(base, n, megabytes)
            if strategy == "WarmUp":
                row[f"{megabytes}_mb_warm_up_s"] = seconds(0.0, tasks / 2, megabytes)
        projected["strategies"][strategy] = row
    return projected


def markdown(results: dict[str, Any]) -> str:
    sweep = results["sweep"]
    strategies = [s for s in STRATEGIES if any(k.endswith(f"/{s}") for k in sweep["cells"])]
    lines = [
        "| state per task (changelog at scale-out) | "
        + " | ".join(f"{s}: longest / p99 pause" for s in strategies)
        + " | "
        + " | ".join(f"{s}: balanced after scale-out / in" for s in strategies)
        + " |",
        "| --- |" + " --- |" * (2 * len(strategies)),
    ]
    by_size = {s["padding_bytes"]: s for s in results["runs"]}
    for padding in sweep["sizes"]:
        first = by_size[padding]
        state = (
            f"{first['changelog_mb_per_task_at_scale_out']:.2f} MB, "
            f"{first['changelog_records_per_task_at_scale_out']:,} records "
            f"({padding:,} B padding)"
        )
        pauses, balanced = [], []
        for strategy in strategies:
            cell = sweep["cells"][f"{padding}/{strategy}"]
            pause = f"{cell['max_pause_s_median']} s"
            if cell["runs"] > 1:
                pause += f" (worst {cell['max_pause_s_worst']} s of {cell['runs']})"
            pauses.append(f"{pause} / {cell['p99_pause_s_median']} s")
            balanced.append(
                f"{cell['scale_out_balanced_after_s_median']} s / "
                f"{cell['scale_in_balanced_after_s_median']} s"
            )
        lines.append(f"| {state} | " + " | ".join(pauses + balanced) + " |")
    runs = results["runs"]
    lost = sum(s["updates_lost"] for s in runs)
    doubled = sum(s["updates_applied_twice"] for s in runs)
    overlaps = sum(s["tasks_with_two_owners_at_once"] for s in runs)
    lines += [
        "",
        f"Updates lost / applied twice over all {len(runs)} runs: {lost} / {doubled}; tasks "
        f"processed by two instances at once: {overlaps}.",
        "",
        "Changelog per task at the end of each size's runs (the broker keeps ~5 MB per "
        "partition): largest "
        + ", ".join(
            f"{padding:,} B: {_largest_at_end(runs, padding):.2f} MB" for padding in sweep["sizes"]
        )
        + "; log start offset "
        + str(max(s["changelog_log_start_at_end"] for s in runs))
        + " (0: no head dropped).",
        "",
        "Measured constants (restore: the instances' restore loop, in the benchmark's process, "
        "from the app's changelog after the input stopped; median over the size's runs):",
        "",
        "| padding per state | one task: s, records/s, MB/s | all tasks at once (one pod): "
        "s, records/s, MB/s | marginal: records/s, MB/s |",
        "| --- | --- | --- | --- |",
    ]
    constants = sweep["constants"]
    for padding, rate in constants["restore_by_padding"].items():
        lines.append(
            f"| {int(padding):,} B | {rate['one_task_seconds']}, "
            f"{rate['one_task_records_per_s']:,.0f}, {rate['one_task_mb_per_s']} | "
            f"{rate['all_tasks_seconds']}, {rate['all_tasks_records_per_s']:,.0f}, "
            f"{rate['all_tasks_mb_per_s']} | {rate['marginal_records_per_s']:,.0f}, "
            f"{rate['marginal_mb_per_s']} |"
        )
    start = constants["pod_start_to_ready_s"]
    lines += [
        "",
        f"Pod start to ready (creationTimestamp to Ready, to the second): median {start['median']}"
        f" s, longest {start['max']} s, over {start['pods']} pods.",
        "",
    ]
    projected = sweep["projection"]
    lines += [
        f"**Projection** (not measured): {projected['formula']}, with R from "
        f"{projected['restore_rate_mb_per_s'][0]} to {projected['restore_rate_mb_per_s'][1]} "
        "MB/s (one pod restoring all its tasks: the whole restore's rate to the marginal "
        f"rate, {projected['padding_bytes_of_the_rate']:,} B padding per state).",
        "",
        "| strategy | n | pause at the smallest size | largest size measured: projected / "
        "measured | 1 GB per task | 10 GB per task |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for strategy, row in projected["strategies"].items():
        check = row.get("at_largest_measured")
        checked = (
            f"{_span(check['projected_s'])} / {check['measured_s']} s ({check['state_mb']} MB)"
            if check
            else "-"
        )
        at_1gb, at_10gb = _span(row["1000_mb_s"]), _span(row["10000_mb_s"])
        if strategy == "WarmUp":
            at_1gb += f" (warm-up {_span(row['1000_mb_warm_up_s'])})"
            at_10gb += f" (warm-up {_span(row['10000_mb_warm_up_s'])})"
        lines.append(
            f"| {strategy} | {row['n']:g} | {row['base_s']} s | {checked} | {at_1gb} | {at_10gb} |"
        )
    lines += [
        "",
        "Settings: "
        + ", ".join(f"{key} {value}" for key, value in results["settings"].items())
        + f"; {platform.machine()}, {os.cpu_count()} cores.",
    ]
    return "\n".join(lines) + "\n"


def _span(seconds: list[float]) -> str:
    low, high = seconds
    return f"{low} s" if low == high else f"{low}-{high} s"


def _largest_at_end(runs: list[dict[str, Any]], padding: int) -> float:
    return max(
        float(s["changelog_mb_per_task_at_end"]) for s in runs if s["padding_bytes"] == padding
    )


def plot_pauses(results: dict[str, Any], path: Path) -> None:
    """Longest pause against state per task: measured (left), and projected to 10 GB (right,
    log-log, from the formula)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = results["sweep"]
    figure, (measured, projected) = plt.subplots(1, 2, figsize=(12, 4.5))
    for strategy in STRATEGIES:
        cells = [cell for key, cell in sweep["cells"].items() if key.split("/")[1] == strategy]
        if not cells:
            continue
        cells.sort(key=lambda c: c["state_mb_per_task"])
        sizes = [c["state_mb_per_task"] for c in cells]
        (line,) = measured.plot(
            sizes, [c["max_pause_s_median"] for c in cells], marker="o", label=f"{strategy} longest"
        )
        measured.plot(
            sizes,
            [c["p99_pause_s_median"] for c in cells],
            marker=".",
            linestyle=":",
            color=line.get_color(),
            label=f"{strategy} p99",
        )
        row = sweep["projection"]["strategies"].get(strategy)
        if row is not None:
            slow, fast = sweep["projection"]["restore_rate_mb_per_s"]
            first = max(sizes[0], 0.01)
            span = [first * (PROJECTED_MB[-1] / first) ** (i / 50) for i in range(51)]
            projected.fill_between(
                span,
                [row["base_s"] + row["n"] * s / fast for s in span],
                [row["base_s"] + row["n"] * s / slow for s in span],
                color=line.get_color(),
                alpha=0.3,
                label=f"{strategy} (projection)",
            )
            projected.plot(
                sizes, [c["max_pause_s_median"] for c in cells], "o", color=line.get_color()
            )
    measured.set_title("measured: per-partition pause while scaling 1 -> 2 -> 1")
    measured.set_xlabel("state per task (changelog MB)")
    measured.set_ylabel("seconds")
    measured.legend(fontsize="small")
    projected.set_title("PROJECTION from the measured constants (dots: measured)")
    projected.set_xscale("log")
    projected.set_yscale("log")
    projected.set_xlabel("state per task (MB)")
    projected.set_ylabel("longest pause, seconds")
    projected.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_throughput(runs: list[Run], path: Path) -> None:
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
        axis.set_title(
            f"{run.strategy}, {run.padding:,} B padding: records/s per partition (scaling shaded)"
        )
        axis.set_xlabel("seconds")
        axis.set_ylabel("records/s")
    axes[0].legend(loc="upper right", fontsize="small", ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(SIZES), help="padding bytes per user state"
    )
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--keys", type=int, default=1_600, help="users: one backlog record each")
    parser.add_argument("--rate", type=int, default=40, help="records/s of steady input")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds steady between steps")
    parser.add_argument("--repeat", type=int, default=1, help="runs per strategy and size")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/smoothscale-bench"))
    parser.add_argument(
        "--protocol-worker",
        action="store_true",
        help="pods without Spark: checks the benchmark, measures no Spark pause",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        help="a scaling.json of earlier runs (a sweep run in parts, or more runs of a cell): "
        "its runs join this one's in the results",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the CI smoke run: " + ", ".join(f"{k} {v}" for k, v in SMOKE.items()),
    )
    args = parser.parse_args()
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)

    settings = {
        "tasks": args.tasks,
        "users (one backlog record each)": args.keys,
        "steady users": args.tasks,
        "steady records/s": args.rate,
        "hold": f"{args.hold:g} s",
        "pods": "protocol worker (no Spark)" if args.protocol_worker else "Spark",
        "trigger interval": "1 s",
        "lag poll": "1 s",
    }
    began = time.monotonic()
    print(f"load before: {load_average()}", flush=True)
    runs: list[Run] = []
    for padding in args.sizes:
        for strategy in args.strategies:
            for repeat in range(args.repeat):
                workdir = args.workdir / f"{padding}" / f"{strategy}-{repeat}"
                workdir.mkdir(parents=True, exist_ok=True)
                options = DemoOptions(
                    workdir=workdir,
                    tasks=args.tasks,
                    keys=args.keys,
                    backlog=args.keys,
                    steady_keys=args.tasks,
                    rate=args.rate,
                    hold=args.hold,
                    strategy=strategy,
                    examples_root=ROOT,
                    spark=not args.protocol_worker,
                    pipeline=PIPELINE,
                    env=({"name": PADDING_VARIABLE, "value": str(padding)},),
                )
                print(
                    f"{padding:,} B padding, {strategy} run {repeat + 1}: running (its story is "
                    f"in {workdir / 'story.log'})",
                    flush=True,
                )
                run = run_strategy(options, padding, workdir / "story.log")
                runs.append(run)
                summary = run.summary()
                print(
                    f"  longest pause {summary['max_pause_s']} s, p99 {summary['p99_pause_s']} s,"
                    f" state {summary['changelog_mb_per_task_at_scale_out']} MB per task; "
                    f"{run.load}",
                    flush=True,
                )
    summaries = [run.summary() for run in runs]
    settings["duration"] = f"{(time.monotonic() - began) / 60:.0f} min"
    if args.merge is not None:
        earlier = json.loads(args.merge.read_text())
        summaries = earlier["runs"] + summaries
        settings["duration"] += f", after {earlier['settings']['duration']} in an earlier part"
    sweep = aggregate(summaries, args.tasks)
    results = {"settings": settings, "runs": summaries, "sweep": sweep}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (args.out / "scaling-table.md").write_text(table)
    plot_pauses(results, args.out / "scaling.png")
    largest = {run.strategy: run for run in reversed(runs) if run.padding == args.sizes[-1]}
    if len(largest) > 1 and args.sizes[-1] == sweep["sizes"][-1]:
        plot_throughput(list(reversed(largest.values())), args.out / "scaling-throughput.png")
    print(table)
    exact = all(
        s["updates_lost"] == s["updates_applied_twice"] == s["tasks_with_two_owners_at_once"] == 0
        for s in summaries
    )
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
