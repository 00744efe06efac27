"""`smoothscale dev kafka`: an embedded Kafka cluster in its own process.

The clients that use it (the operator, the instances) run in other processes and reach it over
loopback TCP, as they would reach a real cluster. The process runs until SIGINT or SIGTERM.
Clients reach the brokers through the Kafka front (front.py), which answers topic
administration like a real cluster and can compact a partition on demand; the process reports
the front's bootstrap servers only. It also serves a small HTTP control endpoint on loopback
(KafkaControl is its client): create topics, take brokers down and up, inject request errors,
slow brokers down, compact a topic.
"""

import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import TextIO

from devstack.kafka.embedded import EmbeddedKafka, EmbeddedKafkaError
from devstack.kafka.front import KafkaFront, KafkaFrontError


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int


def parse_topic_spec(text: str) -> TopicSpec:
    """`NAME:PARTITIONS` (or `NAME`, one partition) -> TopicSpec."""
    name, separator, count = text.rpartition(":")
    if not separator:
        name, count = text, "1"
    if not name:
        raise ValueError(f"topic {text!r} has no name: write NAME:PARTITIONS, e.g. input:8")
    try:
        partitions = int(count)
    except ValueError:
        raise ValueError(
            f"topic {text!r}: {count!r} is not a partition count: write NAME:PARTITIONS, "
            "e.g. input:8"
        ) from None
    if partitions < 1:
        raise ValueError(f"topic {text!r}: a topic needs at least 1 partition")
    return TopicSpec(name, partitions)


def write_ready_file(path: str, bootstrap_servers: str, control_url: str) -> None:
    """Atomically write what a supervisor needs to know once the cluster is up."""
    temporary = f"{path}.tmp"
    ready = {"bootstrap_servers": bootstrap_servers, "control_url": control_url, "pid": os.getpid()}
    with open(temporary, "w") as handle:
        json.dump(ready, handle)
    os.replace(temporary, path)


class KafkaControlError(RuntimeError):
    """The embedded Kafka process refused a control request (or could not be reached)."""


# Operation name -> (what answers it: the broker or the front, its method, the method's
# arguments and their types).
_OPERATIONS: dict[str, tuple[str, str, dict[str, type | tuple[type, ...]]]] = {
    "create_topic": (
        "kafka",
        "create_topic",
        {"name": str, "partitions": int, "replication_factor": int},
    ),
    "set_broker_down": ("kafka", "set_broker_down", {"broker_id": int}),
    "set_broker_up": ("kafka", "set_broker_up", {"broker_id": int}),
    "set_rtt": ("kafka", "set_rtt", {"broker_id": int, "rtt_ms": int}),
    "push_request_errors": ("kafka", "push_request_errors", {"api_key": int, "errors": list}),
    "compact": (
        "front",
        "compact",
        {
            "topic": str,
            "partition": (int, type(None)),
            "through_offset": (int, type(None)),
            "remove_tombstones": bool,
        },
    ),
}


def _control_handler(kafka: EmbeddedKafka, front: KafkaFront) -> type[BaseHTTPRequestHandler]:
    owners: dict[str, object] = {"kafka": kafka, "front": front}

    class ControlHandler(BaseHTTPRequestHandler):
        """POST /<operation> with the operation's arguments as a JSON object."""

        def do_POST(self) -> None:
            operation = _OPERATIONS.get(self.path.strip("/"))
            if operation is None:
                self._answer(404, {"error": f"no operation {self.path}: use {sorted(_OPERATIONS)}"})
                return
            owner, method, parameters = operation
            try:
                arguments = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                if not isinstance(arguments, dict):
                    raise ValueError("the body must be a JSON object of the arguments")
                unknown = set(arguments) - set(parameters)
                if unknown:
                    raise ValueError(f"unknown arguments {sorted(unknown)}")
                wrong = [k for k, v in arguments.items() if not isinstance(v, parameters[k])]
                if wrong:
                    raise ValueError(f"wrongly typed arguments {sorted(wrong)}")
                getattr(owners[owner], method)(**arguments)
            except (ValueError, TypeError, EmbeddedKafkaError, KafkaFrontError) as error:
                self._answer(400, {"error": str(error)})
                return
            self._answer(200, {})

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            print(f"embedded Kafka control: {format % args}", flush=True)

    return ControlHandler


