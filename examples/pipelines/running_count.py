"""A running count of records per user.

Input values are JSON objects with a "user" field, e.g. {"user": "alice"}; produce them with the
user as the record key too, so all of a user's records land in one partition (one task) and the
count is the user's total. State per user: the count so far (an int). Every batch that sees a
user emits one output record (user, count) with the new total.

    spec.pipeline: examples.pipelines.running_count:pipeline
"""

from typing import TYPE_CHECKING

from smoothscale.runtime.pipeline import Output, Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

STORE = "counts"


def pipeline() -> Pipeline:
    return Pipeline(
        store=STORE,
        value_schema="user STRING",
        key_column="user",
        aggregate=count_per_user,
        apply=add_count,
    )


def count_per_user(batch: "DataFrame") -> "DataFrame":
    """One update per (partition, user): how many of the batch's records name that user."""
    from pyspark.sql import functions as F

    return (
        batch.groupBy("partition", "user")
        .agg(F.count("*").alias("update"))
        .select("partition", F.col("user").alias("key"), "update")
    )


def add_count(user: str, old: int | None, update: int) -> tuple[int, list[Output]]:
    """Add the batch's count to the user's total, and emit the new total."""
    total = (old or 0) + update
    return total, [(user, total)]
