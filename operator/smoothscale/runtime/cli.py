"""`smoothscale worker [--config PATH]`: run one instance of a StreamingApp (the pod's command);
`smoothscale spark-classes [PATH]`: write the Spark driver's class-data archive."""

import argparse
import logging
import sys
from pathlib import Path
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
    archive = subparsers.add_parser(
        "spark-classes",
        help="write the Spark driver's class-data archive (drivers start on half the CPU)",
        description="Run a short Spark workload whose JVM writes the classes it loaded to a "
        "class-data archive, which every Spark driver of this environment then starts on "
        "(docs/runtime.md, The driver JVM). The image's build runs it; run it again after "
        "upgrading PySpark or Java.",
    )
    archive.add_argument(
        "path", nargs="?", type=Path, help="where to write it (default: where drivers look)"
    )
    archive.set_defaults(handler=_write_classes)


def _write_classes(args: argparse.Namespace) -> int:
    from smoothscale.runtime.spark import ClassArchiveError, class_archive, write_class_archive

    path = args.path or class_archive()
    try:
        write_class_archive(path)
    except ClassArchiveError as error:
        print(f"smoothscale spark-classes: {error}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({path.stat().st_size // 2**20} MiB)")
    return 0


def _run(args: argparse.Namespace) -> int:
    from smoothscale.runtime.config import WorkerConfigError, load_worker_config
    from smoothscale.runtime.pipeline import PipelineError
    from smoothscale.runtime.worker import GIL_SWITCH_SECONDS, run_worker

    sys.setswitchinterval(GIL_SWITCH_SECONDS)
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
