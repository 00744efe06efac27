"""The scaling benchmark still runs end to end (at a tiny size): both strategies exact, and its
JSON, table and plot written. The numbers are for docs/benchmarks/scaling.md, never asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.cluster]


def test_the_benchmark_runs_both_strategies_exactly_and_writes_its_results(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    arguments = ["--tasks", "2", "--keys", "200", "--backlog", "2000", "--rate", "100"]
    arguments += ["--hold", "3", "--out", str(out), "--workdir", str(tmp_path / "work")]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), *arguments],
        check=True,
        timeout=1500,
    )
    results = json.loads((out / "scaling.json").read_text())
    strategies = [s["strategy"] for s in results["strategies"]]
    assert strategies == ["WarmUp", "StopTheWorld"]
    for summary in results["strategies"]:
        assert summary["updates_lost"] == summary["updates_applied_twice"] == 0
        assert summary["tasks_with_two_owners_at_once"] == 0
        assert summary["records_processed_during_scaling"] > 0
    assert (out / "scaling.png").stat().st_size > 0
    assert "Stop-the-world / warm-up" in (out / "scaling-table.md").read_text()
