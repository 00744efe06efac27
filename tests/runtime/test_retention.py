"""A changelog whose records were deleted (retention, DeleteRecords) below the position a state
needs fails that task with an error the user sees; the state is never restored from the log
start as if nothing were missing."""

from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devstack.kafka.front import KafkaFront
from smoothscale.runtime.changelog import marker
from smoothscale.runtime.config import WorkerConfig
from smoothscale.runtime.restore import ChangelogUnusableError, RestoreLoop, catch_up
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.transactions import TaskProducer
from smoothscale.runtime.writer import Writer
from tests.runtime.kafka_helpers import unique, wait_for
from tests.runtime.test_transactions_and_restore import STORE, batch

TASK = 1
OWNER = Writer(1, 0, 0)


def app_on(front: KafkaFront, state_dir: Path, **kafka_config: str) -> WorkerConfig:
    config = WorkerConfig(
        app_id=unique("app"),
        instance_id="pod-b",
        bootstrap_servers=front.bootstrap_servers,
        kafka_config=kafka_config,
        input_topics=[unique("clicks")],
        output_topic=unique("out"),
        stores={STORE: None},
        pipeline="examples.pipelines.running_count:pipeline",
        state_dir=state_dir,
    )
    for topic in (*config.input_topics, config.output_topic, *config.changelog_topics().values()):
        front.kafka.create_topic(topic, 2)
    return config


def write_batches(config: WorkerConfig, first: int, count: int, keys: int = 5) -> None:
    """Batches `first`.. `first + count - 1` of the owner, each updating `keys` keys."""
    producer = TaskProducer(config, task=TASK, epoch=1)
    if first == 1:
        producer.commit({STORE: [marker(OWNER, "pod-a")]})
    for number in range(first, first + count):
        counts = {f"user-{key}": number for key in range(keys)}
        producer.commit(batch(OWNER, number, counts, number))
    producer.close()


def delete_records_before(
    config: WorkerConfig, offset: int, admin: AdminClient | None = None
) -> int:
    """Delete the task's changelog records below `offset` (-1: all), as retention does; the
    new log start offset."""
    admin = admin or AdminClient({"bootstrap.servers": config.bootstrap_servers})
    topic = config.changelog_topics()[STORE]
    futures = admin.delete_records([TopicPartition(topic, TASK, offset)], request_timeout=10)
    (deleted,) = [future.result(timeout=10) for future in futures.values()]
    low_watermark: int = deleted.low_watermark
    return low_watermark


def test_a_restore_from_an_empty_store_refuses_a_changelog_that_lost_its_head(
    kafka_front: KafkaFront, tmp_path: Path
) -> None:
    config = app_on(kafka_front, tmp_path)
    write_batches(config, 1, 5)
    log_start = delete_records_before(config, 4)
    assert log_start == 4

    state = TaskState(tmp_path / "fresh", TASK, [STORE])
    with pytest.raises(ChangelogUnusableError, match="retention deleted changelog records"):
        catch_up(config, state, None, timeout=10)
    assert state.snapshot(STORE) == {}, "nothing restored from the log start"
    state.close()


def test_a_store_that_falls_behind_the_log_start_is_not_caught_up_past_the_gap(
    kafka_front: KafkaFront, tmp_path: Path
) -> None:
    config = app_on(kafka_front, tmp_path)
    write_batches(config, 1, 3)
    state = TaskState(tmp_path / "standby", TASK, [STORE])
    catch_up(config, state, None, timeout=10)
    behind = state.position(STORE)
    write_batches(config, 4, 3)
    delete_records_before(config, -1)

    with pytest.raises(ChangelogUnusableError, match=f"needs it from offset {behind}"):
        catch_up(config, state, None, timeout=10)
    assert state.position(STORE) == behind
    assert state.snapshot(STORE) == {f"user-{key}": 3 for key in range(5)}
    state.close()


def test_records_deleted_under_a_running_restore_fail_its_task(
    kafka_front: KafkaFront, tmp_path: Path
) -> None:
    # Small fetches make the restore take many round trips (one transaction each), and the
    # admin client is connected before it starts: the deletion lands in the middle.
    config = app_on(kafka_front, tmp_path, **{"max.partition.fetch.bytes": "512"})
    write_batches(config, 1, 1000, keys=20)
    admin = AdminClient({"bootstrap.servers": config.bootstrap_servers})
    admin.list_topics(timeout=10)
    loop = RestoreLoop(config)
    loop.start()
    state = TaskState(tmp_path / "warm-up", TASK, [STORE])
    try:
        loop.follow(state)
        log_start = delete_records_before(config, -1, admin)
        wait_for(lambda: TASK in loop.failures(), 30, "the task to fail")
        assert "retention deleted changelog records" in loop.failures()[TASK]
        assert loop.positions()[TASK][STORE] < log_start, "no record past the gap was applied"
        assert loop.error is None, "the other tasks' restore goes on"
    finally:
        loop.stop()
