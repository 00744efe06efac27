"""The `smoothscale` command: one subcommand per job.

Each area of the package contributes its subcommands through a `register(subparsers)`
function in its own `cli` module, listed in `_registrars` below. Registering must stay cheap:
heavy imports (PySpark, Kafka clients) belong inside the handlers, so `smoothscale --help`
answers at once. A handler takes the parsed arguments and returns the exit code.
"""

import argparse
import sys
from collections.abc import Callable, Sequence

from smoothscale import __version__

# argparse has no public name for the object add_subparsers() returns.
Subparsers = argparse._SubParsersAction
Registrar = Callable[["Subparsers[argparse.ArgumentParser]"], None]


def _registrars() -> list[Registrar]:
    # One line per area; keep the imports here so a broken area names itself in the traceback.
    from smoothscale.api.cli import register as register_api
    from smoothscale.demo.cli import register as register_demo
    from smoothscale.devcluster.cli import register as register_dev
    from smoothscale.operator.cli import register as register_operator
    from smoothscale.planner.cli import register as register_plan
    from smoothscale.runtime.cli import register as register_worker

    return [
        register_api,
        register_demo,
        register_dev,
        register_operator,
        register_plan,
        register_worker,
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smoothscale",
        description="Scale stateful Spark streaming apps on Kubernetes without stopping them.",
    )
    parser.add_argument("--version", action="version", version=f"smoothscale {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _registrars():
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_code: int = args.handler(args)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
