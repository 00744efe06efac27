"""The real kubectl against the local API server: each verb the issue names, round trip."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from pathlib import Path

import yaml

from devstack.apiserver import LocalApiServer, write_kubeconfig
from tests.devstack.apiserver.conftest import KUBECTL, ROOT, Kubectl

STREAMING_APP = """
apiVersion: smoothscale.io/v1alpha1
kind: StreamingApp
metadata:
  name: counts
spec:
  replicas: 2
  image: smoothscale:dev
  pipeline: {ref: "examples.pipelines.running_count:pipeline"}
  kafka:
    bootstrapServers: "127.0.0.1:9092"
    inputTopics: [page-views]
    outputTopic: page-view-counts
    stateStores: [{name: counts}]
"""

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: worker-0
  labels: {app: counts}
spec:
  containers:
    - name: main
      image: smoothscale:dev
      env: [{name: ROLE, value: worker}]
    - name: sidecar
      image: busybox
"""


def streaming_app(**spec: object) -> str:
    manifest = yaml.safe_load(STREAMING_APP)
    manifest["spec"].update(spec)
    return yaml.safe_dump(manifest)


def test_kubectl_apply_of_the_crds_directory_serves_streamingapps(tmp_path: Path) -> None:
    with LocalApiServer() as bare:
        write_kubeconfig(tmp_path / "kubeconfig", bare.url)
        kubectl = Kubectl(tmp_path / "kubeconfig", tmp_path / "cache")
        assert "streamingapps" not in kubectl("get", "crd", "-o", "name")

        kubectl("apply", "-f", str(ROOT / "crds"))
        kubectl("wait", "--for=condition=Established", "crd/streamingapps.smoothscale.io")
        kubectl("apply", "-f", "-", stdin=STREAMING_APP)

        assert kubectl("get", "ssa", "-o", "name").split() == ["streamingapp.smoothscale.io/counts"]


def test_get_shows_the_printer_columns_and_wide_adds_the_priority_ones(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)
    kubectl(
        "apply",
        "-f",
        "-",
        stdin="apiVersion: example.smoothscale.io/v1\nkind: Widget\n"
        "metadata: {name: w}\nspec: {color: red}\n",
    )

    header, row = kubectl("get", "streamingapps").splitlines()
    assert header.split() == [
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
    assert row.split()[:2] == ["counts", "2"]
    assert kubectl("get", "widgets").splitlines()[0].split() == ["NAME", "DESIRED", "PHASE", "AGE"]
    wide_header, wide_row = kubectl("get", "widgets", "-o", "wide").splitlines()
    assert wide_header.split() == ["NAME", "DESIRED", "PHASE", "COLOR", "AGE"]
    assert wide_row.split()[:3] == ["w", "1", "red"]  # no phase yet: an empty cell


def test_created_objects_carry_server_metadata_and_schema_defaults(kubectl: Kubectl) -> None:
    kubectl("create", "-f", "-", stdin=STREAMING_APP)

    app = kubectl.json("get", "streamingapp", "counts")

    meta = app["metadata"]
    assert meta["generation"] == 1
    assert len(meta["uid"]) == 36
    assert meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert app["spec"]["scaling"]["acceptableRecoveryLag"] == 10000  # a CRD default
    listed = yaml.safe_load(kubectl("get", "streamingapps", "-o", "yaml"))
    assert [item["metadata"]["name"] for item in listed["items"]] == ["counts"]


def test_an_invalid_streamingapp_is_refused_naming_the_field(kubectl: Kubectl) -> None:
    result = kubectl.run("apply", "-f", "-", stdin=streaming_app(replicas=-1))

    assert result.returncode != 0
    assert 'StreamingApp "counts" is invalid' in result.stderr
    assert "spec.replicas: Invalid value: -1" in result.stderr
    assert kubectl.run("get", "streamingapp", "counts").returncode != 0


def test_an_unknown_field_is_refused_as_kubectl_asks_for_strict_validation(
    kubectl: Kubectl,
) -> None:
    result = kubectl.run("apply", "-f", "-", stdin=streaming_app(replicaz=3))

    assert result.returncode != 0
    assert 'unknown field "spec.replicaz"' in result.stderr


def test_scale_sets_replicas_through_the_scale_subresource_and_bumps_generation(
    kubectl: Kubectl,
) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)

    kubectl("scale", "streamingapp", "counts", "--replicas", "4")

    app = kubectl.json("get", "streamingapp", "counts")
    assert app["spec"]["replicas"] == 4
    assert app["metadata"]["generation"] == 2
    scale = kubectl.json("get", "streamingapp", "counts", "--subresource", "scale")
    assert (scale["apiVersion"], scale["kind"], scale["spec"]) == (
        "autoscaling/v1",
        "Scale",
        {"replicas": 4},
    )


