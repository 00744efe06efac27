"""Label and field selectors, parsed from their query-string forms."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from devstack.apiserver.errors import JsonObject, bad_request

Predicate = Callable[[JsonObject], bool]

_SET_TERM = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQUALITY_TERM = re.compile(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*([^\s]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses: "a in (x,y),b" -> ["a in (x,y)", "b"]."""
    terms, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return [term for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    if match := _SET_TERM.match(term):
        key, operator, values = match.group(1), match.group(2), match.group(3)
        allowed = {value.strip() for value in values.split(",") if value.strip()}
        if operator == "in":
            return lambda labels: labels.get(key) in allowed
        return lambda labels: labels.get(key) not in allowed
    if match := _EQUALITY_TERM.match(term):
        key, operator, value = match.groups()
        if operator == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_TERM.match(term):
        negated, key = match.groups()
        if negated:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise bad_request(f"unable to parse requirement: {term.strip()!r} in the label selector")


def label_selector(text: str | None) -> Predicate:
    """Equality (a=b, a!=b), set (a in (x,y), a notin (x)) and existence (a, !a) terms, ANDed."""
    terms = [_label_term(term) for term in _split_terms(text or "")]

    def matches(obj: JsonObject) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def field_value(obj: JsonObject, path: str) -> Any:
    """The value at a dotted path such as "involvedObject.name", or None."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _as_field_string(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_selector(text: str | None) -> Predicate:
    """Equality terms over any dotted field path (metadata.name, spec.nodeName, status.phase,
    involvedObject.uid, ...), ANDed. A real API server allows only a few fields per kind."""
    terms = []
    for term in _split_terms(text or ""):
        match = _EQUALITY_TERM.match(term)
        if match is None:
            raise bad_request(
                f"invalid field selector: {term.strip()!r}: use field=value or field!=value"
            )
        terms.append(match.groups())

    def matches(obj: JsonObject) -> bool:
        for path, operator, expected in terms:
            equal = _as_field_string(field_value(obj, path)) == expected
            if equal == (operator == "!="):
                return False
        return True

    return matches
