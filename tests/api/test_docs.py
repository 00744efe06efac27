"""docs/configuration.md documents every field the CRD has, with its default."""

from collections.abc import Iterator
from typing import Any

from smoothscale.api.docs import configuration_reference


def _paths(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _paths(
            sub.get("items", sub), f"{path}.{name}" + ("[]" if "items" in sub else "")
        )


def test_every_spec_and_status_field_is_in_the_reference(schema: dict[str, Any]) -> None:
    reference = configuration_reference()
    for part in ("spec", "status"):
        for path, node in _paths(schema["properties"][part], part):
            assert f"| `{path}` |" in reference, path
            assert node["description"].replace("|", "\\|") in reference, path


def test_the_reference_shows_defaults_and_bounds() -> None:
    reference = configuration_reference()
    row = next(
        line
        for line in reference.splitlines()
        if line.startswith("| `spec.scaling.maxWarmupReplicas` |")
    )
    assert "| `2` |" in row
    assert "1 to 1000" in row
    duration = next(
        line
        for line in reference.splitlines()
        if line.startswith("| `spec.scaling.drainTimeout` |")
    )
    assert "| duration | `10m` |" in duration
