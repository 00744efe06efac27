"""The operator-cost benchmark still runs (at a tiny size): the numbers it prints are for
docs/operator-cost.md, never asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster


def test_the_benchmark_times_a_steady_and_a_scaling_app(tmp_path: Path) -> None:
    output = tmp_path / "cost.json"
    arguments = ["--tasks", "4", "--instances", "2", "--polls", "3", "--json", str(output)]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "operator_cost.py"), *arguments],
        check=True,
        timeout=300,
    )
    results = json.loads(output.read_text())
    assert results["steady"]["active"] == 4
    assert results["steady"]["instances"] == 2
    assert results["scaling"]["instances"] == 4
    assert results["scaling"]["warming"] > 0
    assert results["steady"]["cpu_ms_median"] > 0
