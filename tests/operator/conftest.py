"""Fixtures of the operator's tests that run its control loop in this process (in_process.py)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.helm import Manifest, render
from tests.operator.in_process import APPS, Platform, installed


@pytest.fixture(scope="session")
def chart() -> list[Manifest]:
    """The chart as a platform installs it to serve the apps' namespace."""
    return render({"watch": {"namespaces": [APPS]}})


@pytest.fixture
def platform(chart: list[Manifest], tmp_path: Path) -> Iterator[Platform]:
    with installed(chart, tmp_path) as running:
        yield running
