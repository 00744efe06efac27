"""Every Kafka name smoothscale uses, derived from the application id.

docs/architecture.md ("Names in Kafka") is the table these functions implement; nothing else
in smoothscale formats a topic, group or transactional id, so two apps never share one and a
reader finds every name in one place.
"""

from smoothscale.tasks import TaskId


def default_application_id(namespace: str, name: str) -> str:
    """The application id of a StreamingApp that names none: `<namespace>.<name>`."""
    return f"{namespace}.{name}"


def changelog_topic(app_id: str, store: str, explicit: str | None = None) -> str:
    """The changelog topic of state store `store`: `<appId>-<store>-changelog` unless named."""
    return explicit or f"{app_id}-{store}-changelog"


def assignments_topic(app_id: str) -> str:
    """The compacted, single-partition topic the operator writes assignments to."""
    return f"{app_id}-assignments"


def dead_letter_topic(app_id: str, explicit: str | None = None) -> str:
    """Where undecodable input records go: `<appId>-dead-letters` unless named."""
    return explicit or f"{app_id}-dead-letters"


def transactional_id(app_id: str, task: TaskId) -> str:
    """The transactional.id of task `task`'s producer, the same at every owner of the task."""
    return f"{app_id}-task-{task}"


def operator_transactional_id(app_id: str) -> str:
    """The transactional.id of the operator's writes for the app (its ledger and assignments):
    the same in every operator process, so the newest one fences the others."""
    return f"{app_id}-operator"


def instance_group(app_id: str, instance_id: str) -> str:
    """The consumer group an instance commits its progress reports in."""
    return f"{app_id}-instance-{instance_id}"


def input_position_group(app_id: str) -> str:
    """The consumer group holding the input positions, for external lag tools (KEDA, Burrow)."""
    return app_id


def reader_group(app_id: str) -> str:
    """The group.id of consumers that only assign() partitions and never commit.

    librdkafka requires a group.id on every consumer; these never join the group or store an
    offset in it, so the group stays empty.
    """
    return f"{app_id}-reader"
