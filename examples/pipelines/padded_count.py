"""The running count with larger state: each user's state carries a padding of N bytes.

The same aggregate and the same outputs as examples.pipelines.running_count (every batch that
sees a user emits the user's new total), so the same checks apply, but each user's state is
{"count": total, "padding": N characters}, N from the environment variable
SMOOTHSCALE_STATE_PADDING_BYTES (0 when unset). It sets the bytes of state per task, and so of
changelog a task restores, without more keys: the scaling benchmark's state-size sweep
(benchmarks/scaling.py) sets it in the StreamingApp's spec.env. The padding is the user's name
hashed and repeated: a pure function of the key (a batch processed again computes the same
state) that compresses no better than typical state would.

    spec.pipeline: examples.pipelines.padded_count:pipeline
"""

import hashlib
import os
from typing import Any

from examples.pipelines.running_count import STORE, count_per_user

from smoothscale.runtime.pipeline import Output, Pipeline

PADDING_VARIABLE = "SMOOTHSCALE_STATE_PADDING_BYTES"


def pipeline() -> Pipeline:
    padding_bytes = int(os.environ.get(PADDING_VARIABLE, "0"))

    def add_count(
        user: str, old: dict[str, Any] | None, update: int
    ) -> tuple[dict[str, Any], list[Output]]:
        """Add the batch's count to the user's total, emit the new total, keep the padding."""
        total = (old["count"] if old else 0) + update
        return {"count": total, "padding": padding(user, padding_bytes)}, [(user, total)]

    return Pipeline(
        store=STORE,
        value_schema="user STRING",
        key_column="user",
        aggregate=count_per_user,
        apply=add_count,
    )


def padding(user: str, size: int) -> str:
    """`size` characters derived from the user's name alone (hex of its chained hashes)."""
    chunks: list[str] = []
    digest = user.encode()
    while sum(map(len, chunks)) < size:
        digest = hashlib.sha256(digest).digest()
        chunks.append(digest.hex())
    return "".join(chunks)[:size]
