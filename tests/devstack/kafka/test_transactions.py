"""What the Kafka front remembers of transactions, without a broker: which offsets read_committed
readers must not get."""

from devstack.kafka.fencing import Producer
from devstack.kafka.transactions import TransactionalWrite, TransactionLog

TOPIC = "output"
OWNER, ZOMBIE = Producer(id=7, epoch=1), Producer(id=7, epoch=0)


def write(producer: Producer, offsets_taken: int) -> TransactionalWrite:
    return TransactionalWrite("task-0", producer, {(TOPIC, 0): offsets_taken})


def aborted_offsets(log: TransactionLog, offsets: range) -> list[int]:
    aborted = log.aborted(TOPIC, 0)
    return [offset for offset in offsets if offset in aborted]


def test_only_the_offsets_of_aborted_transactions_are_aborted() -> None:
    log = TransactionLog()
    log.written(write(OWNER, 3), {(TOPIC, 0): 0}, fenced=False)
    log.ended(OWNER, committed=True)
    log.written(write(OWNER, 2), {(TOPIC, 0): 4}, fenced=False)
    log.written(write(OWNER, 1), {(TOPIC, 0): 6}, fenced=False)
    assert aborted_offsets(log, range(10)) == [], "nothing is aborted while it is open"

    log.ended(OWNER, committed=False)

    assert aborted_offsets(log, range(10)) == [4, 5, 6]
    assert not log.aborted(TOPIC, 1)


def test_a_write_answered_after_its_producer_was_fenced_is_aborted_at_once() -> None:
    """The zombie's Produce reached the broker before the new producer's InitProducerId, its
    response the front after it: the transaction it belongs to is aborted already."""
    log = TransactionLog()
    log.written(write(ZOMBIE, 2), {(TOPIC, 0): 10}, fenced=True)
    assert aborted_offsets(log, range(20)) == [10, 11]


def test_a_deleted_topic_forgets_its_aborted_and_open_offsets() -> None:
    log = TransactionLog()
    log.written(write(ZOMBIE, 1), {(TOPIC, 0): 0}, fenced=True)
    log.written(write(OWNER, 1), {(TOPIC, 0): 1}, fenced=False)

    log.forget_topic(TOPIC)
    log.ended(OWNER, committed=False)

    assert not log.aborted(TOPIC, 0)
