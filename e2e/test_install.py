"""The install path, end to end with the real kubectl: the CRD installs, a StreamingApp is
defaulted, shown at a glance, scaled through the scale subresource, and bad specs are refused.

On the local control plane this checks the CRD, kubectl and our API server together; against a
real cluster (SMOOTHSCALE_E2E_KUBECONFIG, see conftest.py) it checks that the real API server
accepts the generated CRD, its CEL rules included, and refuses what our schema claims to.
"""

import copy
import json
from typing import Any

import pytest
import yaml
from tests.api.test_invalid import CASES, broken

from e2e.kube import REPOSITORY, Kubectl

CRD_FILE = REPOSITORY / "crds" / "streamingapp.yaml"
CRD_NAME = "streamingapps.smoothscale.io"
pytestmark = pytest.mark.cluster

EXAMPLE: dict[str, Any] = yaml.safe_load(
    (REPOSITORY / "examples" / "streamingapp.yaml").read_text()
)


@pytest.fixture(scope="module")
def crd(kubectl: Kubectl) -> str:
    kubectl.ok("apply", "-f", str(CRD_FILE))
    kubectl.ok("wait", "--for", "condition=Established", f"crd/{CRD_NAME}", "--timeout", "60s")
    return CRD_NAME


def example_in(namespace: str) -> dict[str, Any]:
    app = copy.deepcopy(EXAMPLE)
    app["metadata"]["namespace"] = namespace
    return app


def apply(kubectl: Kubectl, obj: dict[str, Any]) -> Any:
    return kubectl.run("apply", "-f", "-", stdin=json.dumps(obj))


def test_a_streamingapp_is_stored_with_the_scaling_defaults(
    kubectl: Kubectl, crd: str, namespace: str
) -> None:
    app = example_in(namespace)
    del app["spec"]["scaling"]
    kubectl.ok("apply", "-f", "-", stdin=json.dumps(app))
    stored = kubectl.json("get", "streamingapp", app["metadata"]["name"], "-n", namespace)
    assert stored["spec"]["scaling"]["acceptableRecoveryLag"] == 10_000
    assert stored["spec"]["scaling"]["maxWarmupReplicas"] == 2
    assert stored["spec"]["scaling"]["numStandbyReplicas"] == 0


def test_kubectl_get_shows_the_app_at_a_glance_by_its_short_name(
    kubectl: Kubectl, crd: str, namespace: str
) -> None:
    kubectl.ok("apply", "-f", "-", stdin=json.dumps(example_in(namespace)))
    table = kubectl.ok("get", "ssa", "-n", namespace)
    header = table.splitlines()[0].split()
    assert header == [
        "NAME",
        "DESIRED",
        "READY",
        "ACTIVE",
        "WARM-UP",
        "MAX-LAG",
        "INPUT-LAG",
        "PHASE",
        "AGE",
    ]
    assert table.splitlines()[1].split()[:2] == [EXAMPLE["metadata"]["name"], "2"]


def test_kubectl_scale_changes_the_desired_replicas_through_the_scale_subresource(
    kubectl: Kubectl, crd: str, namespace: str
) -> None:
    name = EXAMPLE["metadata"]["name"]
    kubectl.ok("apply", "-f", "-", stdin=json.dumps(example_in(namespace)))
    before = kubectl.json("get", "streamingapp", name, "-n", namespace)
    kubectl.ok("scale", "streamingapp", name, "-n", namespace, "--replicas", "5")
    after = kubectl.json("get", "streamingapp", name, "-n", namespace)
    assert after["spec"]["replicas"] == 5
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    scale = kubectl.json("get", "streamingapp", name, "-n", namespace, "--subresource", "scale")
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 5


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_an_invalid_streamingapp_is_refused_naming_the_field(
    kubectl: Kubectl, crd: str, namespace: str, case: dict[str, Any]
) -> None:
    app = broken(example_in(namespace), case)
    refused = apply(kubectl, app)
    assert refused.returncode != 0, f"accepted: {case['case']}"
    field = case["path"].removeprefix("metadata.")
    assert field in refused.stderr or field.rsplit(".", 1)[-1] in refused.stderr, refused.stderr
    name = app.get("metadata", {}).get("name", EXAMPLE["metadata"]["name"])
    missing = kubectl.run("get", "streamingapp", str(name), "-n", namespace)
    assert missing.returncode != 0, "nothing may be stored for a refused spec"
