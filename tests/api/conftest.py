from pathlib import Path
from typing import Any

import pytest
import yaml

from smoothscale.api.crd import openapi_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "streamingapp.yaml"


@pytest.fixture(scope="session")
def schema() -> dict[str, Any]:
    return openapi_schema()


@pytest.fixture
def example() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return loaded
