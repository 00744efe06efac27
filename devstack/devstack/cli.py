"""`smoothscale dev ...`: the local control plane (API server, scheduler, controllers, process
kubelets, embedded Kafka)."""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from smoothscale.cli import Subparsers

if TYPE_CHECKING:
    from smoothscale.kubeapi import KubeApi

DEV_KAFKA_PORT = 9092
"""Where `dev up`'s Kafka takes clients by default: Kafka's own port, which the local manifests
under examples/local name."""
_STATE_DIR_HELP = (
    "where logs, pids, the kubeconfig and pod directories live "
    "(default: $SMOOTHSCALE_DEV_DIR or .smoothscale/dev)"
)


def register(subparsers: "Subparsers[argparse.ArgumentParser]") -> None:
    dev = subparsers.add_parser(
        "dev",
        help="run a local control plane: API server, process kubelet, embedded Kafka",
        description="A local Kubernetes-like control plane and Kafka for development and tests. "
        "See docs/local-control-plane.md for what it does and does not do.",
    )
    parts = dev.add_subparsers(dest="dev_command", metavar="PART", required=True)
    _register_up(parts)
    _register_down(parts)
    _register_status(parts)
    _register_apiserver(parts)
    _register_kubelet(parts)
    _register_scheduler(parts)
    _register_controllers(parts)
    _register_kafka(parts)
    _register_topic(parts)
    _register_produce(parts)


def _topic_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topic",
        dest="topics",
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="create this Kafka topic at start (repeatable), e.g. --topic input:8",
    )
    parser.add_argument(
        "--brokers", type=int, default=3, help="number of Kafka brokers (default: %(default)s)"
    )


def _kubeconfig_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="the cluster to serve (default: $KUBECONFIG, then ~/.kube/config)",
    )


