"""Watch streams: one JSON event per line until timeoutSeconds, from the store's changes."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from dataclasses import dataclass

from aiohttp import web

from devstack.apiserver import query, tables
from devstack.apiserver.errors import ApiError, JsonObject
from devstack.apiserver.registry import ResourceType
from devstack.apiserver.selectors import Predicate
from devstack.apiserver.store import Change, Store

DEFAULT_TIMEOUT = 1800.0
"""Seconds a watch lasts without timeoutSeconds (a real server picks 30-60 minutes)."""
BOOKMARK_INTERVAL = 60.0


@dataclass(frozen=True)
class WatchRequest:
    """What one watch asked for."""

    rt: ResourceType
    namespace: str
    """"" for all namespaces."""
    matches: Predicate
    deadline: float
    """time.monotonic() at which the stream ends (timeoutSeconds)."""
    bookmarks: bool
    initial_events: bool
    table_objects: str | None
    """None for plain objects, else the Table rows' includeObject (None, Object, Metadata)."""

    def selects(self, obj: JsonObject | None) -> bool:
        if obj is None:
            return False
        in_namespace = not self.namespace or obj["metadata"].get("namespace") == self.namespace
        return in_namespace and self.matches(obj)


async def _send(response: web.StreamResponse, event: JsonObject) -> None:
    await response.write(json.dumps(event).encode() + b"\n")


async def _send_change(response: web.StreamResponse, watch: WatchRequest, change: Change) -> None:
    """An object entering the watched set is ADDED, one leaving it DELETED, as a real watch
    with a selector reports them."""
    now_in, was_in = watch.selects(change.object), watch.selects(change.old)
    if change.type == "DELETED" or not now_in:
        event_type = "DELETED" if was_in else None
    else:
        event_type = "MODIFIED" if was_in else "ADDED"
    if event_type is None:
        return
    obj = watch.rt.stamp(copy.deepcopy(change.object))
    if watch.table_objects is not None:
        version = obj["metadata"]["resourceVersion"]
        obj = tables.table(watch.rt, [obj], version, watch.table_objects)
    await _send(response, {"type": event_type, "object": obj})


async def _send_bookmark(
    response: web.StreamResponse,
    rt: ResourceType,
    version: int,
    *,
    initial_events_end: bool = False,
) -> None:
    meta: JsonObject = {"resourceVersion": str(version)}
    if initial_events_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    bookmark = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}
    await _send(response, {"type": "BOOKMARK", "object": bookmark})


def watch_request(
    request: web.Request, rt: ResourceType, namespace: str, matches: Predicate
) -> WatchRequest:
    params = request.query
    return WatchRequest(
        rt=rt,
        namespace=namespace,
        matches=matches,
        deadline=time.monotonic() + query.number(params, "timeoutSeconds", DEFAULT_TIMEOUT),
        bookmarks=query.flag(params, "allowWatchBookmarks"),
        initial_events=query.flag(params, "sendInitialEvents"),
        table_objects=params.get("includeObject", "Metadata")
        if "as=Table" in request.headers.get("Accept", "")
        else None,
    )


async def _stream(request: web.Request) -> web.StreamResponse:
    """A watch's 200 response, started: its events follow as JSON lines."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response


async def serve_watch_error(request: web.Request, error: JsonObject) -> web.StreamResponse:
    """A watch that fails once it has started: a 200 stream with one ERROR event, as a real
    server answers a watch from an expired resourceVersion (410)."""
    response = await _stream(request)
    await _send(response, {"type": "ERROR", "object": error})
    return response


async def serve_watch(
    request: web.Request,
    watch: WatchRequest,
    store: Store,
    stopping: asyncio.Event,
    ended: asyncio.Event,
) -> web.StreamResponse:
    """Stream the changes after the request's resourceVersion (or the current objects first,
    without one) until the deadline (then a bookmark, if allowed), `stopping` (the server's) or
    `ended` (this watch's: the server ends it early, as a real one does at its timeout). An
    expired resourceVersion is an ERROR event with a 410 Status, as from a real server."""
    since_text = request.query.get("resourceVersion", "")
    since = None
    if since_text not in ("", "0") and not watch.initial_events:
        since = int(query.number(request.query, "resourceVersion", 0))
    try:
        subscription = store.watch(watch.rt, since)
    except ApiError as error:
        return await serve_watch_error(request, error.status())
    queue = subscription.queue
    try:
        response = await _stream(request)
        if watch.initial_events and watch.bookmarks:
            for _ in range(queue.qsize()):
                await _send_change(response, watch, queue.get_nowait())
            await _send_bookmark(
                response, watch.rt, store.resource_version, initial_events_end=True
            )
        next_bookmark = time.monotonic() + BOOKMARK_INTERVAL
        while not (stopping.is_set() or ended.is_set()):
            remaining = watch.deadline - time.monotonic()
            if remaining <= 0:
                if watch.bookmarks:
                    await _send_bookmark(response, watch.rt, store.resource_version)
                break
            try:
                change = await asyncio.wait_for(queue.get(), timeout=min(remaining, 1.0))
            except TimeoutError:
                if watch.bookmarks and time.monotonic() >= next_bookmark:
                    next_bookmark = time.monotonic() + BOOKMARK_INTERVAL
                    await _send_bookmark(response, watch.rt, store.resource_version)
                continue
            await _send_change(response, watch, change)
    finally:
        store.unwatch(subscription)
    return response
