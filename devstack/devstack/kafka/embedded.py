"""An embedded Kafka cluster for tests and the local control plane.

No Apache Kafka distribution is reachable from where this project is built and tested, but the
librdkafka shipped inside the confluent-kafka wheel contains a mock cluster: real Kafka-protocol
brokers listening on loopback TCP, run by a thread inside the process that creates them. This
module drives it through ctypes. Any Kafka client (in this process or another) reaches it through
`bootstrap_servers`.

What the mock does not do (see docs/local-control-plane.md): it does not fence a zombie
transactional producer, `send_offsets_to_transaction` does not store group offsets, and the admin
API cannot create topics (create them here, with `create_topic`; a topic nobody created is
auto-created with 4 partitions on first use).
"""

import ctypes
import functools
import glob
import os
import socket
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

_RD_KAFKA_PRODUCER = 0
_RD_KAFKA_CONF_OK = 0
_ERRSTR_SIZE = 512
_WAKE_SECONDS = 0.005
"""How often a request to the mock cluster's thread that is not served yet wakes it (`_served`)."""


class EmbeddedKafkaError(RuntimeError):
    """The mock cluster refused an operation (its message names librdkafka's error)."""


def librdkafka_path() -> str:
    """The librdkafka shared library bundled with the installed confluent-kafka wheel."""
    import confluent_kafka

    package_dir = os.path.dirname(os.path.abspath(confluent_kafka.__file__))
    libs_dir = os.path.join(os.path.dirname(package_dir), "confluent_kafka.libs")
    candidates = sorted(glob.glob(os.path.join(libs_dir, "librdkafka*.so*")))
    if not candidates:
        raise EmbeddedKafkaError(
            f"no librdkafka shared library in {libs_dir}: the embedded Kafka needs the "
            "confluent-kafka binary wheel (pip install --only-binary confluent-kafka "
            "confluent-kafka), not a build against a system librdkafka"
        )
    return candidates[0]


@functools.cache
def _load_library() -> ctypes.CDLL:
    """librdkafka with the signatures of the functions used here (loaded once)."""
    lib = ctypes.CDLL(librdkafka_path())
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_new.argtypes = []
    lib.rd_kafka_conf_set.restype = ctypes.c_int
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_conf_destroy.restype = None
    lib.rd_kafka_conf_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_destroy.restype = None
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.restype = None
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_delete.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_delete.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    for name in ("rd_kafka_mock_broker_set_down", "rd_kafka_mock_broker_set_up"):
        function = getattr(lib, name)
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_broker_set_rtt.restype = ctypes.c_int
    lib.rd_kafka_mock_broker_set_rtt.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int,
    ]
    lib.rd_kafka_mock_push_request_errors_array.restype = None
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int16,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int),
    ]
    return lib


