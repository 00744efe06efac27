"""Rendering the chart with the real helm binary, for the chart's tests."""

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "smoothscale"
HELM = ROOT / ".tools" / "bin" / "helm"
RELEASE = "rel"
NAMESPACE = "apps"

Manifest = dict[str, Any]


def run_helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs helm with its own empty config and cache, no cluster, and the values as a file."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run scripts/install-tools")
    with tempfile.TemporaryDirectory(prefix="helm-") as home:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": home,
            "HELM_CACHE_HOME": f"{home}/cache",
            "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_DATA_HOME": f"{home}/data",
            "KUBECONFIG": f"{home}/no-kubeconfig",
        }
        command = [str(HELM), *args]
        if values is not None:
            values_file = Path(home) / "values.json"
            values_file.write_text(json.dumps(values))
            command += ["--values", str(values_file)]
        return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def render(values: dict[str, Any] | None = None, *, include_crds: bool = False) -> list[Manifest]:
    """The objects `helm template` renders for these values, in the namespace `apps`."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if include_crds:
        args.append("--include-crds")
    result = run_helm(*args, values=values or {})
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(values: dict[str, Any]) -> str:
    """The error helm reports for values it must refuse."""
    result = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values)
    assert result.returncode != 0, f"helm accepted {values}:\n{result.stdout}"
    return result.stderr


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = of_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]
