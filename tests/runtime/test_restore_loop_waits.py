"""Waiting on the restore without waiting out its consumes: `_changelog.wake` ends a read
blocked in its consume, a caller of the restore loop wakes the consume the loop holds its lock
through, and `RestoreLoop.wait_until_read` returns with the loop's turn that reads the offsets
waited for (or False once its timeout passes).

Each wait here is far shorter than what it would take without the wake-up it checks (a read or
consume of 60 s, a wait of 60 s), and far longer than it takes with it, so that only a broken
wake-up misses it."""

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from devstack.kafka.embedded import EmbeddedKafka
from smoothscale.runtime import _changelog, restore
from smoothscale.runtime._changelog import Fold
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import (
    RestoreConsumer,
    RestoreLoop,
    end_offsets,
    restore_consumer,
    restore_settings,
)
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.transactions import TaskProducer
from tests.runtime.test_transactions_and_restore import STORE, A, batch, config_on

TASK = 1
LONG = 60.0
"""The timeout of a read, consume or wait that only a wake-up may end early."""
BOUND = 10.0
"""How long a test waits for what a wake-up ends: met in well under a second when it works."""


@pytest.fixture
def config(embedded_kafka: EmbeddedKafka, tmp_path: Path) -> WorkerConfig:
    return config_on(embedded_kafka, embedded_kafka, tmp_path)


@pytest.fixture
def loop(config: WorkerConfig) -> Iterator[RestoreLoop]:
    loop = RestoreLoop(config)
    loop.start()
    try:
        yield loop
    finally:
        loop.stop()
    assert loop.error is None


def changelog_end(config: WorkerConfig) -> int:
    """The end of the task's changelog partition that a read_committed reader can reach (past
    the last commit marker): an offset the restore reads up to, and no further, until more
    records are written."""
    consumer = restore_consumer(config)
    try:
        return end_offsets(consumer, config.changelog_topics(), TASK, timeout=10)[STORE]
    finally:
        consumer.close()


