"""The entry points `smoothscale dev` builds on: serve_forever and write_kubeconfig."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from devstack.apiserver import LocalApiServer, write_kubeconfig
from tests.devstack.apiserver.conftest import ROOT


def test_serve_forever_prints_its_url_serves_the_crds_and_stops_on_sigterm() -> None:
    code = (
        "import sys; from pathlib import Path;"
        "from devstack.apiserver import serve_forever;"
        "serve_forever('127.0.0.1', 0, [Path(sys.argv[1])])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(ROOT / "crds")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        discovery = requests.get(f"{url}/apis/smoothscale.io/v1alpha1", timeout=5).json()
        assert "streamingapps/scale" in [resource["name"] for resource in discovery["resources"]]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.wait()


def test_the_kubeconfig_points_at_the_server_and_namespace(tmp_path: Path) -> None:
    write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1234", namespace="shop")

    config = yaml.safe_load((tmp_path / "config").read_text())

    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    assert cluster["cluster"]["server"] == "http://127.0.0.1:1234"
    assert context["context"]["namespace"] == "shop"


def test_a_port_in_use_fails_start_with_the_os_error() -> None:
    with LocalApiServer() as first:
        port = int(first.url.rsplit(":", 1)[1])
        second = LocalApiServer(port=port)

        with pytest.raises(OSError, match="address already in use"):
            second.start()

        assert requests.get(f"{first.url}/healthz", timeout=5).text == "ok"
