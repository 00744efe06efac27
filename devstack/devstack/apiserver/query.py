"""Query-string parameters, read as the API server reads them."""

from __future__ import annotations

from collections.abc import Mapping

from devstack.apiserver.errors import bad_request


def flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name) in ("1", "true", "True")


def number(query: Mapping[str, str], name: str, default: float) -> float:
    text = query.get(name) or ""
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise bad_request(f"{name} must be a number, got {text!r}") from None
