"""A StatefulProcessor's state variables over a task's store: pyspark's semantics, kept as
changelog records, restored exactly by the task's next owner (also from a compacted log)."""

import datetime
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from smoothscale.runtime.processor import ProcessorPipeline
from tests.runtime.processor_helpers import ProcessorTask

EVENTS = StructType([StructField("user", StringType()), StructField("item", StringType())])
OUTPUT = StructType([StructField("user", StringType()), StructField("state", StringType())])
RICH = StructType(
    [
        StructField("when", TimestampType()),
        StructField("day", DateType()),
        StructField("price", DecimalType(10, 2)),
        StructField("raw", BinaryType()),
        StructField("tags", MapType(IntegerType(), StringType())),
        StructField("nested", StructType([StructField("x", DoubleType())])),
        StructField("list", ArrayType(LongType())),
    ]
)
RICH_VALUE = (
    datetime.datetime(2026, 1, 2, 3, 4, 5, 678000),
    datetime.date(2026, 1, 2),
    Decimal("12.50"),
    b"\x00\xff",
    {1: "one", 2: "two"},
    Row(x=1.5),
    [1, 2, 3],
)
ITEM = StructType([StructField("item", StringType())])
COUNT = StructType([StructField("count", LongType())])


class Basket(StatefulProcessor):
    """Keeps, per user: the last item (value), every item (list), a count per item (map), and
    a value of every supported type; emits its view of the state after each batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.last = handle.getValueState("last", ITEM)
        self.items = handle.getListState("items", ITEM)
        self.counts = handle.getMapState("counts", ITEM, COUNT)
        self.rich = handle.getValueState("rich", RICH)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        for frame in rows:
            for item in frame["item"]:
                if item == "clear":
                    self.last.clear()
                    self.items.clear()
                    self.counts.clear()
                    continue
                if item == "boom":
                    raise ValueError("a poison record")
                self.last.update((item,))
                self.items.appendValue((item,))
                count = self.counts.getValue((item,))
                self.counts.updateValue((item,), ((count[0] if count else 0) + 1,))
        self.rich.update(RICH_VALUE)
        yield pd.DataFrame({"user": [key[0]], "state": [repr(self.view())]})

    def view(self) -> dict[str, Any]:
        return {
            "last": self.last.get(),
            "items": list(self.items.get()),
            "counts": sorted(self.counts.iterator()),
            "exists": (self.last.exists(), self.items.exists(), self.counts.exists()),
        }

    def close(self) -> None:
        pass


def basket() -> ProcessorPipeline:
    return ProcessorPipeline(
        store="baskets",
        value_schema=EVENTS,
        processor=Basket(),
        grouping_key="user",
        output_schema=OUTPUT,
    )


def test_value_list_and_map_state_keep_what_pyspark_would_return(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", basket())
    task.run([{"user": "ann", "item": "tea"}, {"user": "ann", "item": "jam"}])
    outcome = task.run([{"user": "ann", "item": "tea"}, {"user": "bob", "item": "egg"}])

    views = dict(outcome.outputs)
    assert views["ann"] == {
        "user": "ann",
        "state": repr(
            {
                "last": ("tea",),
                "items": [("tea",), ("jam",), ("tea",)],
                "counts": [(("jam",), (1,)), (("tea",), (2,))],
                "exists": (True, True, True),
            }
        ),
    }
    assert eval(views["bob"]["state"])["items"] == [("egg",)]


def test_every_supported_type_round_trips_through_the_store(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", basket())
    task.run([{"user": "ann", "item": "tea"}])
    successor = task.handed_over(tmp_path / "b")

    class Reader(Basket):
        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
        ) -> Iterator[pd.DataFrame]:
            yield pd.DataFrame({"user": [key[0]], "state": [repr(self.rich.get())]})

    reader = ProcessorTask(tmp_path / "c", reader_of(Reader()), log=successor.log, epoch=3)
    [(_, output)] = reader.run([{"user": "ann", "item": "-"}]).outputs
    assert output["state"] == repr(RICH_VALUE)
    successor.close()
    reader.close()


def reader_of(processor: StatefulProcessor) -> ProcessorPipeline:
    return ProcessorPipeline(
        store="baskets",
        value_schema=EVENTS,
        processor=processor,
        grouping_key="user",
        output_schema=OUTPUT,
    )


@pytest.mark.parametrize("compacted", [False, True])
def test_the_next_owner_restores_every_state_variable_exactly(
    tmp_path: Path, compacted: bool
) -> None:
    task = ProcessorTask(tmp_path / "a", basket())
    task.run([{"user": "ann", "item": "tea"}, {"user": "bob", "item": "egg"}])
    task.run([{"user": "ann", "item": "jam"}, {"user": "ann", "item": "tea"}])
    task.run([{"user": "bob", "item": "clear"}, {"user": "cat", "item": "fig"}])
    before = task.contents()

    successor = task.handed_over(tmp_path / "b", compacted=compacted)
    assert successor.contents() == before
    after = successor.run([{"user": "ann", "item": "fig"}, {"user": "bob", "item": "egg"}])
    views = {user: eval(value["state"]) for user, value in after.outputs}
    assert views["ann"]["items"] == [("tea",), ("jam",), ("tea",), ("fig",)]
    assert views["ann"]["counts"] == [(("fig",), (1,)), (("jam",), (1,)), (("tea",), (2,))]
    assert views["bob"]["items"] == [("egg",)]  # cleared on the old owner, gone here too
    successor.close()


def test_a_handler_that_raises_leaves_its_key_as_it_was_and_the_others_commit(
    tmp_path: Path,
) -> None:
    task = ProcessorTask(tmp_path / "a", basket())
    task.run([{"user": "ann", "item": "tea"}])
    before = {k: v for k, v in task.contents().items() if "ann" in k}

    outcome = task.run(
        [
            {"user": "ann", "item": "jam"},
            {"user": "ann", "item": "boom"},
            {"user": "bob", "item": "egg"},
        ]
    )

    [(key, error)] = outcome.failed_keys
    assert key == ("ann",)
    assert str(error) == "a poison record"
    assert {k: v for k, v in task.contents().items() if "ann" in k} == before
    assert [user for user, _ in outcome.outputs] == ["bob"]
    task.close()


class Renamed(StatefulProcessor):
    """A later version of Basket that dropped its "items" list."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        handle.deleteIfExists("items")
        self.last = handle.getValueState("last", ITEM)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        yield pd.DataFrame({"user": [key[0]], "state": [repr(self.last.get())]})

    def close(self) -> None:
        pass


