"""`smoothscale dev ...`: the local control plane (API server, process kubelet, embedded Kafka)."""

import argparse
import sys

from smoothscale.cli import Subparsers


def register(subparsers: "Subparsers[argparse.ArgumentParser]") -> None:
    dev = subparsers.add_parser(
        "dev",
        help="run a local control plane: API server, process kubelet, embedded Kafka",
        description="A local Kubernetes-like control plane and Kafka for development and tests. "
        "See docs/local-control-plane.md for what it does and does not do.",
    )
    parts = dev.add_subparsers(dest="dev_command", metavar="PART", required=True)

    kafka = parts.add_parser(
        "kafka",
        help="run an embedded Kafka cluster (librdkafka's mock brokers) until SIGINT/SIGTERM",
        description="Start an embedded Kafka cluster on loopback, create the given topics, print "
        "its bootstrap servers and run until SIGINT or SIGTERM.",
    )
    kafka.add_argument(
        "--topic",
        dest="topics",
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="create this topic at start (repeatable), e.g. --topic input:8",
    )
    kafka.add_argument(
        "--brokers", type=int, default=3, help="number of brokers (default: %(default)s)"
    )
    kafka.add_argument(
        "--ready-file",
        metavar="PATH",
        help="once up, write {bootstrap_servers, pid} as JSON to this file",
    )
    kafka.set_defaults(handler=_run_kafka)


def _run_kafka(args: argparse.Namespace) -> int:
    from smoothscale.devcluster.kafka import parse_topic_spec, serve_kafka

    try:
        topics = [parse_topic_spec(text) for text in args.topics]
    except ValueError as error:
        print(f"smoothscale dev kafka: {error}", file=sys.stderr)
        return 2
    if args.brokers < 1:
        print(
            f"smoothscale dev kafka: --brokers must be at least 1, got {args.brokers}",
            file=sys.stderr,
        )
        return 2
    serve_kafka(args.brokers, topics, ready_file=args.ready_file)
    return 0
