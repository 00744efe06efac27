"""The models as other parts use them: reading objects from the API, durations, helpers."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from smoothscale.api.models import (
    Condition,
    ConditionStatus,
    ConditionType,
    StreamingApp,
    StreamingAppStatus,
    TaskHolder,
    TaskStatus,
    application_id,
    format_duration,
    parse_duration,
)
from smoothscale.api.schema import apply_defaults
from smoothscale.tasks import TaskRole


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500ms", timedelta(milliseconds=500)),
        ("10s", timedelta(seconds=10)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("90s", timedelta(seconds=90)),
        ("0s", timedelta()),
    ],
)
def test_durations_parse_like_kubernetes(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(seconds=90), "1m30s"),
        (timedelta(minutes=10), "10m"),
        (timedelta(milliseconds=1500), "1s500ms"),
        (timedelta(hours=2), "2h"),
        (timedelta(), "0s"),
    ],
)
def test_durations_format_to_the_shortest_string(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["10 minutes", "5", "1.5s", "-1s", "1d", ""])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 30s, 5m or 1h30m"):
        parse_duration(text)


def _from_api(example: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The example as the API server returns it: defaulted, with server-set metadata and status."""
    obj = example
    obj["metadata"].update(
        uid="7c4d",
        resourceVersion="42",
        generation=3,
        creationTimestamp="2026-11-22T09:00:00Z",
        managedFields=[{"manager": "kubectl", "operation": "Apply"}],
    )
    obj["status"] = {
        "observedGeneration": 3,
        "phase": "Scaling",
        "replicas": 3,
        "readyReplicas": 3,
        "activeReplicas": 2,
        "warmupReplicas": 1,
        "selector": "smoothscale.io/app=page-counts",
        "maxLag": 52000,
        "tasks": [
            {
                "task": 0,
                "epoch": 4,
                "holders": [
                    {"instance": "page-counts-a", "role": "active", "lag": 0},
                    {"instance": "page-counts-c", "role": "warmup", "lag": 52000},
                ],
            },
        ],
        "instances": [
            {"name": "page-counts-a", "ready": True, "activeTasks": 1},
            {"name": "page-counts-c", "ready": False, "warmupTasks": 1},
        ],
        "conditions": [
            {
                "type": "Progressing",
                "status": "True",
                "observedGeneration": 3,
                "lastTransitionTime": "2026-11-22T09:01:02Z",
                "reason": "WarmupsCatchingUp",
                "message": "1 task warming up on page-counts-c",
            },
        ],
    }
    defaulted: dict[str, Any] = apply_defaults(schema, obj)
    return defaulted


def test_an_object_from_the_api_server_reads_and_writes_back_unchanged(
    example: dict[str, Any], schema: dict[str, Any]
) -> None:
    obj = _from_api(example, schema)
    app = StreamingApp.model_validate(obj)
    assert app.spec.scaling.lag_poll_interval == timedelta(seconds=5)
    assert app.spec.kafka.input_topics == ["page-views"]
    assert app.to_kubernetes() == obj


def test_status_helpers_find_the_active_owner_and_the_warmups(
    example: dict[str, Any], schema: dict[str, Any]
) -> None:
    status = StreamingApp.model_validate(_from_api(example, schema)).status
    assert status is not None
    task = status.tasks[0]
    assert task.active == TaskHolder(instance="page-counts-a", role=TaskRole.ACTIVE, lag=0)
    assert [h.instance for h in task.holders_in(TaskRole.WARMUP)] == ["page-counts-c"]
    assert task.holders_in(TaskRole.STANDBY) == []
    progressing = status.condition(ConditionType.PROGRESSING)
    assert progressing is not None
    assert progressing.reason == "WarmupsCatchingUp"
    assert status.condition(ConditionType.READY) is None


def test_a_task_without_an_active_owner_says_so() -> None:
    task = TaskStatus(task=3, holders=[TaskHolder(instance="a", role=TaskRole.STANDBY)])
    assert task.active is None


def test_conditions_are_written_as_kubernetes_times() -> None:
    condition = Condition(
        type=ConditionType.READY,
        status=ConditionStatus.TRUE,
        last_transition_time=datetime(2026, 11, 22, 9, 1, 2, 345678, tzinfo=UTC),
        reason="AllTasksActive",
        message="12 tasks active on 2 instances",
    )
    assert condition.to_kubernetes()["lastTransitionTime"] == "2026-11-22T09:01:02Z"


def test_two_holders_of_one_task_on_the_same_instance_are_refused() -> None:
    holders = [{"instance": "a", "role": "active"}, {"instance": "a", "role": "warmup"}]
    with pytest.raises(ValidationError, match="duplicate entry with instance='a'"):
        StreamingAppStatus.model_validate({"tasks": [{"task": 0, "holders": holders}]})


def test_application_id_defaults_to_namespace_dot_name(example: dict[str, Any]) -> None:
    app = StreamingApp.model_validate(example)
    assert application_id(app) == "shop.page-counts"
    example["spec"]["kafka"]["applicationId"] = "page-counts-v2"
    assert application_id(StreamingApp.model_validate(example)) == "page-counts-v2"


def test_application_id_of_an_app_without_namespace_uses_default(example: dict[str, Any]) -> None:
    del example["metadata"]["namespace"]
    assert application_id(StreamingApp.model_validate(example)) == "default.page-counts"


def test_a_wrong_kind_is_refused(example: dict[str, Any]) -> None:
    example["kind"] = "Deployment"
    with pytest.raises(ValidationError, match="kind"):
        StreamingApp.model_validate(example)


def test_python_names_are_accepted_too() -> None:
    status = StreamingAppStatus(ready_replicas=2, warmup_replicas=1)
    assert status.to_kubernetes()["readyReplicas"] == 2


def test_kopf_bodies_are_read_as_they_are(example: dict[str, Any]) -> None:
    import kopf

    app = StreamingApp.model_validate(kopf.Body(example))
    assert app.spec.replicas == 2
    assert app.name == "page-counts"