def _register_up(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    up = parts.add_parser(
        "up",
        help="start the API server, the scheduler, the controllers, a kubelet per node and "
        "Kafka in the background",
        description="Start the local API server, the scheduler, the controllers, a process "
        "kubelet per node and an embedded Kafka as background processes, install the CRDs, "
        "write a kubeconfig and print how to use them. Stop them with `smoothscale dev down`.",
    )
    up.add_argument("--state-dir", type=Path, help=_STATE_DIR_HELP)
    up.add_argument(
        "--crds",
        type=Path,
        metavar="DIR",
        help="install the CRDs in the YAML files of this directory instead of smoothscale's "
        "own (default: the StreamingApp CRD, generated from the models)",
    )
    up.add_argument("--api-port", type=int, default=0, help="API server port (default: a free one)")
    up.add_argument(
        "--kafka-port",
        type=int,
        default=DEV_KAFKA_PORT,
        help="port Kafka's clients bootstrap at, the brokers on it and the next ones (default: "
        "%(default)s, which the examples' local manifests name; 0: free ones)",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="number of nodes, each a process kubelet on this machine: 'local', 'local-2', ... "
        "(default: %(default)s)",
    )
    _topic_arguments(up)
    up.set_defaults(handler=_run_up)


def _register_down(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    down = parts.add_parser(
        "down",
        help="stop what `smoothscale dev up` started",
        description="Stop the kubelet (and its pods), Kafka and the API server started by "
        "`smoothscale dev up`: SIGTERM, then SIGKILL. Does nothing when nothing runs.",
    )
    down.add_argument("--state-dir", type=Path, help=_STATE_DIR_HELP)
    down.set_defaults(handler=_run_down)


def _register_status(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    status = parts.add_parser(
        "status",
        help="say whether the local control plane runs, and how to use it",
        description="Print the exports for the running local control plane (exit code 0), or "
        "say that it does not run (exit code 1).",
    )
    status.add_argument("--state-dir", type=Path, help=_STATE_DIR_HELP)
    status.set_defaults(handler=_run_status)


def _register_apiserver(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    apiserver = parts.add_parser(
        "apiserver",
        help="run the local Kubernetes API server until SIGINT/SIGTERM",
        description="Serve a local, in-memory Kubernetes API on loopback until SIGINT or "
        "SIGTERM; prints its URL once serving.",
    )
    apiserver.add_argument("--host", default="127.0.0.1", help="address (default: %(default)s)")
    apiserver.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    apiserver.add_argument(
        "--crds",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="load the CRDs in this YAML file or directory at start (repeatable)",
    )
    apiserver.add_argument(
        "--audit-log",
        type=Path,
        metavar="PATH",
        help="append an audit.k8s.io/v1 Event per authorization decision on a ServiceAccount's "
        "request to this file (JSON lines)",
    )
    apiserver.add_argument(
        "--kubelet-root",
        type=Path,
        metavar="DIR",
        help="the kubelets' pod directories, whose container logs pods/log serves "
        "(`kubectl logs`); without it pods/log refuses",
    )
    apiserver.set_defaults(handler=_run_apiserver)


def _register_kubelet(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    kubelet = parts.add_parser(
        "kubelet",
        help="run the process kubelet (pods as local processes) until SIGINT/SIGTERM",
        description="Run the pods bound to one node (and, unless --no-bind, bind unscheduled "
        "ones to it) as local processes, and report their status, until SIGINT or SIGTERM.",
    )
    _kubeconfig_argument(kubelet)
    kubelet.add_argument("--node-name", default="local", help="node name (default: %(default)s)")
    kubelet.add_argument(
        "--root",
        type=Path,
        default=Path(".smoothscale/kubelet"),
        help="pod working directories and logs go here (default: %(default)s)",
    )
    kubelet.add_argument(
        "--no-bind",
        dest="bind",
        action="store_false",
        help="leave pods without a node to a scheduler (`smoothscale dev scheduler`) instead of "
        "binding them to this node",
    )
    kubelet.add_argument(
        "--shutdown-grace-period",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="when the kubelet stops, each pod gets its own grace period but no more than this "
        "(a kubelet's shutdownGracePeriod; 0: its processes are killed; default: %(default)s)",
    )
    kubelet.set_defaults(handler=_run_kubelet)


def _register_scheduler(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    scheduler = parts.add_parser(
        "scheduler",
        help="run the scheduler (binds pods to nodes) until SIGINT/SIGTERM",
        description="Bind each pod without a node to a Ready, schedulable node that it "
        "tolerates and whose labels match its nodeSelector, the one with the fewest pods; leave "
        "it Pending with PodScheduled False and a FailedScheduling event when none fits; until "
        "SIGINT or SIGTERM.",
    )
    _kubeconfig_argument(scheduler)
    scheduler.set_defaults(handler=_run_scheduler)


def _register_controllers(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    controllers = parts.add_parser(
        "controllers",
        help="run the Deployment, ReplicaSet and disruption controllers until SIGINT/SIGTERM",
        description="Run each Deployment's pods through a ReplicaSet per pod template (rolling "
        "them when the template changes) and keep their status, and keep each "
        "PodDisruptionBudget's status, until SIGINT or SIGTERM.",
    )
    _kubeconfig_argument(controllers)
    controllers.set_defaults(handler=_run_controllers)


def _register_kafka(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    kafka = parts.add_parser(
        "kafka",
        help="run an embedded Kafka cluster (librdkafka's mock brokers behind the Kafka front) "
        "until SIGINT/SIGTERM",
        description="Start an embedded Kafka cluster on loopback behind the Kafka front (which "
        "answers topic administration like a real cluster), create the given topics, print the "
        "front's bootstrap servers and run until SIGINT or SIGTERM.",
    )
    _topic_arguments(kafka)
    kafka.add_argument(
        "--ready-file",
        metavar="PATH",
        help="once up, write {bootstrap_servers, control_url, pid} as JSON to this file",
    )
    kafka.add_argument(
        "--port",
        type=int,
        default=0,
        help="port clients bootstrap at; the brokers listen on it and the next ones "
        "(default: free ones)",
    )
    kafka.add_argument(
        "--control-port",
        type=int,
        default=0,
        help="port of the HTTP control endpoint (topics, faults, compaction) (default: a free one)",
    )
    kafka.set_defaults(handler=_run_kafka)


def _register_topic(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    topic = parts.add_parser(
        "topic",
        help="create Kafka topics in the running local control plane",
        description="Create topics in the embedded Kafka of `smoothscale dev up` (a shortcut "
        "for the Kafka admin API, which its front also answers).",
    )
    topic.add_argument("topics", nargs="+", metavar="NAME:PARTITIONS", help="e.g. input:8")
    topic.add_argument("--state-dir", type=Path, help=_STATE_DIR_HELP)
    topic.set_defaults(handler=_run_topic)


def _fail(command: str, message: object) -> int:
    print(f"smoothscale dev {command}: {message}", file=sys.stderr)
    return 2


def _state_dir(args: argparse.Namespace) -> Path:
    from devstack.stack import default_state_dir

    return Path(args.state_dir) if args.state_dir is not None else default_state_dir()


def _run_up(args: argparse.Namespace) -> int:
    from devstack.kafka.control import parse_topic_spec
    from devstack.stack import StackError, up

    try:
        topics = [parse_topic_spec(text) for text in args.topics]
    except ValueError as error:
        return _fail("up", error)
    if args.brokers < 1:
        return _fail("up", f"--brokers must be at least 1, got {args.brokers}")
    if args.nodes < 1:
        return _fail("up", f"--nodes must be at least 1, got {args.nodes}")
    if args.crds is not None and not args.crds.is_dir():
        return _fail("up", f"--crds {args.crds}: no such directory")
    try:
        info = up(
            _state_dir(args),
            crd_dir=args.crds,
            topics=topics,
            brokers=args.brokers,
            api_port=args.api_port,
            kafka_port=args.kafka_port,
            nodes=args.nodes,
        )
    except StackError as error:
        return _fail("up", error)
    print(f"Local control plane up (state in {info.state_dir}):")
    print(f"  API server  {info.api_url}")
    print(f"  Kafka       {info.kafka_bootstrap}")
    print(
        f"  (Kafka controls: {info.kafka_control}; topics: smoothscale dev topic NAME:PARTITIONS)"
    )
    nodes = ", ".join(f"'{node}'" for node in info.nodes)
    print(
        f"  kubelets    {'nodes' if len(info.nodes) > 1 else 'node'} {nodes}: pods run as "
        "local processes on this machine"
    )
    print("  scheduler   binds pods to nodes")
    print("  controllers Deployments and ReplicaSets run their pods; PodDisruptionBudgets")
    print("Use it from this shell with:")
    print(info.exports())
    print("Stop it with: smoothscale dev down" + _state_dir_option(args))
    return 0


def _state_dir_option(args: argparse.Namespace) -> str:
    return "" if args.state_dir is None else f" --state-dir {args.state_dir}"


def _run_down(args: argparse.Namespace) -> int:
    from devstack.stack import down

    stopped = down(_state_dir(args))
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _run_status(args: argparse.Namespace) -> int:
    from devstack.stack import info_of

    info = info_of(_state_dir(args))
    if info is None:
        print("the local control plane does not run (start it with `smoothscale dev up`)")
        return 1
    print(info.exports())
    return 0


def _run_apiserver(args: argparse.Namespace) -> int:
    from devstack.apiserver import serve_forever

    crd_files: list[Path] = []
    for path in args.crds:
        if path.is_dir():
            crd_files += sorted(path.glob("*.yaml"))
        elif path.is_file():
            crd_files.append(path)
        else:
            return _fail("apiserver", f"--crds {path}: no such file or directory")
    serve_forever(
        args.host, args.port, crd_files, audit_log=args.audit_log, kubelet_root=args.kubelet_root
    )
    return 0


class _Client(Protocol):
    """A part that runs as a client of the API on threads of its own."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def _run_client(
    part: str,
    kubeconfig: Path | None,
    make: "Callable[[KubeApi], _Client]",
    banner: str,
    start_failure: str = "cannot start",
) -> int:
    """Run the kubelet, the scheduler or the controllers until SIGINT or SIGTERM."""
    import logging
    import signal
    import threading

    from smoothscale.kubeapi import KubeApi, KubeApiError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        api = KubeApi.from_kubeconfig(kubeconfig)
    except Exception as error:  # the kubernetes package raises several kinds for a bad config
        return _fail(part, f"cannot load the kubeconfig: {error}")
    client = make(api)
    try:
        client.start()
    except KubeApiError as error:
        api.close()
        return _fail(part, f"{start_failure}: {error}")
    print(banner, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        client.stop()
        api.close()
    return 0


def _run_kubelet(args: argparse.Namespace) -> int:
    from devstack.kubelet import Kubelet, KubeletConfig

    config = KubeletConfig(
        node_name=args.node_name,
        root=args.root.resolve(),
        shutdown_grace_seconds=args.shutdown_grace_period,
        bind_unscheduled=args.bind,
    )
    return _run_client(
        "kubelet",
        args.kubeconfig,
        lambda api: Kubelet(api, config),
        f"kubelet: serving node {args.node_name}, pods under {args.root}",
        start_failure=f"cannot register node {args.node_name}",
    )


def _run_scheduler(args: argparse.Namespace) -> int:
    from devstack.scheduler import Scheduler

    return _run_client("scheduler", args.kubeconfig, Scheduler, "scheduler: binding pods to nodes")


def _run_controllers(args: argparse.Namespace) -> int:
    from devstack.controllers import ControllerManager

    return _run_client(
        "controllers",
        args.kubeconfig,
        ControllerManager,
        "controllers: Deployments, ReplicaSets, PodDisruptionBudgets",
    )


def _run_kafka(args: argparse.Namespace) -> int:
    from devstack.kafka.control import parse_topic_spec, serve_kafka

    try:
        topics = [parse_topic_spec(text) for text in args.topics]
    except ValueError as error:
        return _fail("kafka", error)
    if args.brokers < 1:
        return _fail("kafka", f"--brokers must be at least 1, got {args.brokers}")
    serve_kafka(
        args.brokers,
        topics,
        ready_file=args.ready_file,
        control_port=args.control_port,
        port=args.port,
    )
    return 0


def _register_produce(parts: "Subparsers[argparse.ArgumentParser]") -> None:
    produce = parts.add_parser(
        "produce",
        help="produce the lines of stdin as records to a topic of the running local Kafka",
        description="Produce each line of stdin as one record's value to a topic of the "
        "embedded Kafka of `smoothscale dev up`, as kafka-console-producer does.",
    )
    produce.add_argument("topic", metavar="TOPIC")
    produce.add_argument(
        "--key-field",
        metavar="FIELD",
        help="each line is a JSON object: key its record by this field (a key's records all "
        "go to one partition, as the example pipelines want)",
    )
    produce.add_argument("--state-dir", type=Path, help=_STATE_DIR_HELP)
    produce.set_defaults(handler=_run_produce)


def _run_produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, Producer

    from devstack.stack import info_of

    info = info_of(_state_dir(args))
    if info is None:
        return _fail("produce", "the local control plane does not run: start it with `dev up`")
    records: list[tuple[bytes | None, bytes]] = []
    for number, line in enumerate(sys.stdin, start=1):
        value = line.rstrip("\n")
        if not value:
            continue
        key = None
        if args.key_field is not None:
            try:
                key = str(json.loads(value)[args.key_field]).encode()
            except (ValueError, TypeError, KeyError):
                return _fail(
                    "produce",
                    f"line {number} is not a JSON object with a field {args.key_field!r}: "
                    f"{value[:80]!r} (nothing was produced)",
                )
        records.append((key, value.encode()))
    producer = Producer({"bootstrap.servers": info.kafka_bootstrap})
    try:
        for key, value in records:
            producer.produce(args.topic, value=value, key=key)
            producer.poll(0)
        left = producer.flush(30)
    except KafkaException as error:
        return _fail("produce", f"topic {args.topic}: {error}")
    if left:
        return _fail("produce", f"{left} of {len(records)} records not acknowledged within 30 s")
    print(f"produced {len(records)} records to {args.topic}")
    return 0


def _run_topic(args: argparse.Namespace) -> int:
    from devstack.kafka.control import KafkaControl, KafkaControlError, parse_topic_spec
    from devstack.stack import info_of

    try:
        topics = [parse_topic_spec(text) for text in args.topics]
    except ValueError as error:
        return _fail("topic", error)
    info = info_of(_state_dir(args))
    if info is None:
        return _fail("topic", "the local control plane does not run: start it with `dev up`")
    control = KafkaControl(info.kafka_control)
    for topic in topics:
        try:
            control.create_topic(topic.name, topic.partitions)
        except KafkaControlError as error:
            return _fail("topic", error)
        print(f"created topic {topic.name} ({topic.partitions} partitions)")
    return 0
