"""`smoothscale demo`: scale a real stateful PySpark app out and in under steady input."""

import argparse
import sys
import tempfile
from pathlib import Path

from smoothscale.cli import Subparsers


def register(subparsers: "Subparsers[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "demo",
        help="scale a stateful PySpark app out and back in without stopping it",
        description=(
            "Starts the local control plane (API server, process kubelet, embedded Kafka), runs "
            "`smoothscale operator`, applies the running-count example StreamingApp with the "
            "real kubectl and scales it from 1 to 2 instances and back with `kubectl scale`, "
            "under steady input, printing its status and Events; then checks the final state "
            "against a reference computed from the input. Run it from the root of a checkout."
        ),
    )
    parser.add_argument("--tasks", type=int, default=6, help="input partitions (default 6)")
    parser.add_argument("--keys", type=int, default=6_000, help="distinct users (default 6000)")
    parser.add_argument(
        "--backlog",
        type=int,
        default=60_000,
        help="records produced before the app is applied (default 60000)",
    )
    parser.add_argument(
        "--rate",
        type=int,
        default=400,
        help="records per second afterwards (default 400; the embedded broker keeps 5 MB per "
        "partition, so much more makes the changelogs outgrow it: see docs/local-control-plane.md)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the control plane, the pods and the operator keep state and logs "
        "(default: a temp dir)",
    )
    parser.add_argument(
        "--examples-root",
        type=Path,
        default=Path.cwd(),
        help="the directory holding examples/ (default: the current directory)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from devstack.demo.scenario import DemoError, DemoOptions, run

    for name in ("tasks", "keys", "rate"):
        if getattr(args, name) < 1:
            print(f"smoothscale demo: --{name} must be at least 1", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="smoothscale-demo-") as scratch:
        workdir = args.workdir or Path(scratch)
        options = DemoOptions(
            workdir=workdir,
            tasks=args.tasks,
            keys=args.keys,
            backlog=max(0, args.backlog),
            rate=args.rate,
            examples_root=args.examples_root,
        )
        try:
            return run(options, sys.stdout)
        except DemoError as error:
            print(f"smoothscale demo: {error}", file=sys.stderr)
            return 1
