"""The scaling benchmark still runs end to end (`--smoke`: every strategy at one small state
size, its pods without Spark): every strategy through the operator, exact, never two owners,
every strategy and size in its JSON, and its table and plots written. The numbers are for
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
    arguments = ["--smoke", "--out", str(out), "--workdir", str(tmp_path / "work")]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), *arguments],
        check=True,
        timeout=900,
    )
    results = json.loads((out / "scaling.json").read_text())
    runs = results["runs"]
    assert [(r["strategy"], r["padding_bytes"]) for r in runs] == [
        ("WarmUp", 1024),
        ("Cooperative", 1024),
        ("Restart", 1024),
    ]
    for run in runs:
        assert run["updates_lost"] == run["updates_applied_twice"] == 0, run
        assert run["tasks_with_two_owners_at_once"] == 0, run
        assert run["records_processed_during_scaling"] > 0, run
        assert run["changelog_log_start_at_end"] == 0, "the broker dropped a changelog's head"
        assert run["changelog_mb_per_task_at_scale_out"] > 0.05, "100 users of 1 KB a task"
        assert run["restore"]["all_tasks_records_per_s"] > 0
        assert run["pod_start_to_ready_s"], "the pods' start to ready measured"
    sweep = results["sweep"]
    assert set(sweep["cells"]) == {"1024/WarmUp", "1024/Cooperative", "1024/Restart"}
    assert set(sweep["projection"]["strategies"]) == {"WarmUp", "Cooperative", "Restart"}
    table = (out / "scaling-table.md").read_text()
    assert "Projection" in table
    assert (out / "scaling.png").stat().st_size > 0
    assert (out / "scaling-throughput.png").stat().st_size > 0
