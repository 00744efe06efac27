"""Real `smoothscale worker` processes (PySpark inside) for the process-level tests."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devstack.stack import free_port
from smoothscale.runtime.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """`smoothscale worker --config FILE` in its own process group (the Python driver and its
    Spark JVM), logging to a file next to its state."""

    def __init__(self, config: WorkerConfig, environment: dict[str, str] | None = None) -> None:
        self.config = config.model_copy(update={"metrics_port": free_port()})
        self.environment = environment or {}
        """Set in the worker's environment, beside the test's own."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.config.state_dir.parent / f"{self.config.instance_id}.json"
        self.config_path.write_text(self.config.model_dump_json())
        self.log_path = self.config.state_dir.parent / f"{self.config.instance_id}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> "WorkerProcess":
        # This checkout's product code first: the venv may have another checkout installed.
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]),
            **self.environment,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "smoothscale.cli",
                    "worker",
                    "--config",
                    str(self.config_path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM to the worker's process, as the kubelet sends it to a container's PID 1."""
        os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the whole process group: the driver and its JVM die at once."""
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)

    def wait(self, timeout: float) -> int:
        """The exit code; if the worker has not exited in time, fail with its threads' stacks."""
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError(
                f"{self.config.instance_id} did not exit within {timeout} s:\n{self.log()[-12000:]}"
            ) from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> str:
        import urllib.request

        url = f"http://127.0.0.1:{self.config.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read()
            return body.decode()

    def ready(self) -> bool:
        """Whether /readyz answers 200 (the streaming query runs)."""
        import urllib.error
        import urllib.request

        url = f"http://127.0.0.1:{self.config.metrics_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def stop(self) -> None:
        """Clean up whatever is left of the process group (tests call it in `finally`)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(10)


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, workers: list[WorkerProcess]
) -> None:
    """Wait for `condition`, failing early (with the logs) if a worker dies."""
    deadline = time.monotonic() + timeout
    while not condition():
        for worker in workers:
            if worker.process is not None and not worker.alive() and worker.process.returncode != 0:
                raise AssertionError(
                    f"{worker.config.instance_id} exited with {worker.process.returncode} while "
                    f"waiting for {what}:\n{worker.log()[-6000:]}"
                )
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {w.config.instance_id}\n{w.log()[-4000:]}" for w in workers)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")
        time.sleep(0.3)
