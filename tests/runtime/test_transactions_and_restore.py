"""A task's batch commits all or nothing, and restore rebuilds exactly the committed state,
ignoring a zombie owner that the broker did not fence."""

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from devstack.kafka.embedded import EmbeddedKafka
from devstack.kafka.front import KafkaFront
from smoothscale.kafka import names
from smoothscale.runtime import restore
from smoothscale.runtime.changelog import ChangelogRecord, closer, data, marker
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import RestoreLoop, catch_up
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.transactions import (
    END_CALLS,
    CommitOutcomeUnknown,
    ProducerFenced,
    TaskProducer,
    TransactionError,
    task_client,
)
from smoothscale.runtime.writer import Writer
from tests.runtime.kafka_helpers import read_committed, unique, wait_for

STORE = "counts"


def config_on(
    kafka: EmbeddedKafka | KafkaFront, cluster: EmbeddedKafka, tmp_path: Path
) -> WorkerConfig:
    """An app of fresh topics (two partitions each), its clients on `kafka`."""
    config = WorkerConfig(
        app_id=unique("app"),
        instance_id="pod-a",
        bootstrap_servers=kafka.bootstrap_servers,
        input_topics=[unique("clicks")],
        output_topic=unique("out"),
        stores={STORE: None},
        pipeline="examples.pipelines.running_count:pipeline",
        state_dir=tmp_path / "state",
    )
    for topic in (*config.input_topics, config.output_topic, *config.changelog_topics().values()):
        cluster.create_topic(topic, 2)
    return config


@pytest.fixture
def config(embedded_kafka: EmbeddedKafka, tmp_path: Path) -> WorkerConfig:
    return config_on(embedded_kafka, embedded_kafka, tmp_path)


def batch(
    writer: Writer, number: int, counts: dict[str, int], position: int
) -> dict[str, list[ChangelogRecord]]:
    """Batch `number` of `writer` (supersedes left out: these tests reclaim nothing)."""
    records = [data(writer, number, key, value, None) for key, value in counts.items()]
    return {STORE: [*records, closer(writer, number, {"clicks": position}, None)]}


A, B = Writer(1, 0, 0), Writer(2, 1, 0)


def restored(config: WorkerConfig, task: int, directory: str) -> TaskState:
    state = TaskState(config.state_dir / directory, task, [STORE])
    catch_up(config, state, None, timeout=10)
    return state


def test_a_committed_batch_is_restored_with_its_input_position(config: WorkerConfig) -> None:
    producer = TaskProducer(config, task=1, epoch=1)
    producer.commit({STORE: [marker(A, "pod-a")]})
    positions = producer.commit(batch(A, 1, {"alice": 2, "bob": 1}, 10), outputs=[("alice", 2)])
    producer.commit(batch(A, 2, {"alice": 3}, 12), outputs=[("alice", 3)])
    producer.close()

    state = restored(config, 1, "fresh")
    try:
        assert state.snapshot(STORE) == {"alice": 3, "bob": 1}
        assert state.input_positions() == {"clicks": 12}
        assert state.epoch(STORE) == 1
        assert state.position(STORE) > positions[STORE]
    finally:
        state.close()
    outputs = read_committed(config.bootstrap_servers, config.output_topic, 2)
    assert sorted(json.loads(m.value() or b"") for m in outputs) == [2, 3]


def test_a_batch_larger_than_the_producers_queue_commits_whole(config: WorkerConfig) -> None:
    """The producer's queue holds 50 records; a batch of 300 changelog and 200 output records
    waits for room rather than failing, and every record of it is committed once."""
    small = config.model_copy(update={"kafka_config": {"queue.buffering.max.messages": 50}})
    producer = TaskProducer(small, task=0, epoch=1)
    counts = {f"user-{i:03d}": i for i in range(300)}
    outputs = [(f"user-{i:03d}", i) for i in range(200)]
    positions = producer.commit(batch(A, 1, counts, 300), outputs=outputs)
    producer.close()

    assert positions[STORE] >= 301  # 300 data records and the closer
    state = restored(config, 0, "fresh")
    try:
        assert state.snapshot(STORE) == counts
        assert state.input_positions() == {"clicks": 300}
    finally:
        state.close()
    written = read_committed(config.bootstrap_servers, config.output_topic, 2)
    assert sorted(json.loads(m.value() or b"") for m in written) == list(range(200))


