"""Fixtures: a LocalApiServer per test, a kubeconfig for it, and the real kubectl."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from devstack.apiserver import LocalApiServer, write_kubeconfig

ROOT = Path(__file__).resolve().parents[3]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
HERE = Path(__file__).parent
CRD_PATHS = [ROOT / "crds", HERE / "widget-crd.yaml"]


@dataclass
class Kubectl:
    """The real kubectl binary, pointed at one server through its own kubeconfig and cache."""

    kubeconfig: Path
    cache: Path

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self.cache)}
        return subprocess.run(
            [str(KUBECTL), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 30) -> str:
        """Run kubectl and return its stdout; a failure fails the test with kubectl's stderr."""
        result = self.run(*args, stdin=stdin, timeout=timeout)
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


@dataclass
class Api:
    """Plain HTTP access to the server, for what kubectl cannot show (watches from a version)."""

    url: str

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(method, self.url + path, timeout=10, **kwargs)


@pytest.fixture
def server() -> Iterator[LocalApiServer]:
    with LocalApiServer(crd_paths=CRD_PATHS, watch_history=20) as running:
        yield running


@pytest.fixture
def kubeconfig(server: LocalApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, server.url)
    return path


@pytest.fixture
def kubectl(kubeconfig: Path, tmp_path: Path) -> Kubectl:
    assert KUBECTL.exists(), f"{KUBECTL} is missing: run scripts/install-tools"
    return Kubectl(kubeconfig=kubeconfig, cache=tmp_path / "kube-cache")


@pytest.fixture
def api(server: LocalApiServer) -> Api:
    return Api(server.url)
