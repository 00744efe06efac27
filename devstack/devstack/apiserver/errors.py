"""API errors as the Kubernetes API server reports them: a metav1.Status with a code and reason."""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]


class ApiError(Exception):
    """A request the API server refuses; `status()` is the body it answers with."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JsonObject | None = None,
        *,
        retry_after_seconds: int = 0,
    ) -> None:
        """`retry_after_seconds` > 0 goes into details and the Retry-After header (client-go
        then retries by itself)."""
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after_seconds = retry_after_seconds

    def status(self) -> JsonObject:
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details = dict(self.details or {})
        if self.retry_after_seconds > 0:
            details["retryAfterSeconds"] = self.retry_after_seconds
        if self.details is not None or details:
            body["details"] = details
        return body

    def headers(self) -> dict[str, str]:
        """Retry-After, when the client should wait before trying again."""
        if self.retry_after_seconds > 0:
            return {"Retry-After": str(self.retry_after_seconds)}
        return {}


def _details(resource: str, name: str) -> JsonObject:
    plural, _, group = resource.partition(".")
    return {"name": name, "group": group, "kind": plural}


def not_found(resource: str, name: str) -> ApiError:
    """`resource` is the group-qualified plural, e.g. "streamingapps.smoothscale.io" or "pods"."""
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', _details(resource, name))


def no_such_path() -> ApiError:
    """A path that names no resource the server serves."""
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{resource} "{name}" already exists', _details(resource, name)
    )


def conflict(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        _details(resource, name),
    )


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """`causes` are (reason, field, message), e.g. ("FieldValueInvalid", "spec.replicas", "...")."""
    qualified = f"{kind}.{group}" if group else kind
    summary = ", ".join(f"{field}: {message}" if field else message for _, field, message in causes)
    return ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {summary}',
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [
                {"reason": reason, "message": message, "field": field}
                for reason, field, message in causes
            ],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format: {content_type}",
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
