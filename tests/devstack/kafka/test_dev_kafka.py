"""`smoothscale dev kafka`: an embedded Kafka cluster in its own process."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from devstack.kafka.control import (
    KafkaControl,
    KafkaControlError,
    TopicSpec,
    parse_topic_spec,
)


def test_topic_spec_names_a_partition_count() -> None:
    assert parse_topic_spec("input:8") == TopicSpec("input", 8)
    assert parse_topic_spec("assignments") == TopicSpec("assignments", 1)
    assert parse_topic_spec("app.counts-changelog:3") == TopicSpec("app.counts-changelog", 3)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [(":4", "no name"), ("input:many", "not a partition count"), ("input:0", "at least 1")],
)
def test_bad_topic_spec_says_what_to_write(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_topic_spec(text)


def wait_for_file(path: Path, process: subprocess.Popen[str], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "smoothscale dev kafka exited before it was ready"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)


def test_dev_kafka_serves_its_topics_and_controls_until_sigterm(tmp_path: Path) -> None:
    ready_file = tmp_path / "kafka.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smoothscale.cli",
            "dev",
            "kafka",
            "--brokers",
            "2",
            "--topic",
            "input:6",
            "--topic",
            "assignments:1",
            "--ready-file",
            str(ready_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_for_file(ready_file, process)
        ready = json.loads(ready_file.read_text())
        assert ready["pid"] == process.pid
        bootstrap = ready["bootstrap_servers"]
        assert len(bootstrap.split(",")) == 2

        control = KafkaControl(ready["control_url"])
        control.create_topic("created-later", partitions=3)
        with pytest.raises(KafkaControlError, match="already exists"):
            control.create_topic("input", partitions=6)

        client = Consumer({"bootstrap.servers": bootstrap, "group.id": "dev-kafka-test"})
        try:
            topics = client.list_topics(timeout=5).topics
            assert len(topics["input"].partitions) == 6
            assert len(topics["assignments"].partitions) == 1
            assert len(topics["created-later"].partitions) == 3
        finally:
            client.close()
        with pytest.raises(KafkaControlError, match=r"brokers are 1\.\.2"):
            control.set_broker_down(3)
        control.set_broker_down(2)
        control.set_broker_up(2)
        control.set_rtt(1, 0)
        control.push_request_errors(0, [0])

        admin = AdminClient({"bootstrap.servers": bootstrap})
        (creation,) = admin.create_topics([NewTopic("created-by-admin", 2, 1)]).values()
        creation.result(10)
        assert len(admin.list_topics(timeout=5).topics["created-by-admin"].partitions) == 2
        control.compact("input", partition=0, through_offset=None, remove_tombstones=True)
        with pytest.raises(KafkaControlError, match="does not exist"):
            control.compact("no-such-topic")

        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert f"export KAFKA_BOOTSTRAP={bootstrap}" in output


def test_dev_kafka_refuses_a_bad_topic_with_usage_exit_code() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "smoothscale.cli", "dev", "kafka", "--topic", "input:x"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "NAME:PARTITIONS" in result.stderr
