"""The programming model: loading a pipeline by reference, and the example pipelines' folds."""

import sys
from pathlib import Path

import pytest
from examples.pipelines import running_count, tumbling_window
from pyspark.sql import SparkSession

from smoothscale.runtime.pipeline import Pipeline, PipelineError, load_pipeline


def test_load_pipeline_calls_the_named_factory() -> None:
    pipeline = load_pipeline("examples.pipelines.running_count:pipeline")

    assert pipeline.store == "counts"
    assert pipeline.key_column == "user"
    assert pipeline.apply is running_count.add_count


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("examples.pipelines.running_count", "not of the form 'module:callable'"),
        ("no_such_module_here:pipeline", "is not importable"),
        ("examples.pipelines.running_count:no_such_factory", "has no attribute 'no_such_factory'"),
        ("examples.pipelines.running_count:STORE", "is a str, not a callable"),
        ("examples.pipelines.running_count:count_per_user", "cannot be called without arguments"),
        ("examples.pipelines.tumbling_window:window_key", "cannot be called without arguments"),
        ("examples.pipelines.running_count:TYPE_CHECKING", "is a bool, not a callable"),
    ],
)
def test_load_pipeline_says_what_is_wrong_with_a_bad_reference(ref: str, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        load_pipeline(ref)


def test_an_import_error_inside_the_pipeline_module_is_not_mistaken_for_a_missing_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_pipeline.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        load_pipeline("broken_pipeline:pipeline")
    sys.modules.pop("broken_pipeline", None)


def test_a_factory_that_returns_something_else_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dict_pipeline.py").write_text("def pipeline():\n    return {'store': 'x'}\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(PipelineError, match="returned a dict, not a smoothscale Pipeline"):
        load_pipeline("dict_pipeline:pipeline")
    sys.modules.pop("dict_pipeline", None)


def test_a_pipeline_without_a_value_schema_is_refused() -> None:
    with pytest.raises(PipelineError, match="value_schema"):
        Pipeline(
            store="counts",
            value_schema=" ",
            key_column="key",
            aggregate=running_count.count_per_user,
            apply=running_count.add_count,
        )


def test_running_count_adds_each_batch_count_to_the_total_and_emits_it() -> None:
    state, outputs = running_count.add_count("alice", None, 3)
    assert (state, outputs) == (3, [("alice", 3)])

    state, outputs = running_count.add_count("alice", state, 2)
    assert (state, outputs) == (5, [("alice", 5)])


def test_tumbling_window_accumulates_a_window_and_emits_its_running_aggregate() -> None:
    key = tumbling_window.window_key("alice", 1_700_000_040_000)

    state, _ = tumbling_window.add_to_window(key, None, {"sum": 10, "count": 2})
    state, outputs = tumbling_window.add_to_window(key, state, {"sum": 5, "count": 1})

    assert state == {"sum": 15, "count": 3}
    assert outputs == [
        (
            "alice|1700000040000",
            {
                "user": "alice",
                "windowStart": 1_700_000_040_000,
                "windowEnd": 1_700_000_100_000,
                "sum": 15,
                "count": 3,
            },
        )
    ]


def test_tumbling_window_keys_survive_a_bar_in_the_user_name() -> None:
    key = tumbling_window.window_key("a|b", 60_000)

    _, [(output_key, output)] = tumbling_window.add_to_window(key, None, {"sum": 1, "count": 1})

    assert output_key == "a|b|60000"
    assert (output["user"], output["windowStart"]) == ("a|b", 60_000)


@pytest.mark.spark
def test_running_count_aggregate_gives_one_count_per_partition_and_user(
    spark: SparkSession,
) -> None:
    decoded = spark.createDataFrame(
        [(0, "alice"), (0, "alice"), (0, "bob"), (1, "alice")], "partition INT, user STRING"
    )

    updates = running_count.count_per_user(decoded)

    assert sorted(tuple(row) for row in updates.collect()) == [
        (0, "alice", 2),
        (0, "bob", 1),
        (1, "alice", 1),
    ]
    assert updates.columns == ["partition", "key", "update"]


@pytest.mark.spark
def test_tumbling_window_aggregate_sums_per_user_and_minute_of_event_time(
    spark: SparkSession,
) -> None:
    decoded = spark.createDataFrame(
        [
            (0, "alice", 5, 60_000),
            (0, "alice", 7, 119_999),
            (0, "alice", 1, 120_000),
            (0, "bob", 2, 60_500),
        ],
        "partition INT, user STRING, amount LONG, ts LONG",
    )

    updates = tumbling_window.sum_per_window(decoded)

    assert sorted(
        (row["partition"], row["key"], row["update"]["sum"], row["update"]["count"])
        for row in updates.collect()
    ) == [
        (0, "alice|120000", 1, 1),
        (0, "alice|60000", 12, 2),
        (0, "bob|60000", 2, 1),
    ]
