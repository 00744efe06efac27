"""The worker's configuration: what one instance (pod) needs to know to run.

The operator renders it from the StreamingApp and hands it to the pod as the JSON value of the
environment variable SMOOTHSCALE_WORKER_CONFIG; `smoothscale worker --config PATH` reads the
same JSON from a file instead. The instance id defaults to the pod's name (POD_NAME, from the
downward API), the key of its record in the assignments topic.

Kafka credentials are never part of the JSON: the pod takes the SASL username and password from
the app's Secret into $SMOOTHSCALE_KAFKA_SASL_USERNAME and $SMOOTHSCALE_KAFKA_SASL_PASSWORD
(secretKeyRef env vars), and loading the config merges them into `kafka_config`, so every
client of the instance (and the Spark source's options) gets them. A serialized config leaves
them out again, so a config that is written or logged holds no credentials. The CA
certificate is a file the pod mounts; the JSON names it (`ssl.ca.location`).
"""

import json
import os
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from smoothscale.kafka import names

CONFIG_ENV = "SMOOTHSCALE_WORKER_CONFIG"
INSTANCE_ID_ENV = "POD_NAME"
SASL_USERNAME_ENV = "SMOOTHSCALE_KAFKA_SASL_USERNAME"
SASL_PASSWORD_ENV = "SMOOTHSCALE_KAFKA_SASL_PASSWORD"
_CREDENTIALS_FROM_ENV = {"sasl.username": SASL_USERNAME_ENV, "sasl.password": SASL_PASSWORD_ENV}


class WorkerConfigError(ValueError):
    """The worker configuration is missing or invalid; the message says what to fix."""


def _instance_id_from_env() -> str:
    return os.environ.get(INSTANCE_ID_ENV, "")


INSTANCE_UID_ENV = "POD_UID"


def _instance_uid_from_env() -> str | None:
    return os.environ.get(INSTANCE_UID_ENV) or None


class WorkerConfig(BaseModel):
    """One instance's configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    app_id: str = Field(min_length=1, description="The application id all Kafka names derive from.")
    instance_id: str = Field(
        default_factory=_instance_id_from_env,
        validate_default=True,
        description="This instance's id (its pod name); defaults to $POD_NAME.",
    )
    instance_uid: str | None = Field(
        default_factory=_instance_uid_from_env,
        exclude=True,
        description="This instance's pod uid, from $POD_UID (never serialized: it is the pod's, "
        "not the app's): the instance acts only on assignments meant for its pod, and stops "
        "once one names another pod of its name.",
    )
    bootstrap_servers: str = Field(min_length=1)
    kafka_config: dict[str, str] = Field(
        default_factory=dict,
        validate_default=True,
        description="Extra librdkafka settings for every client (security.protocol, sasl.*); "
        "the SASL credentials come from the environment.",
    )
    input_topics: list[str] = Field(min_length=1, description="Co-partitioned input topics.")
    output_topic: str = Field(min_length=1)
    dead_letter_topic: str | None = Field(
        default=None, description="Defaults to `<appId>-dead-letters`."
    )
    stores: dict[str, str | None] = Field(
        min_length=1,
        description="State store name -> its changelog topic (null: `<appId>-<store>-changelog`).",
    )
    pipeline: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="The pipeline, module:callable.")
    trigger_interval: float = Field(
        default=1.0,
        ge=0,
        description="Seconds between micro-batches; 0 starts each as soon as the last is done.",
    )
    state_dir: Path = Field(description="Where the local state stores live (one dir per task).")
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    max_records_per_partition: int = Field(
        default=10_000, gt=0, description="At most this many records per partition per batch."
    )
    report_interval: float = Field(
        default=1.0, gt=0, description="Seconds between progress reports of restoring tasks."
    )
    shutdown_timeout: float = Field(
        default=25.0,
        gt=0,
        description="On SIGTERM, give up finishing the batch after this long (keep it below the "
        "pod's terminationGracePeriodSeconds).",
    )
    stall_timeout: float = Field(
        default=120.0,
        gt=0,
        description="Once the query runs, a micro-batch running longer than this, or none "
        "completed for this long while its active tasks have input waiting, makes the instance "
        "stalled: it says so in its reports (the operator moves its tasks) and its liveness "
        "endpoint fails (the kubelet restarts it).",
    )
    state_reuse_seconds: float = Field(
        default=43_200.0,
        gt=0,
        description="A local task store last written longer ago than this is restored from "
        "scratch instead of reused: the changelog may have been compacted since, and Kafka keeps "
        "tombstones only delete.retention.ms (default 1 day), so a key deleted meanwhile could "
        "come back. The instance also never reuses a store for longer than half the changelogs' "
        "delete.retention.ms, as the brokers give it.",
    )

    @field_validator("kafka_config")
    @classmethod
    def _add_credentials_from_env(cls, value: dict[str, str]) -> dict[str, str]:
        credentials = {
            setting: os.environ[variable]
            for setting, variable in _CREDENTIALS_FROM_ENV.items()
            if variable in os.environ
        }
        return {**value, **credentials}

    @field_serializer("kafka_config")
    def _leave_out_the_credentials(self, value: dict[str, str]) -> dict[str, str]:
        return {
            setting: text for setting, text in value.items() if setting not in _CREDENTIALS_FROM_ENV
        }

    @field_validator("instance_id")
    @classmethod
    def _instance_id_is_known(cls, value: str) -> str:
        if not value:
            raise ValueError(
                f"no instance id: set instance_id in the config or the {INSTANCE_ID_ENV} "
                "environment variable (the pod's name, from the downward API)"
            )
        return value

    def changelog_topics(self) -> dict[str, str]:
        """State store name -> changelog topic."""
        return {
            store: names.changelog_topic(self.app_id, store, topic)
            for store, topic in self.stores.items()
        }

    def dead_letters(self) -> str:
        return names.dead_letter_topic(self.app_id, self.dead_letter_topic)

    def client_config(self) -> dict[str, str]:
        """The settings every Kafka client of this instance starts from."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka_config}


def load_worker_config(path: str | None = None) -> WorkerConfig:
    """The config from the JSON file at `path`, or else from $SMOOTHSCALE_WORKER_CONFIG."""
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise WorkerConfigError(f"cannot read the worker config {path}: {error}") from error
        source = path
    else:
        text = os.environ.get(CONFIG_ENV, "")
        source = f"${CONFIG_ENV}"
        if not text:
            raise WorkerConfigError(
                f"no worker config: pass --config PATH or set {CONFIG_ENV} to its JSON"
            )
    try:
        return WorkerConfig.model_validate(json.loads(text))
    except json.JSONDecodeError as error:
        raise WorkerConfigError(f"the worker config in {source} is not JSON: {error}") from error
    except ValidationError as error:
        raise WorkerConfigError(f"the worker config in {source} is invalid:\n{error}") from error
