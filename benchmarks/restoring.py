"""The restore the benchmarks time: a warm-up's restore loop (the instances' `RestoreLoop`), in
the benchmark's process, restoring tasks of an app's changelog into fresh local stores."""

import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from confluent_kafka import Consumer, TopicPartition

from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import RestoreLoop
from smoothscale.runtime.store import TaskState

CHECK_SECONDS = 1.0
"""How often the restore's errors are looked at while it runs."""


class Restore(NamedTuple):
    seconds: float
    """From following the tasks to every state in its store."""
    open_seconds: float
    """Opening the tasks' fresh local stores, before that (not in `seconds`)."""


def restore_seconds(config: WorkerConfig, store: str, tasks: list[int]) -> Restore:
    """How long a restore loop takes to restore `tasks` of `store` into fresh local stores
    (under config.state_dir), from following them to having read each changelog partition to
    the end it had when asked and written it to its store.

    The stores are opened first, as the loop and its consumer are created first, and timed on
    their own: a fresh RocksDB database takes about 10 ms to open here, nearly all of it the
    kernel creating its files, which a state of any size pays once. Until 2026-11-28 the
    restore's time included it: 0.07-0.1 s of the throughput benchmark's restore of 8 tasks
    (240,104 records, 0.4 s), where the raw consumer it is compared with was created untimed.

    The loop says when it has read them (`wait_until_read`, as an activation waits: it looks
    after each of the loop's turns). Then every task is taken from the loop, as an activation
    takes it, which writes what the loop folded and has not written yet to its store: the time
    ends when every state is in its store."""
    topic = config.changelog_topics()[store]
    consumer = Consumer(
        {"bootstrap.servers": config.bootstrap_servers, "group.id": "bench", "log_level": 3}
    )
    try:
        ends = {
            task: {store: consumer.get_watermark_offsets(TopicPartition(topic, task), 10)[1]}
            for task in tasks
        }
    finally:
        consumer.close()
    config.state_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="restore-", dir=config.state_dir) as state_dir:
        loop = RestoreLoop(config)
        loop.start()
        try:
            opening = time.perf_counter()
            states = [TaskState(Path(state_dir), task, config.stores) for task in tasks]
            began = time.perf_counter()
            for state in states:
                loop.follow(state)
            while not loop.wait_until_read(ends, CHECK_SECONDS):
                if loop.error is not None or loop.failures():
                    raise RuntimeError(f"the restore failed: {loop.error or loop.failures()}")
            handed_back = [loop.unfollow(task) for task in tasks]
            restored = Restore(time.perf_counter() - began, began - opening)
            for taken in handed_back:
                if taken is not None:
                    taken.close()
            return restored
        finally:
            loop.stop()