def test_an_aborted_batch_leaves_no_trace(config: WorkerConfig) -> None:
    producer = TaskProducer(config, task=0, epoch=1)
    producer.commit(batch(A, 1, {"alice": 1}, 1), outputs=[("alice", 1)])

    def fail(_producer: Producer) -> None:
        raise TransactionError("the batch failed half-way")

    with pytest.raises(TransactionError):
        producer.commit(batch(A, 2, {"alice": 100}, 50), outputs=[("alice", 100)], also=fail)
    producer.close()

    state = restored(config, 0, "fresh")
    try:
        assert state.snapshot(STORE) == {"alice": 1}
        assert state.input_positions() == {"clicks": 1}
    finally:
        state.close()
    outputs = read_committed(config.bootstrap_servers, config.output_topic, 2)
    assert [json.loads(m.value() or b"") for m in outputs] == [1]


TIMEOUT = 2.0
"""The producers' timeout here: init_transactions on a fresh cluster needs it under load."""
LATER_THAN_EVERY_CALL = round((END_CALLS * TIMEOUT + 1) * 1_000)
"""An answer this many ms late comes after all END_CALLS calls of a transaction's end."""


@dataclass
class SlowableKafka:
    """A fresh embedded Kafka behind the front (which hides aborted transactions from
    read_committed readers, as Kafka does), whose brokers can be made to answer late."""

    kafka: EmbeddedKafka
    config: WorkerConfig

    def answer_late(self, rtt_ms: int) -> None:
        for broker in range(1, self.kafka.brokers + 1):
            self.kafka.set_rtt(broker, rtt_ms)

    def delivered_then_late(self, rtt_ms: int) -> Callable[[Producer], None]:
        """For `also`: deliver the transaction's records, then answer `rtt_ms` late (so that
        only the end of the transaction meets the slow brokers)."""

        def deliver(kafka: Producer) -> None:
            kafka.flush(10)
            self.answer_late(rtt_ms)

        return deliver

    def outputs(self) -> list[Any]:
        read = read_committed(self.config.bootstrap_servers, self.config.output_topic, 2)
        return [json.loads(m.value() or b"") for m in read]


@pytest.fixture
def slowable(kafka_cluster: EmbeddedKafka, tmp_path: Path) -> Iterator[SlowableKafka]:
    with KafkaFront(kafka_cluster) as front:
        yield SlowableKafka(kafka_cluster, config_on(front, kafka_cluster, tmp_path))


def test_a_commit_that_times_out_is_resumed_and_commits_once(slowable: SlowableKafka) -> None:
    """The commit's answer comes after the producer's timeout: the commit is resumed (not
    aborted, which Kafka refuses while the commit is in flight, and which would report as
    failed a batch that then commits)."""
    producer = TaskProducer(slowable.config, task=0, epoch=1, timeout=TIMEOUT)
    also = slowable.delivered_then_late(round(TIMEOUT * 1_500))
    producer.commit(batch(A, 1, {"alice": 1}, 1), [("alice", 1)], also=also)
    slowable.answer_late(0)
    producer.commit(batch(A, 2, {"alice": 2}, 2), [("alice", 2)])
    producer.close()
    assert slowable.outputs() == [1, 2]


def test_a_commit_that_does_not_finish_gives_the_task_up_to_what_the_log_says(
    slowable: SlowableKafka,
) -> None:
    producer = TaskProducer(slowable.config, task=0, epoch=1, timeout=TIMEOUT)
    started = time.monotonic()
    also = slowable.delivered_then_late(LATER_THAN_EVERY_CALL)
    with pytest.raises(CommitOutcomeUnknown) as raised:
        producer.commit(batch(A, 1, {"alice": 1}, 1), [("alice", 1)], also=also)
    assert time.monotonic() - started >= END_CALLS * TIMEOUT
    assert "only the changelog can say" in str(raised.value)
    slowable.answer_late(0)
    # It commits after the producer gave up on it: what counts is what the changelog says.
    wait_for(lambda: slowable.outputs() == [1], 15, "the transaction to commit anyway")
    state = restored(slowable.config, 0, "fresh")
    try:
        assert state.snapshot(STORE) == {"alice": 1}
    finally:
        state.close()


