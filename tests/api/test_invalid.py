"""Invalid StreamingApps are refused with the field's path and what is allowed there.

Each case in invalid_streamingapps.yaml is the valid example with one thing broken. The API
server's judgement (smoothscale.api.schema over the generated CRD schema) must name exactly
that field, and pydantic (the operator's own reading of a StreamingApp) must refuse it too.
"""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from smoothscale.api.models import StreamingApp
from smoothscale.api.schema import validate

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "invalid_streamingapps.yaml").read_text()
)
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _steps(path: str) -> list[str | int]:
    return [key if key else int(index) for key, index in _STEP.findall(path)]


def _parent(obj: Any, steps: list[str | int]) -> Any:
    for step in steps[:-1]:
        obj = obj.setdefault(step, {}) if isinstance(step, str) else obj[step]
    return obj


def broken(example: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    for path, value in case.get("set", {}).items():
        steps = _steps(path)
        _parent(example, steps)[steps[-1]] = value
    for path in case.get("unset", []):
        steps = _steps(path)
        del _parent(example, steps)[steps[-1]]
    return example


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_refused_naming_the_field_and_what_is_allowed(
    case: dict[str, Any], example: dict[str, Any], schema: dict[str, Any]
) -> None:
    errors = validate(schema, broken(example, case))
    assert any(e.path == case["path"] and case["message"] in e.message for e in errors), errors
    # Nothing else is blamed (the path "" is the note that rules were skipped).
    assert {e.path for e in errors} <= {case["path"], ""}, errors


SPEC_CASES = [c for c in CASES if c["path"].startswith("spec")]


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c["case"] for c in SPEC_CASES])
def test_pydantic_refuses_it_too(case: dict[str, Any], example: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        StreamingApp.model_validate(broken(example, case))


def test_the_example_itself_is_accepted_by_both(
    example: dict[str, Any], schema: dict[str, Any]
) -> None:
    assert validate(schema, example) == []
    StreamingApp.model_validate(example)
