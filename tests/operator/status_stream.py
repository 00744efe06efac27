"""Every version of the StreamingApp the API server sends, as `kubectl get --watch` streams it.

A hand-over is short (the owner releases at its next micro-batch boundary and the operator looks
for the release every quarter second), shorter than one of the watcher's polls (two kubectl
calls, seconds on a loaded machine): a scenario that waits for one by polling can miss it and
wait for ever. A stream misses no version and shows it within milliseconds, so a fault meant
for the middle of a hand-over lands there.
"""

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from devstack.demo.scenario import APP_NAME, NAMESPACE, DemoError, Session

Status = dict[str, Any]


def handing_over(status: Status) -> bool:
    """A hand-over is in flight (a task between its old and its new owner)."""
    return any(task.get("handover") for task in status.get("tasks") or [])


class StatusStream:
    def __init__(self, running: Session) -> None:
        self._running = running
        self._seen: list[Status] = []
        self._changed = threading.Condition()
        self._process: subprocess.Popen[str] | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._follow, name="status-stream", daemon=True)
        self._thread.start()

    def wait(self, seen: Callable[[Status], bool], what: str) -> None:
        """Return once some status streamed since the start satisfies `seen`; meanwhile the
        watcher polls (and prints) every 5 s. DemoError after the phase timeout."""
        watcher = self._running.watcher
        deadline = time.monotonic() + self._running.options.phase_timeout
        checked = 0
        next_poll = time.monotonic() + 5
        while True:
            fresh = self._after(checked)
            checked += len(fresh)
            if any(seen(status) for status in fresh):
                return
            now = time.monotonic()
            if now > deadline:
                raise DemoError(
                    f"{what} was not seen within {self._running.options.phase_timeout} s"
                )
            if now >= next_poll:
                watcher.poll()
                self._running.say(watcher.describe())
                next_poll = time.monotonic() + 5

    def _after(self, checked: int) -> list[Status]:
        """The statuses streamed after the first `checked`, waiting up to half a second."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._seen) > checked, timeout=0.5)
            return self._seen[checked:]

    def close(self) -> None:
        self._stopped = True
        if self._process is not None:
            self._process.terminate()
        self._thread.join(10)

    def _follow(self) -> None:
        """Read the watch; start it again when it ends (a watch expires, or the API server
        drops it), for as long as the stream is open."""
        kubectl = self._running.kubectl
        command = [kubectl.binary, "get", "-n", NAMESPACE, "streamingapp", APP_NAME]
        command += ["--watch", "-o", "json"]
        environment = {**os.environ, "KUBECONFIG": str(kubectl.kubeconfig)}
        while not self._stopped:
            self._process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env=environment,
            )  # fmt: skip
            assert self._process.stdout is not None
            lines: list[str] = []
            for line in self._process.stdout:
                lines.append(line)
                if line.rstrip() == "}":  # the end of one object (kubectl indents the rest)
                    status = json.loads("".join(lines)).get("status") or {}
                    lines = []
                    with self._changed:
                        self._seen.append(status)
                        self._changed.notify_all()
            self._process.wait()
            time.sleep(0.2)


@contextmanager
def status_stream(running: Session) -> Iterator[StatusStream]:
    stream = StatusStream(running)
    try:
        yield stream
    finally:
        stream.close()
