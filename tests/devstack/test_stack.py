"""`smoothscale dev up` / `down` and the `local_cluster` fixture: the four parts together."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from devstack.kafka.control import KafkaControl
from devstack.stack import StackInfo
from smoothscale.kubeapi import KubeApi

REPOSITORY = Path(__file__).resolve().parents[2]


def kubectl_binary() -> str:
    found = shutil.which("kubectl") or str(REPOSITORY / ".tools" / "bin" / "kubectl")
    assert Path(found).exists(), "kubectl is missing: run scripts/install-tools"
    return found


def smoothscale(
    *arguments: str, cwd: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "smoothscale.cli", *arguments],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_dev_up_serves_kubectl_and_dev_down_stops_everything(tmp_path: Path) -> None:
    # Run from a directory with no crds/: the StreamingApp CRD comes from the models.
    state_dir = tmp_path / "dev"
    up = smoothscale(
        "dev", "up", "--state-dir", str(state_dir), "--topic", "input:4", "--kafka-port", "0",
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in up.stdout.splitlines()
            if line.startswith("export ")
        )
        assert exports["KUBECONFIG"] == str(state_dir / "kubeconfig")
        pids = [
            entry["pid"]
            for entry in json.loads((state_dir / "state.json").read_text()).values()
            if isinstance(entry, dict)
        ]
        assert len(pids) == 5  # API server, Kafka, kubelet, scheduler, controllers

        kubectl = [kubectl_binary(), "--kubeconfig", exports["KUBECONFIG"]]
        pods = subprocess.run(
            [*kubectl, "get", "pods", "-A"], capture_output=True, text=True, check=False
        )
        assert pods.returncode == 0, pods.stderr
        crd = subprocess.run(
            [*kubectl, "get", "crd", "streamingapps.smoothscale.io", "-o", "name"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (
            crd.stdout.strip()
            == "customresourcedefinition.apiextensions.k8s.io/streamingapps.smoothscale.io"
        )

        reader = Consumer({"bootstrap.servers": exports["KAFKA_BOOTSTRAP"], "group.id": "up"})
        try:
            assert len(reader.list_topics("input", timeout=5).topics["input"].partitions) == 4
        finally:
            reader.close()

        assert (
            smoothscale("dev", "status", "--state-dir", str(state_dir), cwd=tmp_path).returncode
            == 0
        )
    finally:
        down = smoothscale("dev", "down", "--state-dir", str(state_dir), cwd=tmp_path)
    assert down.returncode == 0
    assert "stopped: controllers, scheduler, kubelet, kafka, apiserver" in down.stdout
    for pid in pids:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )
    assert smoothscale("dev", "status", "--state-dir", str(state_dir), cwd=tmp_path).returncode == 1
    again = smoothscale("dev", "down", "--state-dir", str(state_dir), cwd=tmp_path)
    assert again.returncode == 0
    assert "nothing was running" in again.stdout


def test_dev_up_refuses_to_start_twice_in_one_state_dir(local_cluster: StackInfo) -> None:
    result = smoothscale(
        "dev", "up", "--state-dir", str(local_cluster.state_dir), cwd=local_cluster.state_dir
    )
    assert result.returncode == 2
    assert "already runs" in result.stderr


def test_a_pod_on_the_local_cluster_reaches_its_kafka(local_cluster: StackInfo) -> None:
    topic = f"pod-output-{uuid.uuid4().hex[:6]}"
    KafkaControl(local_cluster.kafka_control).create_topic(topic, partitions=1)
    produce = (
        "import os\n"
        "from confluent_kafka import Producer\n"
        "producer = Producer({'bootstrap.servers': os.environ['KAFKA_BOOTSTRAP']})\n"
        f"producer.produce({topic!r}, os.environ['POD_NAME'].encode())\n"
        "assert producer.flush(10) == 0\n"
        "print('produced', flush=True)\n"
    )
    name = f"producer-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "producer",
                    "image": "smoothscale:dev",
                    "command": ["python", "-c", produce],
                    "env": [
                        {"name": "KAFKA_BOOTSTRAP", "value": local_cluster.kafka_bootstrap},
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        },
                    ],
                }
            ],
        },
    }
    apply = subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(local_cluster.kubeconfig), "create", "-f", "-"],
        input=json.dumps(pod),
        capture_output=True,
        text=True,
        check=False,
    )
    assert apply.returncode == 0, apply.stderr

    api = KubeApi.from_kubeconfig(local_cluster.kubeconfig)
    try:
        deadline = time.monotonic() + 30
        while True:
            status = api.request("GET", f"/api/v1/namespaces/default/pods/{name}").get("status", {})
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            assert time.monotonic() < deadline, f"pod {name} did not finish: {status}"
            time.sleep(0.1)
    finally:
        api.close()
    logs = subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(local_cluster.kubeconfig), "logs", name],
        capture_output=True,
        text=True,
        check=False,
    )
    assert status["phase"] == "Succeeded", logs.stdout + logs.stderr
    assert logs.stdout == "produced\n", "kubectl logs reads the pod's log on the local stack"

    reader = Consumer(
        {
            "bootstrap.servers": local_cluster.kafka_bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        message = reader.poll(10)
    finally:
        reader.close()
    assert message is not None
    assert message.value() == name.encode()


def processes_running_in(directory: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == directory:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_dev_up_that_fails_stops_what_it_started_and_says_why(tmp_path: Path) -> None:
    empty = tmp_path / "no-crds"
    empty.mkdir()
    state_dir = tmp_path / "dev"
    result = smoothscale(
        "dev",
        "up",
        "--state-dir",
        str(state_dir),
        "--crds",
        str(empty),
        "--kafka-port",
        "0",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "no CRD YAML files" in result.stderr
    assert processes_running_in(state_dir.resolve()) == []
    assert not (state_dir / "state.json").exists()


def test_dev_produce_sends_stdin_keyed_or_refuses_a_bad_line_sending_nothing(
    local_cluster: StackInfo,
) -> None:
    topic = f"typed-{uuid.uuid4().hex[:6]}"
    KafkaControl(local_cluster.kafka_control).create_topic(topic, partitions=1)
    state = str(local_cluster.state_dir)
    lines = '{"user": "alice"}\n{"user": "bob"}\n'

    refused = smoothscale(
        "dev", "produce", topic, "--key-field", "user", "--state-dir", state,
        cwd=local_cluster.state_dir, stdin=lines + "not json\n",
    )  # fmt: skip
    produced = smoothscale(
        "dev", "produce", topic, "--key-field", "user", "--state-dir", state,
        cwd=local_cluster.state_dir, stdin=lines,
    )  # fmt: skip

    assert refused.returncode == 2
    assert "line 3 is not a JSON object with a field 'user'" in refused.stderr
    assert produced.returncode == 0, produced.stderr
    assert "produced 2 records" in produced.stdout
    reader = Consumer({"bootstrap.servers": local_cluster.kafka_bootstrap, "group.id": topic})
    try:
        reader.assign([TopicPartition(topic, 0, 0)])
        messages = [reader.poll(10) for _ in range(2)]
        assert reader.poll(1) is None, "nothing of the refused input"
    finally:
        reader.close()
    assert [(m.key(), m.value()) for m in messages if m is not None] == [
        (b"alice", b'{"user": "alice"}'),
        (b"bob", b'{"user": "bob"}'),
    ]
