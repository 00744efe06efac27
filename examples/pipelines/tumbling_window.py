"""Sums of amounts per user in 1-minute tumbling windows of event time.

Input values are JSON objects like {"user": "alice", "amount": 5, "ts": 1700000000123}, where ts
is the event time in epoch milliseconds; key records by user (see running_count). A record falls
in the window [floor(ts / 60 s) * 60 s, + 60 s). State is keyed "user|windowStart" (windowStart
in epoch ms) and holds {"sum": ..., "count": ...}.

Semantics, kept simple and exact: windows never close. Every batch that touches a window emits
the window's running aggregate, keyed "user|windowStart", so the output topic is an upsert
stream (a compacted topic or a table keeps the latest value per key). A late record, however
late, is added to its window and the window is emitted again with the corrected total; no record
is ever dropped for lateness. The price is state: one entry per (user, window) ever seen, kept
until the key is deleted; give the changelog a retention policy if that grows too large.

    spec.pipeline: examples.pipelines.tumbling_window:pipeline
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from smoothscale.runtime.pipeline import Output, Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

STORE = "windows"
WINDOW_MS = 60_000


def pipeline() -> Pipeline:
    return Pipeline(
        store=STORE,
        value_schema="user STRING, amount LONG, ts LONG",
        key_column="user",
        aggregate=sum_per_window,
        apply=add_to_window,
    )


def window_key(user: str, window_start_ms: int) -> str:
    return f"{user}|{window_start_ms}"


def sum_per_window(batch: "DataFrame") -> "DataFrame":
    """One update per (partition, user, window): the batch's sum and count in that window."""
    from pyspark.sql import functions as F

    window_start = (F.floor(F.col("ts") / WINDOW_MS) * WINDOW_MS).cast("long")
    per_window = batch.groupBy("partition", "user", window_start.alias("window_start")).agg(
        F.sum("amount").alias("sum"), F.count("*").alias("count")
    )
    return per_window.select(
        "partition",
        F.concat_ws("|", "user", F.col("window_start").cast("string")).alias("key"),
        F.struct("sum", "count").alias("update"),
    )


def add_to_window(
    key: str, old: Mapping[str, int] | None, update: Mapping[str, Any]
) -> tuple[dict[str, int], list[Output]]:
    """Add the batch's sum and count to the window's, and emit the window's new aggregate.

    `update` is the struct from `sum_per_window`: a dict in the runtime, or any mapping with
    "sum" and "count".
    """
    user, window_start = key.rsplit("|", 1)
    start_ms = int(window_start)
    state = {
        "sum": (old["sum"] if old else 0) + int(update["sum"]),
        "count": (old["count"] if old else 0) + int(update["count"]),
    }
    output = {
        "user": user,
        "windowStart": start_ms,
        "windowEnd": start_ms + WINDOW_MS,
        "sum": state["sum"],
        "count": state["count"],
    }
    return state, [(key, output)]
