"""Injected API trouble: the next matching requests answer with an error a real API server can
give (409 Conflict, 410 Gone for an expired watch, 429, 500, 503, 504), so that tests show how
the operator and kubectl live with it.

Faults are asked for with POST /smoothscale.dev/faults (a JSON list of faults, see `Fault`) and
counted with GET on the same path; `Session.inject_api_faults` in the scenario helpers does both.
A fault for watches also ends the open watches it matches (as a real server ends a watch at its
timeout), so that their clients watch again and meet it.
"""

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from devstack.apiserver.errors import ApiError

PATH = "/smoothscale.dev/faults"

_REASONS = {
    409: (
        "Conflict",
        "the object has been modified; please apply your changes to the latest "
        "version and try again",
    ),
    410: ("Expired", "too old resource version"),
    429: (
        "TooManyRequests",
        "the server has received too many requests and has asked us to try again later",
    ),
    500: (
        "InternalError",
        "an error on the server (injected) has prevented the request from succeeding",
    ),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted"),
}


ADMIN = "admin"
"""The user name of a request without a token (the admin's: the tests' own kubectl)."""


@dataclass
class Fault:
    """The next `count` requests with this method (or any, "*") whose path contains `path`
    (and, when `watch` is set, that are or are not watches; when `user` is set, whose user's
    name starts with it) answer `code`. A scenario scopes its faults to the operator's user
    (`system:serviceaccount:`) so that its own checks never meet them."""

    code: int
    count: int
    method: str = "*"
    path: str = ""
    watch: bool | None = None
    user: str = ""

    @classmethod
    def parse(cls, document: Any) -> "Fault":
        if not isinstance(document, dict):
            raise ValueError(f"a fault is a JSON object, got {document!r}")
        fault = cls(
            code=int(document["code"]),
            count=int(document.get("count", 1)),
            method=str(document.get("method", "*")).upper(),
            path=str(document.get("path", "")),
            watch=None if document.get("watch") is None else bool(document["watch"]),
            user=str(document.get("user", "")),
        )
        if fault.code not in _REASONS:
            raise ValueError(f"code {fault.code} is not one of {sorted(_REASONS)}")
        if fault.count < 1:
            raise ValueError(f"count {fault.count} must be at least 1")
        return fault

    def matches(self, method: str, path: str, watch: bool, user: str) -> bool:
        return (
            self.method in ("*", method)
            and self.path in path
            and (self.watch is None or self.watch == watch)
            and user.startswith(self.user)
        )


class Faults:
    """The faults still to inject, and how many of each code were."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Fault] = []
        self.injected: Counter[int] = Counter()

    def add(self, faults: list[Fault]) -> None:
        with self._lock:
            self._pending.extend(faults)

    def take(self, method: str, path: str, watch: bool, user: str) -> ApiError | None:
        """The error this request of `user` answers with, if a pending fault matches it."""
        if path.startswith(PATH):
            return None
        with self._lock:
            for fault in self._pending:
                if fault.matches(method, path, watch, user):
                    fault.count -= 1
                    if fault.count == 0:
                        self._pending.remove(fault)
                    self.injected[fault.code] += 1
                    reason, message = _REASONS[fault.code]
                    return ApiError(fault.code, reason, message)
        return None

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                "injected": {str(code): n for code, n in sorted(self.injected.items())},
                "pending": sum(fault.count for fault in self._pending),
            }
