"""The real kubectl and helm, bound to one cluster, for the end-to-end scenarios."""

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent.parent
CHART = REPOSITORY / "charts" / "smoothscale"


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl, bound to one cluster."""

    binary: str
    kubeconfig: Path

    def run(
        self, *arguments: str, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, "--kubeconfig", str(self.kubeconfig), *arguments],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *arguments: str, stdin: str | None = None, timeout: float = 60) -> str:
        """Run kubectl and return its output; fail the test with its stderr if it fails."""
        done = self.run(*arguments, stdin=stdin, timeout=timeout)
        assert done.returncode == 0, f"kubectl {' '.join(arguments)}: {done.stderr}"
        return done.stdout

    def json(self, *arguments: str) -> Any:
        return json.loads(self.ok(*arguments, "-o", "json"))

    def wait_for(
        self, done: Callable[[], bool], what: str, timeout: float = 300, every: float = 2
    ) -> None:
        """Poll `done` until true; fail naming `what` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
            time.sleep(every)


@dataclass(frozen=True)
class Helm:
    """The real helm, bound to the same cluster, with a configuration of its own."""

    binary: str
    kubeconfig: Path
    home: Path

    def ok(self, *arguments: str, timeout: float = 300) -> str:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [self.binary, *arguments],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"helm {' '.join(arguments)}: {done.stderr}"
        return done.stdout


def tool_binary(name: str) -> str:
    found = shutil.which(name) or str(REPOSITORY / ".tools" / "bin" / name)
    assert Path(found).exists(), f"{name} is missing: run scripts/install-tools"
    return found


def kubectl_binary() -> str:
    return tool_binary("kubectl")
