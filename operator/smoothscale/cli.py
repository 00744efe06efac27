"""The `smoothscale` command: one subcommand per job.

Each area of the package contributes its subcommands through a `register(subparsers)`
function in its own `cli` module, listed in `_registrars` below. Other distributions add theirs
through the entry-point group `smoothscale.commands` (each entry names a `register`): the test
bed (devstack) adds `smoothscale dev` and `smoothscale demo` that way, so the product never
imports it, and where it is not installed (the image) those commands are simply absent.
Registering must stay cheap: heavy imports (PySpark, Kafka clients) belong inside the handlers,
so `smoothscale --help` answers at once. A handler takes the parsed arguments and returns the
exit code.
"""

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from smoothscale import __version__

COMMANDS_GROUP = "smoothscale.commands"
"""The entry-point group through which other distributions add subcommands."""

# argparse has no public name for the object add_subparsers() returns.
Subparsers = argparse._SubParsersAction
Registrar = Callable[["Subparsers[argparse.ArgumentParser]"], None]


def _registrars() -> list[Registrar]:
    # One line per area; keep the imports here so a broken area names itself in the traceback.
    from smoothscale.api.cli import register as register_api
    from smoothscale.operator.cli import register as register_operator
    from smoothscale.planner.cli import register as register_plan
    from smoothscale.runtime.cli import register as register_worker

    own: list[Registrar] = [register_api, register_operator, register_plan, register_worker]
    installed = sorted(entry_points(group=COMMANDS_GROUP), key=lambda entry: entry.name)
    return own + [entry.load() for entry in installed]


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
