"""Container probes (exec and HTTP GET), and the thresholds that turn results into a verdict."""

import http.client
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ExecAction:
    """Succeeds when `command` exits 0 within the probe's timeout."""

    command: tuple[str, ...]


@dataclass(frozen=True)
class HttpGetAction:
    """Succeeds when GET `path` answers with a status from 200 to 399 within the timeout."""

    port: int
    path: str = "/"
    host: str = "127.0.0.1"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Probe:
    """A Kubernetes probe: times in seconds (fractions allowed here), thresholds in results."""

    action: ExecAction | HttpGetAction
    initial_delay_seconds: float = 0.0
    period_seconds: float = 10.0
    timeout_seconds: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def run_probe(probe: Probe, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> bool:
    """Run the probe's action once; True when it succeeded."""
    action = probe.action
    if isinstance(action, ExecAction):
        return _run_exec(action, probe.timeout_seconds, env, cwd)
    return _run_http_get(action, probe.timeout_seconds)


def _run_exec(
    action: ExecAction, timeout: float, env: Mapping[str, str] | None, cwd: Path | None
) -> bool:
    try:
        result = subprocess.run(
            action.command,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _run_http_get(action: HttpGetAction, timeout: float) -> bool:
    connection_class = (
        http.client.HTTPSConnection
        if action.scheme.upper() == "HTTPS"
        else http.client.HTTPConnection
    )
    connection = connection_class(action.host, action.port, timeout=timeout)
    try:
        connection.request("GET", action.path, headers=dict(action.headers))
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return 200 <= status < 400


class ProbeVerdict:
    """Consecutive results -> the probe's standing verdict, with Kubernetes' thresholds:
    `success_threshold` successes in a row make it pass, `failure_threshold` failures in a row
    make it fail, and it keeps its verdict in between."""

    def __init__(self, probe: Probe, initially: bool) -> None:
        self._probe = probe
        self.passing = initially
        self._successes = 0
        self._failures = 0

    def record(self, success: bool) -> bool:
        """Count one result; return the (possibly new) verdict."""
        if success:
            self._successes += 1
            self._failures = 0
            if self._successes >= self._probe.success_threshold:
                self.passing = True
        else:
            self._failures += 1
            self._successes = 0
            if self._failures >= self._probe.failure_threshold:
                self.passing = False
        return self.passing

    @property
    def failed(self) -> bool:
        """`failure_threshold` failures in a row, the last result included."""
        return self._failures >= self._probe.failure_threshold
