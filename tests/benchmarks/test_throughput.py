"""The throughput benchmark still runs end to end (at a tiny size), for the running count and
for the running-count StatefulProcessor (`--processor`: through a real `smoothscale worker`,
against transformWithStateInPandas): smoothscale's and plain Spark's outputs both exact, and
its JSON and table written. The numbers are for docs/benchmarks/throughput.md, never
asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.parametrize("processor", [False, True], ids=["aggregate", "processor"])
def test_the_benchmark_runs_both_queries_exactly_and_writes_its_results(
    tmp_path: Path, processor: bool
) -> None:
    out = tmp_path / "out"
    arguments = ["--records", "6000", "--users", "600", "--partitions", "2", "--batch", "500"]
    arguments += ["--rounds", "1", "--repeat", "1", "--out", str(out)]
    arguments += ["--processor"] if processor else []
    name = "throughput-processor" if processor else "throughput"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), *arguments],
        check=True,
        timeout=900,
    )
    results = json.loads((out / f"{name}.json").read_text())
    assert results["smoothscale"]["exact"] is True
    assert results["plain_spark"]["exact"] is True
    for query in ("smoothscale", "plain_spark"):
        assert results[query]["records_measured"] > 0
        assert results[query]["micro_batches"] >= 2
    assert len(results["rounds"]) == 1
    assert results["restore"]["changelog_records"] >= 600, "every user's total in the changelog"
    assert "smoothscale / plain Spark" in (out / f"{name}-table.md").read_text()