class KafkaControl:
    """The fault and topic controls of an embedded Kafka that runs in another process
    (`smoothscale dev kafka`), with the same methods as EmbeddedKafka."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout

    def _call(self, operation: str, **arguments: object) -> None:
        request = urllib.request.Request(
            f"{self.url}/{operation}",
            data=json.dumps(arguments).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout):
                return
        except urllib.error.HTTPError as error:
            message = json.loads(error.read() or b"{}").get("error", error.reason)
            raise KafkaControlError(f"{operation}: {message}") from None
        except OSError as error:
            raise KafkaControlError(
                f"{operation}: cannot reach the embedded Kafka at {self.url} ({error}); is "
                "`smoothscale dev kafka` running?"
            ) from None

    def create_topic(self, name: str, partitions: int, replication_factor: int = 1) -> None:
        self._call(
            "create_topic", name=name, partitions=partitions, replication_factor=replication_factor
        )

    def set_broker_down(self, broker_id: int) -> None:
        self._call("set_broker_down", broker_id=broker_id)

    def set_broker_up(self, broker_id: int) -> None:
        self._call("set_broker_up", broker_id=broker_id)

    def set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        self._call("set_rtt", broker_id=broker_id, rtt_ms=rtt_ms)

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        self._call("push_request_errors", api_key=api_key, errors=list(errors))

    def compact(
        self,
        topic: str,
        partition: int | None = None,
        through_offset: int | None = None,
        remove_tombstones: bool = False,
    ) -> None:
        """See KafkaFront.compact: later fetches read `topic` as Kafka's log cleaner leaves it."""
        self._call(
            "compact",
            topic=topic,
            partition=partition,
            through_offset=through_offset,
            remove_tombstones=remove_tombstones,
        )


def serve_kafka(
    brokers: int,
    topics: Sequence[TopicSpec],
    ready_file: str | None = None,
    control_port: int = 0,
    *,
    out: TextIO = sys.stdout,
    port: int = 0,
) -> None:
    """Run a cluster with `topics` behind the Kafka front until SIGINT/SIGTERM, then stop it
    cleanly. Clients bootstrap at 127.0.0.1:`port` (0: a free one). Its controls (topics,
    faults, compaction) answer on http://127.0.0.1:`control_port` (see KafkaControl)."""
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {
        signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with EmbeddedKafka(brokers) as kafka, KafkaFront(kafka, port=port) as front:
            for topic in topics:
                kafka.create_topic(topic.name, topic.partitions)
            control = ThreadingHTTPServer(
                ("127.0.0.1", control_port), _control_handler(kafka, front)
            )
            control_url = f"http://127.0.0.1:{control.server_address[1]}"
            threading.Thread(
                target=control.serve_forever, name="kafka-control", daemon=True
            ).start()
            try:
                print(f"embedded Kafka: {brokers} broker(s) at {front.bootstrap_servers}", file=out)
                for topic in topics:
                    print(f"  topic {topic.name}: {topic.partitions} partition(s)", file=out)
                print(f"  controls (topics, faults): {control_url}", file=out)
                print(f"export KAFKA_BOOTSTRAP={front.bootstrap_servers}", file=out, flush=True)
                if ready_file is not None:
                    write_ready_file(ready_file, front.bootstrap_servers, control_url)
                while not stop.wait(timeout=0.5):
                    pass
                print("embedded Kafka: stopping", file=out, flush=True)
            finally:
                control.shutdown()
                control.server_close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
