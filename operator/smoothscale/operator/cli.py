"""`smoothscale operator`: run the operator (the chart's Deployment runs exactly this).

    smoothscale operator --namespace shop [--namespace ...] | --all-namespaces
                         --standalone | --peering NAME [--priority N]
                         [--liveness URL] [--metrics-port 9090] [--instance-port 8080]
                         [--log-level info]
                         [--secret-label KEY=VALUE] [--allowed-bootstrap-server PATTERN ...]
                         [--allow-sasl-plaintext] [--allowed-ca-secret PATTERN ...]

It connects to the cluster it runs in (its service account), or to the kubeconfig's current
context outside a cluster (KUBECONFIG). The last four flags are the platform's policy for what
StreamingApps may do with credentials (smoothscale.operator.access; docs/install.md, Security).
"""

import argparse
import logging
import random
import re
from typing import TYPE_CHECKING

from smoothscale.operator.pods import BASE_PORT
from smoothscale.operator.policy import DEFAULT_SECRET_LABEL, AccessPolicy

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
    access = parser.add_argument_group(
        "what StreamingApps may do with credentials (docs/install.md, Security)"
    )
    access.add_argument(
        "--secret-label",
        type=_label,
        default=DEFAULT_SECRET_LABEL,
        metavar="KEY=VALUE",
        help="read, and let instance pods reference, only Secrets with this label (default "
        f"{'='.join(DEFAULT_SECRET_LABEL)})",
    )
    access.add_argument(
        "--allowed-bootstrap-server",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a host:port pattern (fnmatch: *, ?, [...]) of Kafka servers apps may name; repeat "
        "for more. None: apps may name any server, but only without credentials",
    )
    access.add_argument(
        "--allow-sasl-plaintext",
        action="store_true",
        help="let apps send SASL credentials over unencrypted connections (SASL_PLAINTEXT)",
    )
    access.add_argument(
        "--allowed-ca-secret",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a name pattern of Secrets apps may name as the CA of their brokers; repeat for "
        "more. None: apps may not, the image's CAs verify the brokers",
    )
    parser.set_defaults(handler=_run)


_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _label(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a label: write KEY=VALUE with a Kubernetes label key and value, "
            f"e.g. {'='.join(DEFAULT_SECRET_LABEL)}"
        )
    return key, value


def access_policy(args: argparse.Namespace) -> AccessPolicy:
    """The platform's policy, from the operator's flags."""
    return AccessPolicy(
        secret_label=args.secret_label,
        bootstrap_servers=tuple(args.allowed_bootstrap_server),
        allow_sasl_plaintext=args.allow_sasl_plaintext,
        ca_secrets=tuple(args.allowed_ca_secret),
    )


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
            memo=kopf.Memo(
                instance_port=args.instance_port,
                peering=args.peering is not None,
                policy=access_policy(args),
            ),
        )
    finally:
        server.stop()
    return 0
