"""The restore the benchmarks time: a warm-up's restore loop (the instances' `RestoreLoop`), in
the benchmark's process, restoring tasks of an app's changelog into fresh local stores."""

import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import RestoreLoop
from smoothscale.runtime.store import TaskState

CHECK_SECONDS = 1.0
"""How often the restore's errors are looked at while it runs."""


def restore_seconds(config: WorkerConfig, store: str, tasks: list[int]) -> float:
    """Seconds for a restore loop to restore `tasks` of `store` into fresh local stores (under
    config.state_dir), from following them to having read each changelog partition to the end
    it had when asked.

    The loop says when it has read them (`wait_until_read`, as an activation waits: it looks
    after each of the loop's turns). Until 2026-11-28 the benchmark looked itself, from the
    loop's callback and every 50 ms, and each look took the loop's lock: a tenth of a restore
    that takes 0.4 s. Then every task is taken from the loop, as an activation takes it, which
    writes what the loop folded and has not written yet to its store: the time ends when every
    state is in its store."""
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
            began = time.perf_counter()
            for task in tasks:
                loop.follow(TaskState(Path(state_dir), task, config.stores))
            while not loop.wait_until_read(ends, CHECK_SECONDS):
                if loop.error is not None or loop.failures():
                    raise RuntimeError(f"the restore failed: {loop.error or loop.failures()}")
            states = [loop.unfollow(task) for task in tasks]
            seconds = time.perf_counter() - began
            for state in states:
                if state is not None:
                    state.close()
            return seconds
        finally:
            loop.stop()
