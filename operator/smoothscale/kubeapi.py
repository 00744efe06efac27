"""A small JSON client of the Kubernetes API, on the `kubernetes` package's ApiClient.

The ApiClient brings what a kubeconfig or the pod's service account says (server, TLS, tokens,
client certificates); this class sends plain JSON to any path, so its users (the operator, the
local kubelet) work with objects exactly as the API serves them, subresources included
(pods/binding, pods/status, streamingapps/status), and with any API server.
"""

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient

JsonObject = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"


class KubeApiError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _error_message(data: bytes) -> str:
    try:
        body = json.loads(data)
    except ValueError:
        return data.decode(errors="replace")[:500]
    return str(body.get("message", body)) if isinstance(body, dict) else str(body)


class KubeApi:
    def __init__(self, api_client: ApiClient, request_timeout: float = 10.0) -> None:
        self._client = api_client
        self._timeout = request_timeout

    @classmethod
    def from_kubeconfig(cls, path: Path | None = None, context: str | None = None) -> "KubeApi":
        """A client for the cluster of a kubeconfig (default: $KUBECONFIG, ~/.kube/config)."""
        from kubernetes.config import new_client_from_config

        api_client = new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=None if path is None else str(path), context=context
        )
        return cls(api_client)

    @classmethod
    def connect(cls) -> "KubeApi":
        """The cluster this process runs in (its service account) when it runs in a pod and no
        KUBECONFIG is set; else the kubeconfig's current context."""
        import os

        from kubernetes.client import Configuration
        from kubernetes.config import load_incluster_config

        if "KUBERNETES_SERVICE_HOST" in os.environ and "KUBECONFIG" not in os.environ:
            configuration = Configuration()
            load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return cls(ApiClient(configuration))
        return cls.from_kubeconfig()

    @property
    def server(self) -> str:
        """The API server's URL, e.g. https://10.96.0.1:443."""
        host: str = self._client.configuration.host
        return host

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float | tuple[float, float],
    ) -> Any:
        _, url, headers, serialized_body, _ = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return self._client.call_api(
                method, url, header_params=headers, body=serialized_body, _request_timeout=timeout
            )
        except OSError as error:
            raise KubeApiError(0, f"cannot reach the API server: {error}") from error

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        """One request; the decoded JSON answer, or KubeApiError."""
        try:
            response = self._send(
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                timeout=self._timeout,
            )
            data: bytes = response.read()
        except KubeApiError:
            raise
        except Exception as error:  # urllib3 raises many kinds; all mean "no answer"
            raise KubeApiError(0, f"no answer from the API server: {error}") from error
        if not 200 <= response.status < 300:
            raise KubeApiError(response.status, _error_message(data))
        decoded: JsonObject = json.loads(data) if data else {}
        return decoded

    def watch(self, path: str, resource_version: str, timeout_seconds: int) -> Iterator[JsonObject]:
        """The watch events of a collection from `resource_version`, until the server ends the
        stream (after about `timeout_seconds`). An ERROR event raises KubeApiError (410 when
        the version is too old: list again)."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
            "allowWatchBookmarks": "true",
        }
        try:
            response = self._send(
                "GET",
                path,
                query=query,
                body=None,
                content_type="application/json",
                timeout=(self._timeout, timeout_seconds + 5),
            )
        except KubeApiError:
            raise
        except Exception as error:
            raise KubeApiError(0, f"no answer from the API server: {error}") from error
        stream = response.response
        try:
            if not 200 <= response.status < 300:
                raise KubeApiError(response.status, _error_message(response.read()))
            for line in stream:
                if not line.strip():
                    continue
                event: JsonObject = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise KubeApiError(int(status.get("code", 500)), str(status.get("message")))
                yield event
        except KubeApiError:
            raise
        except Exception as error:
            raise KubeApiError(0, f"the watch of {path} broke off: {error}") from error
        finally:
            stream.release_conn()