class Waiter(threading.Thread):
    """Calls `wait` on a thread of its own and keeps what it returned and when it returned."""

    def __init__(self, wait: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._wait = wait
        self.result: Any = None
        self.seconds: float | None = None

    def run(self) -> None:
        started = time.monotonic()
        self.result = self._wait()
        self.seconds = time.monotonic() - started


def test_wake_ends_a_read_blocked_in_its_consume(config: WorkerConfig) -> None:
    """A read of an empty partition waits for messages up to its timeout (librdkafka returns
    only with `count` messages or at the timeout); `wake` from another thread ends it at once,
    with nothing read. The restore loop's callers rely on this to get its lock (`_held`)."""
    consumer = RestoreConsumer(restore_settings(config))
    topic = config.changelog_topics()[STORE]
    folds = {(topic, TASK): Fold()}

    def slow(*_message: Any) -> bool:
        raise AssertionError("an empty partition has no record to read")

    consumer.assign([TopicPartition(topic, TASK, 0)])
    reader = Waiter(lambda: _changelog.read(consumer.handle, 10, LONG, folds, slow))
    reader.start()
    try:
        time.sleep(0.5)
        assert reader.is_alive(), "the read returned before it was woken"
        _changelog.wake(consumer.handle)
        reader.join(timeout=BOUND)
        assert not reader.is_alive(), f"a read of {LONG} s was not woken within {BOUND} s"
        assert reader.result == (0, {}, [])
    finally:
        if not reader.is_alive():  # closing under a read still in librdkafka would crash
            consumer.close()


def test_wake_on_a_closed_consumer_does_nothing(config: WorkerConfig) -> None:
    """A caller of the loop may wake a consumer that `stop` has closed: nothing happens (no
    error, no crash), where the consumer's other functions refuse a closed consumer."""
    consumer = RestoreConsumer(restore_settings(config))
    consumer.close()
    with pytest.raises(RuntimeError, match="closed"):
        consumer.position([TopicPartition(config.changelog_topics()[STORE], TASK)])
    _changelog.wake(consumer.handle)
    _changelog.wake(consumer.handle)


def test_a_call_to_the_loop_wakes_the_consume_it_holds_the_lock_through(
    config: WorkerConfig, loop: RestoreLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop holds its lock through each consume; a caller that finds it held wakes the
    consume rather than wait it out. With consumes of 60 s on an empty changelog, a call
    still returns at once."""
    loop.follow(TaskState(config.state_dir / "standby", TASK, [STORE]))
    short = restore._CONSUME_SECONDS
    monkeypatch.setattr(restore, "_CONSUME_SECONDS", LONG)
    time.sleep(0.5)  # the loop's next turn is a consume of LONG seconds, holding the lock
    caller = Waiter(loop.positions)
    caller.start()
    try:
        caller.join(timeout=BOUND)
        assert not caller.is_alive(), f"the call waited out the loop's consume of {LONG} s"
        assert caller.result == {TASK: {STORE: 0}}
    finally:
        # Short consumes again, and one more call to wake the long one: `stop` waits for it.
        monkeypatch.setattr(restore, "_CONSUME_SECONDS", short)
        loop.tasks()


def test_wait_until_read_returns_once_the_changelog_is_read_through_the_offsets(
    config: WorkerConfig, loop: RestoreLoop
) -> None:
    """What an activation waits for: the task's changelog read through the target offsets,
    and so every batch closed before them restored."""
    owner = TaskProducer(config, task=TASK, epoch=1)
    try:
        for n in range(1, 4):
            end = owner.commit(batch(A, n, {"alice": n, f"user-{n}": 1}, n))[STORE]
    finally:
        owner.close()
    loop.follow(TaskState(config.state_dir / "warm-up", TASK, [STORE]))
    assert loop.wait_until_read({TASK: {STORE: end}}, BOUND)
    assert loop.read_positions()[TASK][STORE] >= end
    state = loop.unfollow(TASK)
    assert state is not None
    try:
        assert state.snapshot(STORE) == {"alice": 3, "user-1": 1, "user-2": 1, "user-3": 1}
    finally:
        state.close()


def test_wait_until_read_gives_up_after_its_timeout_short_of_the_offsets(
    config: WorkerConfig, loop: RestoreLoop
) -> None:
    """Offsets beyond the changelog's end are never read through: the wait returns False once
    its timeout has passed, not before; so does a wait for a task the loop does not follow."""
    owner = TaskProducer(config, task=TASK, epoch=1)
    try:
        owner.commit(batch(A, 1, {"alice": 1}, 1))
    finally:
        owner.close()
    end = changelog_end(config)
    loop.follow(TaskState(config.state_dir / "standby", TASK, [STORE]))
    assert loop.wait_until_read({TASK: {STORE: end}}, BOUND), "the loop did not read to the end"
    started = time.monotonic()
    assert not loop.wait_until_read({TASK: {STORE: end + 1}}, 0.5)
    assert time.monotonic() - started >= 0.5
    assert not loop.wait_until_read({0: {STORE: 0}}, 0.1), "task 0 is not followed"


def test_a_waiter_wakes_when_the_records_it_waits_for_arrive(
    config: WorkerConfig, loop: RestoreLoop
) -> None:
    """A wait for offsets not written yet ends with the loop's turn that reads them (the loop
    notifies its waiters after each turn), long before its timeout."""
    owner = TaskProducer(config, task=TASK, epoch=1)
    try:
        owner.commit(batch(A, 1, {"alice": 1}, 1))
        end = changelog_end(config)
        loop.follow(TaskState(config.state_dir / "standby", TASK, [STORE]))
        assert loop.wait_until_read({TASK: {STORE: end}}, BOUND)
        waiter = Waiter(lambda: loop.wait_until_read({TASK: {STORE: end + 1}}, LONG))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive(), "the wait returned before its records were written"
        assert owner.commit(batch(A, 2, {"alice": 2}, 2))[STORE] >= end + 1
    finally:
        owner.close()
    waiter.join(timeout=BOUND)
    assert not waiter.is_alive(), f"a wait of {LONG} s was not woken within {BOUND} s"
    assert waiter.result is True
    assert waiter.seconds is not None
    assert waiter.seconds < BOUND, "the wait was not ended by the records' arrival"
