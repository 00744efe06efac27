"""`smoothscale worker [--config PATH]`: run one instance of a StreamingApp (the pod's command)."""

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from smoothscale.runtime.config import CONFIG_ENV, INSTANCE_ID_ENV

if TYPE_CHECKING:
    from smoothscale.cli import Subparsers

EXIT_BAD_CONFIG = 2


def register(subparsers: "Subparsers[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run one instance of a StreamingApp (the command of its pods)",
        description="Run one instance: follow its assignment, restore warm-up and standby tasks, "
        "and process its active tasks with a PySpark streaming query until SIGTERM. The config "
        f"is the JSON in ${CONFIG_ENV} (as the operator sets it), or a file given with --config; "
        f"the instance id defaults to ${INSTANCE_ID_ENV}. See docs/runtime.md.",
    )
    parser.add_argument(
        "--config", metavar="PATH", help=f"JSON config file (default: ${CONFIG_ENV})"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from smoothscale.runtime.config import WorkerConfigError, load_worker_config
    from smoothscale.runtime.pipeline import PipelineError
    from smoothscale.runtime.worker import run_worker

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_worker_config(args.config)
        return run_worker(config)
    except (WorkerConfigError, PipelineError) as error:
        print(f"smoothscale worker: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