def test_status_writes_leave_generation_and_spec_alone(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)

    kubectl(
        "patch",
        "streamingapp",
        "counts",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        '{"status": {"readyReplicas": 2, "phase": "Running"}, "spec": {"replicas": 9}}',
    )
    kubectl(
        "patch", "streamingapp", "counts", "--type", "merge", "-p", '{"status": {"phase": "Lost"}}'
    )

    app = kubectl.json("get", "streamingapp", "counts")
    assert (app["status"]["readyReplicas"], app["status"]["phase"]) == (2, "Running")
    assert app["spec"]["replicas"] == 2
    assert app["metadata"]["generation"] == 1
    assert kubectl("get", "streamingapps").splitlines()[1].split()[1:3] == ["2", "2"]


def test_client_side_apply_updates_and_removes_fields_it_applied_before(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=streaming_app(serviceAccountName="runner"))

    out = kubectl("apply", "-f", "-", stdin=streaming_app(replicas=3))

    assert "configured" in out
    spec = kubectl.json("get", "streamingapp", "counts")["spec"]
    assert spec["replicas"] == 3
    assert "serviceAccountName" not in spec


def test_server_side_apply_creates_then_merges(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "-f", "-", stdin=STREAMING_APP)
    kubectl("apply", "--server-side", "-f", "-", stdin=streaming_app(replicas=5))

    assert kubectl.json("get", "streamingapp", "counts")["spec"]["replicas"] == 5


def test_patch_merge_and_json_and_label_a_streamingapp(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)

    kubectl(
        "patch",
        "streamingapp",
        "counts",
        "--type",
        "merge",
        "-p",
        '{"spec": {"image": "smoothscale:2"}}',
    )
    kubectl(
        "patch",
        "streamingapp",
        "counts",
        "--type",
        "json",
        "-p",
        '[{"op": "replace", "path": "/spec/replicas", "value": 3}]',
    )
    kubectl("label", "streamingapp", "counts", "team=data")

    app = kubectl.json("get", "streamingapp", "counts")
    assert (app["spec"]["image"], app["spec"]["replicas"]) == ("smoothscale:2", 3)
    assert app["metadata"]["labels"] == {"team": "data"}
    assert kubectl("get", "ssa", "-l", "team=data", "-o", "name").split() == [
        "streamingapp.smoothscale.io/counts"
    ]
    assert kubectl("get", "ssa", "-l", "team!=data", "-o", "name").split() == []


def test_a_strategic_merge_patch_is_refused_for_a_custom_resource(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)

    result = kubectl.run(
        "patch", "streamingapp", "counts", "--type", "strategic", "-p", '{"spec": {"replicas": 3}}'
    )

    assert result.returncode != 0
    assert "UnsupportedMediaType" in result.stderr or "not supported" in result.stderr


def test_delete_removes_the_streamingapp(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)

    kubectl("delete", "streamingapp", "counts", "--timeout", "10s")

    result = kubectl.run("get", "streamingapp", "counts")
    assert 'streamingapps.smoothscale.io "counts" not found' in result.stderr


