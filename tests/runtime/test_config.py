"""The worker's configuration: where it comes from, its defaults, and errors a user can fix."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from smoothscale.runtime.config import WorkerConfigError, load_worker_config

MINIMAL = {
    "app_id": "shop.counter",
    "bootstrap_servers": "kafka:9092",
    "input_topics": ["clicks"],
    "output_topic": "totals",
    "stores": {"counts": None, "windows": "custom-windows"},
    "pipeline": "examples.pipelines.running_count:pipeline",
    "state_dir": "/state",
}


def test_the_env_var_config_takes_the_instance_id_from_the_pod_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SMOOTHSCALE_WORKER_CONFIG", json.dumps(MINIMAL))
    monkeypatch.setenv("POD_NAME", "counter-7f9c")
    config = load_worker_config()
    assert config.instance_id == "counter-7f9c"
    assert config.changelog_topics() == {
        "counts": "shop.counter-counts-changelog",
        "windows": "custom-windows",
    }
    assert config.dead_letters() == "shop.counter-dead-letters"


def test_a_config_file_without_an_instance_id_needs_the_pod_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(MINIMAL))
    with pytest.raises(WorkerConfigError, match="POD_NAME"):
        load_worker_config(str(path))
    path.write_text(json.dumps({**MINIMAL, "instance_id": "pod-a"}))
    assert load_worker_config(str(path)).instance_id == "pod-a"


def test_no_config_at_all_says_how_to_give_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMOOTHSCALE_WORKER_CONFIG", raising=False)
    with pytest.raises(WorkerConfigError, match="--config PATH or set SMOOTHSCALE_WORKER_CONFIG"):
        load_worker_config()


def test_the_worker_command_rejects_an_unknown_pipeline_before_starting_anything(
    tmp_path: Path,
) -> None:
    path = tmp_path / "worker.json"
    config = {**MINIMAL, "instance_id": "pod-a", "pipeline": "no_such_module:pipeline"}
    path.write_text(json.dumps({**config, "state_dir": str(tmp_path / "state")}))
    result = subprocess.run(
        [sys.executable, "-m", "smoothscale.cli", "worker", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "no_such_module" in result.stderr
    assert "PYTHONPATH" in result.stderr


def test_sasl_credentials_come_from_the_environment_and_are_never_serialized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SMOOTHSCALE_KAFKA_SASL_USERNAME", "alice")
    monkeypatch.setenv("SMOOTHSCALE_KAFKA_SASL_PASSWORD", "s3cret")
    security = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "ssl.ca.location": "/etc/smoothscale/kafka-ca/ca.crt",
    }
    monkeypatch.setenv(
        "SMOOTHSCALE_WORKER_CONFIG",
        json.dumps({**MINIMAL, "instance_id": "pod-a", "kafka_config": security}),
    )
    config = load_worker_config()

    assert config.client_config() == {
        "bootstrap.servers": "kafka:9092",
        **security,
        "sasl.username": "alice",
        "sasl.password": "s3cret",
    }
    assert config.kafka_config["sasl.password"] == "s3cret"  # the Spark source's options too
    dumped = config.model_dump_json()
    assert "s3cret" not in dumped
    assert "alice" not in dumped
    assert json.loads(dumped)["kafka_config"] == security


def test_without_credentials_in_the_environment_the_config_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SMOOTHSCALE_KAFKA_SASL_USERNAME", raising=False)
    monkeypatch.delenv("SMOOTHSCALE_KAFKA_SASL_PASSWORD", raising=False)
    monkeypatch.setenv("SMOOTHSCALE_WORKER_CONFIG", json.dumps({**MINIMAL, "instance_id": "a"}))
    assert load_worker_config().client_config() == {"bootstrap.servers": "kafka:9092"}
