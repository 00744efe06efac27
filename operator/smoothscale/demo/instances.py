"""Instances as local processes: real `smoothscale worker` processes, each its own Spark driver.

The demo runs instances the way the process kubelet of the local control plane runs pods: one
process per instance, its own working directory, its own metrics port; readiness is the
instance's /readyz endpoint.
"""

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from smoothscale.runtime.config import WorkerConfig


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class LocalInstance:
    """One running worker process."""

    id: str
    process: "subprocess.Popen[bytes]"
    metrics_port: int
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        if not self.alive():
            return False
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=0.5) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def terminate(self, grace: float) -> int:
        """Stop it as Kubernetes stops a container: SIGTERM to the main process only (the
        worker then stops its Spark JVM itself), SIGKILL to everything after `grace` seconds;
        the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait()


class LocalInstances:
    """Starts and stops worker processes that share one base configuration."""

    def __init__(
        self, base: WorkerConfig, workdir: Path, extra_env: Mapping[str, str] | None = None
    ) -> None:
        self._base = base
        self._workdir = workdir
        self._extra_env = dict(extra_env or {})
        self.running: dict[str, LocalInstance] = {}

    def start(self, instance_id: str) -> LocalInstance:
        home = self._workdir / instance_id
        home.mkdir(parents=True, exist_ok=True)
        port = free_port()
        config = self._base.model_copy(
            update={
                "instance_id": instance_id,
                "state_dir": home / "state",
                "metrics_port": port,
            }
        )
        config_path = home / "worker.json"
        config_path.write_text(config.model_dump_json(indent=2))
        log_path = home / "worker.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "smoothscale.cli", "worker", "--config", str(config_path)],
                cwd=home,
                env={**os.environ, **self._extra_env, "POD_NAME": instance_id},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        instance = LocalInstance(instance_id, process, port, log_path)
        self.running[instance_id] = instance
        return instance

    def stop(self, instance_id: str, grace: float) -> int:
        return self.running.pop(instance_id).terminate(grace)

    def stop_all(self, grace: float) -> None:
        for instance_id in list(self.running):
            self.stop(instance_id, grace)