class EmbeddedKafka:
    """A librdkafka mock cluster of `brokers` brokers, inside this process, on loopback TCP.

    Brokers are numbered 1..brokers. Use it as a context manager, or call `close()`.
    """

    def __init__(self, brokers: int = 3) -> None:
        if brokers < 1:
            raise ValueError(f"an embedded Kafka cluster needs at least 1 broker, got {brokers}")
        self.brokers = brokers
        self._lib = _load_library()
        self._lock = threading.Lock()
        self._handle: int | None = None
        self._cluster: int | None = None
        self._handle = self._new_producer_handle()
        cluster = self._lib.rd_kafka_mock_cluster_new(self._handle, brokers)
        if not cluster:
            self._lib.rd_kafka_destroy(self._handle)
            self._handle = None
            raise EmbeddedKafkaError(
                f"librdkafka could not start a mock cluster of {brokers} brokers "
                "(no free loopback port?)"
            )
        self._cluster = cluster
        bootstraps: bytes = self._lib.rd_kafka_mock_cluster_bootstraps(cluster)
        self.bootstrap_servers: str = bootstraps.decode()

    def _new_producer_handle(self) -> int:
        """A client handle the mock cluster hangs off; it never connects anywhere."""
        errstr = ctypes.create_string_buffer(_ERRSTR_SIZE)
        conf = self._lib.rd_kafka_conf_new()
        # Only errors: the handle has no bootstrap servers on purpose, and says so at notice level.
        result = self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, _ERRSTR_SIZE)
        if result != _RD_KAFKA_CONF_OK:
            self._lib.rd_kafka_conf_destroy(conf)
            raise EmbeddedKafkaError(f"librdkafka refused log_level: {errstr.value.decode()}")
        # rd_kafka_new takes ownership of conf when it succeeds.
        handle = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, _ERRSTR_SIZE)
        if not handle:
            self._lib.rd_kafka_conf_destroy(conf)
            raise EmbeddedKafkaError(
                f"librdkafka could not create a client handle: {errstr.value.decode()}"
            )
        return int(handle)

    def _live_cluster(self) -> int:
        if self._cluster is None:
            raise EmbeddedKafkaError("the embedded Kafka cluster is closed")
        return self._cluster

    def _served(self, request: Callable[[int], int]) -> int:
        """`request(cluster)`'s result: a request the mock cluster's thread serves (creating a
        topic, taking a broker down), made on a thread of its own while this one wakes the
        mock's thread until it is served.

        The mock's thread serves requests each time its poll of the brokers' sockets returns; a
        request wakes that poll through a pipe, but some found it not woken and waited out the
        poll's timeout, a whole second when no client keeps one of the mock's timers running:
        8 of the 61 topics three test files created took 1.0 s each (2026-11-28), 8 of the
        files' 37 s. A connection to a broker's listener wakes the poll: with one every 5 ms
        while a request waits, the 61 took 0.11 s in all."""
        cluster = self._live_cluster()
        result: list[int] = []
        worker = threading.Thread(
            target=lambda: result.append(request(cluster)), name="mock-request", daemon=True
        )
        worker.start()
        worker.join(_WAKE_SECONDS)
        while worker.is_alive():
            self._wake()
            worker.join(_WAKE_SECONDS)
        if not result:
            raise EmbeddedKafkaError("the request to the embedded Kafka cluster failed")
        return result[0]

    def _wake(self) -> None:
        """Make the mock's thread's poll return: connect to each broker's listener (a broker
        that is down refuses; one that is up is enough)."""
        for address in self.bootstrap_servers.split(","):
            host, port = address.rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), timeout=0.1).close()
            except OSError:
                continue

    def _check(self, error_code: int, what: str) -> None:
        if error_code != 0:
            message = self._lib.rd_kafka_err2str(error_code).decode()
            raise EmbeddedKafkaError(f"{what}: {message} (librdkafka error {error_code})")

    def _check_broker(self, broker_id: int) -> None:
        if not 1 <= broker_id <= self.brokers:
            raise EmbeddedKafkaError(
                f"no broker {broker_id}: this cluster's brokers are 1..{self.brokers}"
            )

    def create_topic(self, name: str, partitions: int, replication_factor: int = 1) -> None:
        """Create topic `name` with `partitions` partitions; it must not exist yet."""
        if partitions < 1:
            raise ValueError(f"topic {name!r} needs at least 1 partition, got {partitions}")
        if not 1 <= replication_factor <= self.brokers:
            raise ValueError(
                f"topic {name!r}: replication factor {replication_factor} is not between 1 and "
                f"the {self.brokers} brokers of this cluster"
            )
        with self._lock:
            error_code = self._served(
                lambda cluster: self._lib.rd_kafka_mock_topic_create(
                    cluster, name.encode(), partitions, replication_factor
                )
            )
        self._check(error_code, f"cannot create topic {name!r}")

    def delete_topic(self, name: str) -> None:
        """Delete topic `name` and its records; it must exist."""
        with self._lock:
            error_code = self._served(
                lambda cluster: self._lib.rd_kafka_mock_topic_delete(cluster, name.encode())
            )
        self._check(error_code, f"cannot delete topic {name!r}")

    def set_broker_down(self, broker_id: int) -> None:
        """Close broker `broker_id`'s connections and refuse new ones until `set_broker_up`."""
        self._check_broker(broker_id)
        with self._lock:
            error_code = self._served(
                lambda cluster: self._lib.rd_kafka_mock_broker_set_down(cluster, broker_id)
            )
        self._check(error_code, f"cannot take broker {broker_id} down")

    def set_broker_up(self, broker_id: int) -> None:
        """Let broker `broker_id` accept connections again."""
        self._check_broker(broker_id)
        with self._lock:
            error_code = self._served(
                lambda cluster: self._lib.rd_kafka_mock_broker_set_up(cluster, broker_id)
            )
        self._check(error_code, f"cannot bring broker {broker_id} up")

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """Answer the next `len(errors)` requests of Kafka API `api_key` with these error codes.

        The codes are Kafka protocol error codes (confluent_kafka.KafkaError values), one per
        request, in order; 0 lets that request through.
        """
        codes = (ctypes.c_int * len(errors))(*errors)
        with self._lock:
            self._lib.rd_kafka_mock_push_request_errors_array(
                self._live_cluster(), api_key, len(errors), codes
            )

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response of broker `broker_id` by `rtt_ms` milliseconds (0 = no delay)."""
        self._check_broker(broker_id)
        if rtt_ms < 0:
            raise ValueError(f"a round-trip time cannot be negative, got {rtt_ms} ms")
        with self._lock:
            error_code = self._served(
                lambda cluster: self._lib.rd_kafka_mock_broker_set_rtt(cluster, broker_id, rtt_ms)
            )
        self._check(error_code, f"cannot set broker {broker_id}'s round-trip time")

    def close(self) -> None:
        """Stop the brokers and free the cluster; calling it again does nothing."""
        with self._lock:
            if self._cluster is not None:
                self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
                self._cluster = None
            if self._handle is not None:
                self._lib.rd_kafka_destroy(self._handle)
                self._handle = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._cluster is None else self.bootstrap_servers
        return f"EmbeddedKafka(brokers={self.brokers}, {state})"