def test_delete_if_exists_purges_a_variable_for_every_grouping_key(tmp_path: Path) -> None:
    task = ProcessorTask(tmp_path / "a", basket())
    task.run([{"user": "ann", "item": "tea"}, {"user": "bob", "item": "egg"}])
    upgraded = ProcessorTask(tmp_path / "b", reader_of(Renamed()), log=task.log, epoch=2)

    outcome = upgraded.run([{"user": "ann", "item": "-"}])

    assert dict(outcome.outputs)["ann"]["state"] == repr(("tea",))
    assert not [key for key in upgraded.contents() if key.startswith('l"items"')]
    assert [key for key in upgraded.contents() if key.startswith('m"counts"')]
    task.close()
    upgraded.close()


def test_pandas_and_numpy_scalars_are_kept_as_plain_values() -> None:
    import numpy as np

    from smoothscale.runtime.processor.codec import plain, row_from_json, row_to_json

    schema = StructType([StructField("n", LongType()), StructField("at", TimestampType())])
    value = (np.int64(3), np.datetime64("2026-01-02T03:04:05.5", "ns"))
    assert row_from_json(schema, row_to_json(schema, value)) == (
        3,
        datetime.datetime(2026, 1, 2, 3, 4, 5, 500000),
    )
    assert (plain(pd.NaT), plain(pd.NA)) == (None, None)