def test_an_abort_that_times_out_is_finished_before_the_next_transaction(
    slowable: SlowableKafka,
) -> None:
    producer = TaskProducer(slowable.config, task=0, epoch=1, timeout=TIMEOUT)
    deliver = slowable.delivered_then_late(LATER_THAN_EVERY_CALL)

    def delivered_then_failed(kafka: Producer) -> None:
        deliver(kafka)
        raise RuntimeError("the dead letters could not be queued")

    with pytest.raises(RuntimeError):
        producer.commit(batch(A, 1, {"alice": 9}, 9), [("alice", 9)], also=delivered_then_failed)
    slowable.answer_late(0)
    producer.commit(batch(A, 1, {"alice": 1}, 1), [("alice", 1)])
    producer.close()
    assert slowable.outputs() == [1]


def test_a_client_made_ahead_fences_the_owner_only_once_its_producer_is_initialised(
    kafka_cluster: EmbeddedKafka, tmp_path: Path
) -> None:
    """An instance makes a task's producer client while the task warms up there, long before
    it is given the task: meanwhile the owner commits as before, and only the producer
    initialised on that client fences it (Kafka's fencing, through the front)."""
    with KafkaFront(kafka_cluster) as front:
        config = config_on(front, kafka_cluster, tmp_path)
        owner = TaskProducer(config, task=0, epoch=1)
        client = task_client(config, 0)
        time.sleep(1)  # connected, as a warm-up's client is by its activation
        owner.commit(batch(A, 1, {"alice": 1}, 1))
        successor = TaskProducer(config, task=0, epoch=2, client=client)
        with pytest.raises(ProducerFenced):
            owner.commit(batch(A, 2, {"alice": 2}, 2))
        successor.commit({STORE: [marker(B, "pod-b")]})
        successor.close()
        state = restored(config, 0, "fresh")
    try:
        assert state.snapshot(STORE) == {"alice": 1}
        assert state.epoch(STORE) == 2
    finally:
        state.close()


def test_restore_ignores_an_unfenced_zombie_after_the_new_owners_marker(
    config: WorkerConfig,
) -> None:
    old_owner = TaskProducer(config, task=0, epoch=1)
    old_owner.commit(batch(A, 1, {"alice": 5}, 5))
    new_owner = TaskProducer(config, task=0, epoch=2)
    new_owner.commit({STORE: [marker(B, "pod-b")]})
    # The mock broker does not fence: the old owner's next commit succeeds.
    old_owner.commit(batch(A, 2, {"alice": 6}, 6))
    new_owner.commit(batch(B, 1, {"alice": 7}, 7))
    old_owner.close()
    new_owner.close()

    state = restored(config, 0, "fresh")
    try:
        assert state.snapshot(STORE) == {"alice": 7}
        assert state.input_positions() == {"clicks": 7}
        assert state.epoch(STORE) == 2
    finally:
        state.close()