def test_get_watch_prints_each_change(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)
    watcher = subprocess.Popen(
        [str(KUBECTL), "get", "streamingapps", "-w", "--output-watch-events"],
        env={"KUBECONFIG": str(kubectl.kubeconfig), "KUBECACHEDIR": str(kubectl.cache)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        kubectl("scale", "streamingapp", "counts", "--replicas", "3")
        kubectl("delete", "streamingapp", "counts")
        time.sleep(1.0)
    finally:
        watcher.terminate()
        out, _ = watcher.communicate(timeout=10)

    events = [line.split()[:3] for line in out.splitlines()[1:]]
    assert events == [
        ["ADDED", "counts", "2"],
        ["MODIFIED", "counts", "3"],
        ["DELETED", "counts", "3"],
    ]


def test_a_stale_resource_version_gets_a_conflict(kubectl: Kubectl, tmp_path: Path) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)
    stale = kubectl.json("get", "streamingapp", "counts")
    kubectl("scale", "streamingapp", "counts", "--replicas", "3")
    stale["spec"]["replicas"] = 7

    result = kubectl.run("replace", "-f", "-", stdin=json.dumps(stale))

    assert result.returncode != 0
    assert "the object has been modified" in result.stderr
    assert kubectl.json("get", "streamingapp", "counts")["spec"]["replicas"] == 3


def test_pods_create_get_wide_strategic_patch_describe_and_delete(kubectl: Kubectl) -> None:
    kubectl("create", "-f", "-", stdin=POD)
    pod = kubectl.json("get", "pod", "worker-0")
    kubectl(
        "create",
        "-f",
        "-",
        stdin=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "worker-0.1"},
                "involvedObject": {
                    "kind": "Pod",
                    "name": "worker-0",
                    "namespace": "default",
                    "uid": pod["metadata"]["uid"],
                },
                "reason": "Started",
                "message": "started the worker",
                "type": "Normal",
            }
        ),
    )

    kubectl(
        "patch",
        "pod",
        "worker-0",
        "-p",
        '{"spec": {"containers": [{"name": "main", "env": [{"name": "EXTRA", "value": "1"}]}]}}',
    )

    containers = kubectl.json("get", "pod", "worker-0")["spec"]["containers"]
    assert [container["name"] for container in containers] == ["main", "sidecar"]
    assert [env["name"] for env in containers[0]["env"]] == ["ROLE", "EXTRA"]
    header = kubectl("get", "pods", "-o", "wide").splitlines()[0].split()
    assert header == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
        "NOMINATED",
        "NODE",
        "READINESS",
        "GATES",
    ]
    assert kubectl("get", "pods").splitlines()[1].split()[:3] == ["worker-0", "0/2", "Pending"]
    described = kubectl("describe", "pod", "worker-0")
    assert "Labels:       app=counts" in described
    assert "started the worker" in described
    assert "started the worker" in kubectl("get", "events")

    kubectl("delete", "pod", "worker-0", "--timeout", "10s")
    kubectl("delete", "event", "worker-0.1")

    assert kubectl("get", "pods", "-o", "name") == ""
    assert kubectl("get", "events", "-o", "name") == ""


def test_pods_json_patch_and_label_selector(kubectl: Kubectl) -> None:
    kubectl("create", "-f", "-", stdin=POD)

    kubectl(
        "patch",
        "pod",
        "worker-0",
        "--type",
        "json",
        "-p",
        '[{"op": "add", "path": "/metadata/labels/role", "value": "active"}]',
    )
    kubectl("label", "pod", "worker-0", "app-")

    assert kubectl("get", "pods", "-l", "role=active", "-o", "name").split() == ["pod/worker-0"]
    assert kubectl("get", "pods", "-l", "app", "-o", "name") == ""


def test_typed_create_commands_that_send_protobuf_work(kubectl: Kubectl) -> None:
    kubectl("create", "namespace", "shop")
    kubectl("create", "configmap", "settings", "-n", "shop", "--from-literal=mode=fast")
    kubectl("create", "secret", "generic", "kafka", "-n", "shop", "--from-literal=password=hunter2")
    kubectl("create", "serviceaccount", "runner", "-n", "shop")

    assert kubectl.json("get", "configmap", "settings", "-n", "shop")["data"] == {"mode": "fast"}
    secret = kubectl.json("get", "secret", "kafka", "-n", "shop")
    assert base64.b64decode(secret["data"]["password"]) == b"hunter2"
    assert kubectl("get", "serviceaccounts", "-n", "shop", "-o", "name").split() == [
        "serviceaccount/default",
        "serviceaccount/runner",
    ]
    assert "shop" in kubectl("get", "namespaces", "-o", "name")


def test_reapplying_an_unchanged_crd_changes_nothing(kubectl: Kubectl) -> None:
    out = kubectl("apply", "-f", str(ROOT / "crds"))
    again = kubectl("apply", "-f", str(ROOT / "crds"))

    assert "configured" in out  # the server loaded it at start, without kubectl's annotation
    assert "unchanged" in again


def test_describe_a_streamingapp_shows_its_spec_and_events(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STREAMING_APP)
    app = kubectl.json("get", "streamingapp", "counts")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "counts.1"},
        "involvedObject": {
            "apiVersion": "smoothscale.io/v1alpha1",
            "kind": "StreamingApp",
            "name": "counts",
            "namespace": "default",
            "uid": app["metadata"]["uid"],
        },
        "reason": "ScalingOut",
        "message": "warming up 1 instance",
        "type": "Normal",
    }
    kubectl("create", "-f", "-", stdin=json.dumps(event))

    described = kubectl("describe", "streamingapp", "counts")

    assert "Kind:         StreamingApp" in described
    assert re.search(r"^  Replicas: +2$", described, re.MULTILINE)
    assert "warming up 1 instance" in described


def test_validate_warn_creates_without_the_unknown_field_and_warns(kubectl: Kubectl) -> None:
    result = kubectl.run("apply", "--validate=warn", "-f", "-", stdin=streaming_app(replicaz=3))

    assert result.returncode == 0, result.stderr
    assert 'Warning: unknown field "spec.replicaz"' in result.stderr
    assert "replicaz" not in kubectl.json("get", "streamingapp", "counts")["spec"]
