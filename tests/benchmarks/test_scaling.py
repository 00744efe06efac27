"""The scaling benchmark still runs end to end (at a tiny size, its pods without Spark): every
strategy through the operator, exact, and its JSON, table and plot written. The numbers are for
docs/benchmarks/scaling.md (measured with Spark), never asserted. Cooperative and Restart have
no other end-to-end check: this is it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_the_benchmark_runs_every_strategy_exactly_and_writes_its_results(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    arguments = ["--tasks", "2", "--keys", "200", "--backlog", "2000", "--rate", "100"]
    arguments += ["--hold", "3", "--out", str(out), "--workdir", str(tmp_path / "work")]
    arguments += ["--protocol-worker"]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), *arguments],
        check=True,
        timeout=1500,
    )
    results = json.loads((out / "scaling.json").read_text())
    strategies = [s["strategy"] for s in results["strategies"]]
    assert strategies == ["WarmUp", "Cooperative", "Restart"]
    for summary in results["strategies"]:
        assert summary["updates_lost"] == summary["updates_applied_twice"] == 0
        assert summary["tasks_with_two_owners_at_once"] == 0
        assert summary["records_processed_during_scaling"] > 0
    assert (out / "scaling.png").stat().st_size > 0
    assert set(results["max_pause_ratios"]) == {"Cooperative", "Restart"}
    assert "Longest pause against smoothscale's" in (out / "scaling-table.md").read_text()
