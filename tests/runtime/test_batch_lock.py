"""The instance's lock keeps the next turn for a batch's committer (Instance.commit_behind):
whoever else asks for the lock meanwhile waits until the committer has held it."""

import threading
import time

from smoothscale.runtime.instance import BatchLock


def test_a_kept_turn_goes_to_its_thread_even_when_another_asks_first() -> None:
    lock = BatchLock()
    order: list[str] = []

    def take(name: str, after: float) -> None:
        time.sleep(after)
        with lock:
            order.append(name)

    lock.acquire()
    committer = threading.Thread(target=take, args=("committer", 0.3))
    committer.start()
    lock.keep_turn_for(committer)
    other = threading.Thread(target=take, args=("tick", 0.0))
    other.start()
    lock.release()  # the tick asks at once, the committer only 0.3 s later
    committer.join()
    other.join()

    assert order == ["committer", "tick"]


def test_asking_while_the_turn_is_kept_times_out_and_the_holder_reenters() -> None:
    lock = BatchLock()

    def commit() -> None:
        time.sleep(0.3)
        with lock:
            pass

    with lock:
        committer = threading.Thread(target=commit)
        committer.start()
        lock.keep_turn_for(committer)
        with lock:  # the holder itself is never kept out
            pass
    kept_out = lock.acquire(timeout=0.05)
    committer.join()
    free = lock.acquire(timeout=0.05)
    lock.release()

    assert not kept_out, "the committer had not had its turn yet"
    assert free, "once it has, the lock is anyone's"
