"""A trivial kopf operator for the tests: each handler leaves a trace in the API."""

from typing import Any

import kopf

GROUP, VERSION, PLURAL = "example.smoothscale.io", "v1", "widgets"


@kopf.on.create(GROUP, VERSION, PLURAL)
def created(patch: kopf.Patch, **_: Any) -> None:
    patch.status["phase"] = "Created"


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.color")
def recolored(new: str, patch: kopf.Patch, **_: Any) -> None:
    patch.status["phase"] = f"Recolored {new}"


@kopf.on.field(GROUP, VERSION, PLURAL, field="spec.replicas")
def scaled(new: int, patch: kopf.Patch, **_: Any) -> None:
    patch.status["replicas"] = new


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(body: kopf.Body, **_: Any) -> None:
    kopf.info(body, reason="Farewell", message="the delete handler ran")
