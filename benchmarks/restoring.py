"""The restore the benchmarks time: a warm-up's restore loop (the instances' `RestoreLoop`), in
the benchmark's process, restoring tasks of an app's changelog into fresh local stores."""

import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import RestoreLoop
from smoothscale.runtime.store import TaskState

POLL_SECONDS = 0.005
"""How often the restore's read positions are looked at: well under a restore of a few MB."""


def restore_seconds(config: WorkerConfig, store: str, tasks: list[int]) -> float:
    """Seconds for a restore loop to restore `tasks` of `store` into fresh local stores (under
    config.state_dir), from following them to having read each changelog partition to the end
    it had when asked."""
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
    config.state_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="restore-", dir=config.state_dir) as state_dir:
        loop = RestoreLoop(config)
        loop.start()
        try:
            began = time.perf_counter()
            for task in tasks:
                loop.follow(TaskState(Path(state_dir), task, config.stores))
            while True:
                read = loop.read_positions()
                if all(read[task][store] >= end for task, end in ends.items()):
                    return time.perf_counter() - began
                if loop.error is not None or loop.failures():
                    raise RuntimeError(f"the restore failed: {loop.error or loop.failures()}")
                time.sleep(POLL_SECONDS)
        finally:
            loop.stop()
