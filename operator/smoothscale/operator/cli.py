"""`smoothscale operator`: run the operator (the chart's Deployment runs exactly this).

    smoothscale operator --namespace shop [--namespace ...] | --all-namespaces
                         --standalone | --peering NAME [--priority N]
                         [--liveness URL] [--metrics-port 9090] [--instance-port 8080]
                         [--log-level info]

It connects to the cluster it runs in (its service account), or to the kubeconfig's current
context outside a cluster (KUBECONFIG).
"""

import argparse
import logging
import random
from typing import TYPE_CHECKING

from smoothscale.operator.pods import BASE_PORT

if TYPE_CHECKING:
    from smoothscale.cli import Subparsers


def register(subparsers: "Subparsers[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the operator: scale StreamingApps without stopping them",
        description="Watch StreamingApps and run each one's control loop: create its Kafka "
        "topics and pods, warm new instances up, hand tasks over once caught up, drain pods "
        "before deleting them, and keep its status current. See docs/architecture.md.",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        help="serve StreamingApps in this namespace (repeat for more)",
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="serve StreamingApps in every namespace"
    )
    peers = parser.add_mutually_exclusive_group()
    peers.add_argument(
        "--standalone",
        action="store_true",
        help="run alone, without kopf peering (one replica only); the default",
    )
    peers.add_argument(
        "--peering",
        metavar="NAME",
        help="coordinate with other replicas through the KopfPeering (or ClusterKopfPeering "
        "with --all-namespaces) named NAME: one works, the others wait",
    )
    parser.add_argument(
        "--priority",
        type=int,
        help="kopf peering priority: the highest-priority peer works (default: a random one, so "
        "that replicas never tie; kopf pauses every peer of a tie)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="Prometheus /metrics port (default 9090; 0 picks a free port)",
    )
    parser.add_argument(
        "--instance-port",
        type=int,
        default=BASE_PORT,
        metavar="PORT",
        help=f"instance n's pod serves /metrics and its probes on PORT + n (default {BASE_PORT})",
    )
    parser.add_argument("--log-level", default="info", help="debug, info (default), warning, error")
    parser.set_defaults(handler=_run)


def _priority(given: int | None) -> int:
    if given is not None:
        return given
    chosen = random.SystemRandom().randrange(1, 2**31)
    logging.getLogger(__name__).info("peering priority %d (random: none was given)", chosen)
    return chosen


def _run(args: argparse.Namespace) -> int:
    import kopf

    from smoothscale.operator import handlers
    from smoothscale.operator.metrics import serve_metrics

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.priority is not None and args.peering is None:
        print("smoothscale operator: --priority needs --peering NAME")
        return 2
    server = serve_metrics(handlers.METRICS, args.metrics_port)
    logging.getLogger(__name__).info("operator metrics on port %d", server.port)
    try:
        kopf.run(
            standalone=args.peering is None,
            peering_name=args.peering,
            priority=_priority(args.priority) if args.peering else 0,
            clusterwide=bool(args.all_namespaces),
            namespaces=args.namespace or (),
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(instance_port=args.instance_port, peering=args.peering is not None),
        )
    finally:
        server.stop()
    return 0
