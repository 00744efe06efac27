"""Fixtures of the test bed's tests: a client of a fresh API server."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.apiserver import LocalApiServer, write_kubeconfig
from smoothscale.kubeapi import KubeApi
from tests.devstack.apiserver.conftest import HERE as APISERVER_TESTS


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[KubeApi]:
    """A client of a fresh LocalApiServer that serves, besides the built-in kinds, Widgets
    (tests/devstack/apiserver/widget-crd.yaml: a custom kind with a scale subresource)."""
    with LocalApiServer(crd_paths=[APISERVER_TESTS / "widget-crd.yaml"]) as server:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, server.url)
        client = KubeApi.from_kubeconfig(kubeconfig)
        yield client
        client.close()