@pytest.mark.parametrize("write_behind", [restore.WRITE_BEHIND_BYTES, 1], ids=["default", "tiny"])
def test_the_restore_loop_follows_a_task_while_its_owner_writes(
    config: WorkerConfig, write_behind: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny write-behind budget writes after every chunk: the same state either way."""
    monkeypatch.setattr(restore, "WRITE_BEHIND_BYTES", write_behind)
    owner = TaskProducer(config, task=1, epoch=1)
    owner.commit(batch(A, 1, {"alice": 1}, 1))
    restored_records: list[int] = []
    lock = threading.Lock()

    def on_restored(task: int, count: int) -> None:
        with lock:
            restored_records.append(count)

    loop = RestoreLoop(config, on_restored)
    loop.start()
    try:
        loop.follow(TaskState(config.state_dir / "standby", 1, [STORE]))
        for n in range(2, 30):
            owner.commit(batch(A, n, {"alice": n}, n))
        end = owner.commit(batch(A, 30, {"bob": 1}, 30))[STORE]
        wait_for(lambda: loop.positions()[1][STORE] >= end, 10, "the standby to catch up")
        state = loop.unfollow(1)
        assert state is not None
        try:
            assert state.snapshot(STORE) == {"alice": 29, "bob": 1}
            assert state.input_positions() == {"clicks": 30}
        finally:
            state.close()
        assert loop.tasks() == set()
        assert sum(restored_records) >= 2 * 30
        assert loop.error is None
    finally:
        owner.close()
        loop.stop()


def test_a_restore_loop_started_before_its_changelog_exists_restores_it(
    embedded_kafka: EmbeddedKafka, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop asks for its changelog topics' metadata as it starts; a topic not created yet
    is learnt when its first task is followed, and restores the same."""
    monkeypatch.setattr(restore, "_METADATA_SECONDS", 1.0)
    config = config_on(embedded_kafka, embedded_kafka, tmp_path)
    missing = config.model_copy(update={"app_id": unique("late")})
    loop = RestoreLoop(missing)
    loop.start()
    try:
        for topic in missing.changelog_topics().values():
            embedded_kafka.create_topic(topic, 2)
        owner = TaskProducer(missing, task=1, epoch=1)
        try:
            for n in range(1, 4):
                end = owner.commit(batch(A, n, {"alice": n, f"user-{n}": 1}, n))[STORE]
        finally:
            owner.close()
        loop.follow(TaskState(missing.state_dir / "warm-up", 1, [STORE]))
        assert loop.wait_until_read({1: {STORE: end}}, 20)
        state = loop.unfollow(1)
        assert state is not None
        try:
            assert state.snapshot(STORE) == {"alice": 3, "user-1": 1, "user-2": 1, "user-3": 1}
        finally:
            state.close()
        assert loop.error is None
        assert loop.failures() == {}
    finally:
        loop.stop()


def test_a_stopped_restore_loop_leaves_what_it_restored_in_the_store(config: WorkerConfig) -> None:
    owner = TaskProducer(config, task=0, epoch=1)
    loop = RestoreLoop(config)
    loop.start()
    try:
        loop.follow(TaskState(config.state_dir / "warm-up", 0, [STORE]))
        for n in range(1, 20):
            end = owner.commit(batch(A, n, {"alice": n, f"user-{n}": 1}, n))[STORE]
        wait_for(lambda: loop.positions()[0][STORE] >= end, 10, "the warm-up to catch up")
    finally:
        owner.close()
        loop.stop()
    state = TaskState(config.state_dir / "warm-up", 0, [STORE])
    try:
        assert state.position(STORE) >= end
        assert state.snapshot(STORE) == {"alice": 19} | {f"user-{n}": 1 for n in range(1, 20)}
        assert state.input_positions() == {"clicks": 19}
    finally:
        state.close()


def test_a_task_behind_is_written_to_its_store_once_read_to_the_changelog_end(
    config: WorkerConfig,
) -> None:
    """The restore folds a task's changelog until it has read to the end its fetches saw, and
    writes it then: alice, changed in every batch, reaches the store once, at its last value."""
    owner = TaskProducer(config, task=0, epoch=1)
    try:
        for n in range(1, 11):
            end = owner.commit(batch(A, n, {"alice": n}, n))[STORE]
    finally:
        owner.close()
    applier = restore._Applier(config.changelog_topics())
    consumer = restore.RestoreConsumer(restore.restore_settings(config))
    state = TaskState(config.state_dir / "warm-up", 0, [STORE])
    states = {0: state}
    try:
        applier.follow(state)
        consumer.assign(applier.partitions(state))
        read: list[int] = []
        while state.position(STORE) < end:  # a read may stop before the last commit marker
            assert len(read) < 100, f"never written, read to {read}"
            applier.read(consumer, states, 3, 1.0)
            applier.write_caught_up(consumer, states)
            read.append(applier.read_to(state)[STORE])
            if applier.read_to(state)[STORE] < end:
                assert state.position(STORE) == 0, f"written while behind, at {read}"
        assert len(read) > 1, "read in several chunks"
        assert state.position(STORE) >= end
        assert state.snapshot(STORE) == {"alice": 10}
        assert state.input_positions() == {"clicks": 10}
    finally:
        consumer.close()
        state.close()


def test_transactional_ids_are_per_task() -> None:
    assert names.transactional_id("shop.counter", 3) == "shop.counter-task-3"
