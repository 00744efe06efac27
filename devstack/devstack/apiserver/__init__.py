"""A local Kubernetes API server, good enough for the real kubectl and kopf (no cluster needed).

    with LocalApiServer(crd_paths=[Path("crds")]) as server:
        write_kubeconfig(tmp / "kubeconfig", server.url)
        ...  # kubectl --kubeconfig tmp/kubeconfig get streamingapps

It serves plain HTTP on loopback, keeps everything in memory, and runs on its own event loop in
a background thread. docs/local-control-plane.md says what it does and does not do.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import yaml
from aiohttp import web

from devstack.apiserver.server import ApiServer

__all__ = ["LocalApiServer", "serve_forever", "write_kubeconfig"]


class LocalApiServer:
    """The API server on a background thread; a context manager. `url` is valid once started."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        crd_paths: Sequence[Path] = (),
        *,
        watch_history: int = 1000,
        audit_log: Path | None = None,
        kubelet_root: Path | None = None,
    ) -> None:
        """`watch_history` is how many changes per resource a watch can resume across; a watch
        from an older resourceVersion gets 410 Gone. `audit_log` receives an audit Event per
        authorization decision on a ServiceAccount's request (see auth.py). `kubelet_root`:
        the kubelets' pod directories, whose container logs pods/log serves (see logs.py)."""
        self._host = host
        self._port = port
        self._crd_paths = list(crd_paths)
        self._watch_history = watch_history
        self._audit_log = audit_log
        self._kubelet_root = kubelet_root
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._api: ApiServer | None = None
        self.url = ""

    def start(self) -> None:
        """Start serving; returns once the server accepts connections (raises if it cannot)."""
        started = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as error:
                failure.append(error)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="local-apiserver", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            raise failure[0]

    async def _serve(self) -> None:
        self._api = ApiServer(
            history_size=self._watch_history,
            audit_log=self._audit_log,
            kubelet_root=self._kubelet_root,
        )
        self._api.load_crds(self._crd_paths)
        self._runner = web.AppRunner(self._api.application(), shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop serving: open watches end, the thread exits."""
        if self._loop is None or self._thread is None:
            return
        loop, thread = self._loop, self._thread

        async def shutdown() -> None:
            if self._api is not None:
                self._api.stopping.set()
            if self._runner is not None:
                await self._runner.cleanup()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> LocalApiServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def write_kubeconfig(path: Path, url: str, namespace: str = "default") -> None:
    """A kubeconfig whose current context talks to the server at `url` (no credentials)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "smoothscale-local", "cluster": {"server": url}}],
        "users": [{"name": "smoothscale-local", "user": {}}],
        "contexts": [
            {
                "name": "smoothscale-local",
                "context": {
                    "cluster": "smoothscale-local",
                    "user": "smoothscale-local",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "smoothscale-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def serve_forever(
    host: str,
    port: int,
    crd_paths: Sequence[Path],
    audit_log: Path | None = None,
    kubelet_root: Path | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT; prints the URL once serving."""
    server = LocalApiServer(host, port, crd_paths, audit_log=audit_log, kubelet_root=kubelet_root)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with server:
        print(server.url, flush=True)
        stop.wait()
