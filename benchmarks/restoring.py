"""The restore the benchmarks time: a warm-up's restore loop (the instances' `RestoreLoop`), in
the benchmark's process, restoring tasks of an app's changelog into fresh local stores."""

import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import RestoreLoop
from smoothscale.runtime.store import TaskState

CHECK_SECONDS = 0.005
"""How often the restore's errors (and, should no callback see the end, its read positions) are
looked at."""


def restore_seconds(config: WorkerConfig, store: str, tasks: list[int]) -> float:
    """Seconds for a restore loop to restore `tasks` of `store` into fresh local stores (under
    config.state_dir), from following them to having read each changelog partition to the end
    it had when asked.

    The loop itself says when it has read them: its callback after each chunk it applies looks
    at the read positions (until 2026-11-27 another thread looked every 5 ms, and each look made
    the loop wait for it: a ninth of the restore's time, measured). Then every task is taken
    from the loop, as an activation takes it, which writes what the loop folded and has not
    written yet to its store: the time ends when every state is in its store."""
    topic = config.changelog_topics()[store]
    consumer = Consumer(
        {"bootstrap.servers": config.bootstrap_servers, "group.id": "bench", "log_level": 3}
    )
    try:
        ends = {
            task: consumer.get_watermark_offsets(TopicPartition(topic, task), 10)[1]
            for task in tasks
        }
    finally:
        consumer.close()
    done = threading.Event()

    def read_through() -> bool:
        read = loop.read_positions()  # a task taken from the loop (below) is through
        return all(task not in read or read[task][store] >= end for task, end in ends.items())

    def on_restored(_task: int, _records: int) -> None:
        if not done.is_set() and read_through():
            done.set()

    config.state_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="restore-", dir=config.state_dir) as state_dir:
        loop = RestoreLoop(config, on_restored=on_restored)
        loop.start()
        try:
            began = time.perf_counter()
            for task in tasks:
                loop.follow(TaskState(Path(state_dir), task, config.stores))
            while not done.wait(CHECK_SECONDS):
                if loop.error is not None or loop.failures():
                    raise RuntimeError(f"the restore failed: {loop.error or loop.failures()}")
                if read_through():  # read to the end past trailing commit markers
                    break
            states = [loop.unfollow(task) for task in tasks]
            seconds = time.perf_counter() - began
            for state in states:
                if state is not None:
                    state.close()
            return seconds
        finally:
            loop.stop()
