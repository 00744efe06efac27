"""GET pods/NAME/log (`kubectl logs`): a container's output, read from the files the kubelet
keeps (devstack.containerlogs), as a real API server proxies the request to the pod's kubelet.

Served: `container` (required when the pod has several), `previous` (the run before the
current one), `follow` (streams until the run ends or the pod goes), `tailLines` and
`limitBytes`. The local kubelet keeps no timestamps, so `timestamps`, `sinceSeconds` and
`sinceTime` are refused with a message saying so.
"""

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from devstack.apiserver.errors import bad_request
from devstack.apiserver.query import flag
from devstack.containerlogs import Run, container_log, read_run, runs
from devstack.podspec import pod_key

FOLLOW_POLL_SECONDS = 0.2

JsonObject = dict[str, Any]


async def serve(
    request: web.Request,
    pod: JsonObject,
    pod_now: Callable[[], JsonObject | None],
    kubelet_root: Path | None,
    stopping: asyncio.Event,
) -> web.StreamResponse:
    """Answer a pods/log request for `pod`; `pod_now` gives the pod as it is at any moment
    (None once deleted), which a followed log ends with."""
    query = request.query
    name = pod["metadata"]["name"]
    for unsupported in ("timestamps", "sinceSeconds", "sinceTime"):
        if unsupported in query and query[unsupported] not in ("", "false"):
            raise bad_request(
                f"{unsupported}: the local kubelet keeps no timestamps of its log lines; "
                "read the whole log, or its last lines (--tail)"
            )
    if kubelet_root is None:
        raise bad_request(
            "this API server was started without --kubelet-root, so it reads no pod logs"
        )
    container = _container(pod, query.get("container", ""))
    log = container_log(kubelet_root, pod_key(pod), container)
    every = runs(log)
    previous = flag(query, "previous")
    if previous and len(every) < 2:
        raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
    if not every:
        waiting = _state(pod, container).get("waiting") or {}
        raise bad_request(
            f'container "{container}" in pod "{name}" is waiting to start: '
            f"{waiting.get('reason', 'ContainerCreating')}"
        )
    index = len(every) - (2 if previous else 1)
    whole = read_run(log, every[index])
    text = _tail(whole, _number(query, "tailLines"))
    limit = _number(query, "limitBytes")
    if limit is not None:
        text = text[:limit]
    if previous or not flag(query, "follow") or limit is not None:
        return web.Response(body=text, content_type="text/plain")
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    await response.write(text)
    offset = len(whole)
    while not stopping.is_set():
        current = runs(log)
        run = current[index] if index < len(current) else Run(every[index].start, None)
        more = read_run(log, run, offset)
        if more:
            await response.write(more)
            offset += len(more)
            continue
        now = pod_now()
        ended = run.end is not None
        stopped = now is None or "running" not in _state(now, container)
        if ended or stopped:
            break
        await asyncio.sleep(FOLLOW_POLL_SECONDS)
    await response.write_eof()
    return response


def _container(pod: JsonObject, asked: str) -> str:
    names = [c["name"] for c in pod.get("spec", {}).get("containers") or []]
    pod_name = pod["metadata"]["name"]
    if not asked:
        if len(names) == 1:
            return str(names[0])
        raise bad_request(
            f"a container name must be specified for pod {pod_name}, choose one of: "
            f"[{' '.join(names)}]"
        )
    if asked not in names:
        raise bad_request(f"container {asked} is not valid for pod {pod_name}")
    return asked


def _state(pod: JsonObject, container: str) -> JsonObject:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state: JsonObject = status.get("state") or {}
            return state
    return {}


def _number(query: Any, name: str) -> int | None:
    text = query.get(name, "")
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise bad_request(f"{name}: {text!r} is not a whole number") from None
    if value < 0:
        raise bad_request(f"{name}: {value} must not be negative")
    return value


def _tail(text: bytes, lines: int | None) -> bytes:
    if lines is None:
        return text
    if lines == 0:
        return b""
    kept = text.splitlines(keepends=True)[-lines:]
    return b"".join(kept)
