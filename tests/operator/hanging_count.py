"""The running count, whose `apply` blocks for ever on one key, once: a pipeline that hangs (a
call to a service that never answers, a deadlock) in whichever instance first meets that key.

Set on the StreamingApp's spec.env: HANG_KEY (the user whose update hangs) and HANG_MARKER (a
file: the first process to meet the key creates it and blocks; any process that finds it
already there counts on, so the instance the kubelet restarts, or the one the task fails over
to, does not hang again).
"""

import os
import threading
from pathlib import Path

from examples.pipelines import running_count

from smoothscale.runtime.pipeline import Output, Pipeline


def pipeline() -> Pipeline:
    return Pipeline(
        store=running_count.STORE,
        value_schema="user STRING",
        key_column="user",
        aggregate=running_count.count_per_user,
        apply=add_count_or_hang,
    )


def add_count_or_hang(user: str, old: int | None, update: int) -> tuple[int, list[Output]]:
    if user == os.environ["HANG_KEY"]:
        try:
            Path(os.environ["HANG_MARKER"]).touch(exist_ok=False)
        except FileExistsError:
            pass
        else:
            threading.Event().wait()  # for ever
    return running_count.add_count(user, old, update)
