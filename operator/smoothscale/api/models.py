"""The StreamingApp API (smoothscale.io/v1alpha1) as pydantic models: the one source of truth.

The CRD (`smoothscale crd` writes crds/streamingapp.yaml), its defaults and validation, and
docs/configuration.md are all generated from these classes. Python names are snake_case; the
Kubernetes names are their camelCase aliases. A field's docstring is its description in the CRD
and in the configuration reference.

Rules the OpenAPI schema cannot say (the output topic is not an input topic, ...) are `Rule`s:
a CEL expression the API server evaluates (x-kubernetes-validations) next to the same check in
Python, so `StreamingApp.model_validate` and the API server refuse the same objects.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    StrictInt,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from smoothscale.kafka import names
from smoothscale.tasks import TaskId, TaskRole

GROUP = "smoothscale.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StreamingApp"
PLURAL = "streamingapps"
SINGULAR = "streamingapp"
SHORT_NAMES = ("ssa",)
CATEGORIES = ("smoothscale", "all")


# ---------------------------------------------------------------------------------------------
# Rules the schema cannot say: CEL for the API server, the same check in Python for pydantic


@dataclass(frozen=True)
class Rule:
    """A validation rule stated twice, once per judge: CEL for the API server, Python here."""

    cel: str
    """The x-kubernetes-validations rule; `self` is the value of the node it is attached to."""
    message: str
    """What is wrong and what is allowed; shown by both judges."""
    check: Callable[[Any], bool]
    """The same rule in Python, over the validated model (or value, for field rules)."""
    field_path: str | None = None
    """Where the API server reports a failure, relative to the node (e.g. ".outputTopic")."""

    def to_schema(self) -> dict[str, str]:
        rule = {"rule": self.cel, "message": self.message}
        if self.field_path:
            rule["fieldPath"] = self.field_path
        return rule


def _field_rules(*rules: Rule) -> tuple[Any, Any]:
    """Annotated metadata attaching rules to a single value (e.g. every topic name)."""

    def check(value: Any) -> Any:
        for rule in rules:
            if not rule.check(value):
                raise ValueError(rule.message)
        return value

    schemas: list[JsonValue] = [dict(rule.to_schema()) for rule in rules]
    return Field(json_schema_extra={"x-kubernetes-validations": schemas}), AfterValidator(check)


def _as_set() -> tuple[Any, Any]:
    """Annotated metadata for a list without duplicates (x-kubernetes-list-type: set)."""

    def check(items: list[Any]) -> list[Any]:
        for index, item in enumerate(items):
            if item in items[:index]:
                raise ValueError(f"duplicate value {item!r}: the items of this list must be unique")
        return items

    return Field(json_schema_extra={"x-kubernetes-list-type": "set"}), AfterValidator(check)


def _as_map(key: str) -> tuple[Any, Any]:
    """Annotated metadata for a list of objects keyed by `key` (x-kubernetes-list-type: map)."""

    def check(items: list[Any] | None) -> list[Any] | None:
        keys = [getattr(item, key) for item in items or []]
        for index, value in enumerate(keys):
            if value in keys[:index]:
                raise ValueError(f"duplicate entry with {key}={value!r}: each entry needs its own")
        return items

    schema: dict[str, JsonValue] = {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": [to_camel(key)],
    }
    return Field(json_schema_extra=schema), AfterValidator(check)


def _add_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(model, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_schema() for rule in rules]


class ApiModel(BaseModel):
    """Base of every StreamingApp model: camelCase aliases, no unknown fields, CEL rules.

    Integers and booleans are strict (no "2" for 2), as the API server's schema check is.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        json_schema_extra=_add_rules,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in self.rules:
            if not rule.check(self):
                where = f"{rule.field_path.lstrip('.')}: " if rule.field_path else ""
                raise ValueError(f"{where}{rule.message}")
        return self

    def to_kubernetes(self) -> dict[str, Any]:
        """The object as the Kubernetes API spells it (camelCase, unset fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------------------------
# Value types


DURATION_PATTERN = r"^([0-9]+(ms|h|m|s))+$"
_DURATION_PART = re.compile(r"([0-9]+)(ms|h|m|s)")
_UNITS = {"h": timedelta(hours=1), "m": timedelta(minutes=1), "s": timedelta(seconds=1)}
_UNITS["ms"] = timedelta(milliseconds=1)


def parse_duration(text: str) -> timedelta:
    """Parse a Kubernetes/Go-style duration: "500ms", "10s", "5m", "1h30m"."""
    if not re.match(DURATION_PATTERN, text):
        raise ValueError(
            f"{text!r} is not a duration: write a number and a unit (h, m, s or ms), "
            "e.g. 30s, 5m or 1h30m"
        )
    return sum(
        (int(amount) * _UNITS[unit] for amount, unit in _DURATION_PART.findall(text)),
        timedelta(),
    )


def format_duration(value: timedelta) -> str:
    """The shortest duration string for `value`, e.g. timedelta(seconds=90) -> "1m30s"."""
    milliseconds = round(value.total_seconds() * 1000)
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        amount, milliseconds = divmod(milliseconds, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"


def _to_duration(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        return parse_duration(value)
    raise ValueError(f"a duration is a string such as 30s, 5m or 1h30m, not {value!r}")


_DURATION_SCHEMA = {"type": "string", "pattern": DURATION_PATTERN}

Duration = Annotated[
    timedelta,
    BeforeValidator(_to_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(_DURATION_SCHEMA),
]
"""A duration such as 30s, 5m or 1h30m (units h, m, s, ms); a timedelta in Python."""

_NOT_ZERO = Rule(
    cel="self.matches('[1-9]')",
    message="must be longer than zero, e.g. 5s",
    check=lambda value: value > timedelta(),
)


def _check_positive(value: timedelta) -> timedelta:
    if not _NOT_ZERO.check(value):
        raise ValueError(_NOT_ZERO.message)
    return value


PositiveDuration = Annotated[
    timedelta,
    BeforeValidator(_to_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({**_DURATION_SCHEMA, "x-kubernetes-validations": [_NOT_ZERO.to_schema()]}),
    AfterValidator(_check_positive),
]
"""A duration longer than zero."""


TOPIC_PATTERN = r"^[a-zA-Z0-9._-]+$"
_NOT_DOTS = Rule(
    cel="self != '.' && self != '..'",
    message='a Kafka topic cannot be named "." or ".."',
    check=lambda value: value not in {".", ".."},
)
TopicName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=249, pattern=TOPIC_PATTERN),
    *_field_rules(_NOT_DOTS),
]
"""A legal Kafka topic name: 1 to 249 of a-z, A-Z, 0-9, '.', '_', '-'; not "." or ".."."""

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DnsSubdomain = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
]
SecretKey = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
]

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[
    StrictInt | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)],
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes resource quantity: an integer or a string such as 500m, 2 or 1Gi."""

_DOTTED_NAME = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
PIPELINE_PATTERN = f"^{_DOTTED_NAME}:{_DOTTED_NAME}$"
BOOTSTRAP_SERVERS_PATTERN = r"^[^\s,:]+:[0-9]{1,5}(,[^\s,:]+:[0-9]{1,5})*$"


# ---------------------------------------------------------------------------------------------
# Pod bits (small, precise subsets of the core/v1 types)


class PullPolicy(StrEnum):
    """When the kubelet pulls the image (core/v1 PullPolicy)."""

    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


DEFAULT_REQUESTS: dict[str, int | str] = {"cpu": "1", "memory": "2Gi"}
"""What the scheduler reserves for an instance unless the spec says otherwise."""
DEFAULT_LIMITS: dict[str, int | str] = {"cpu": "2", "memory": "2Gi"}
"""The most an instance may use unless the spec says otherwise: the Spark driver's two task
threads, and memory for its JVM (512m heap) and Python processes, about 1.1 GiB measured at
small sizes (docs/decisions/instance-pods.md, Resources)."""


class ResourceRequirements(ApiModel):
    """CPU and memory for each instance pod (core/v1 ResourceRequirements, without claims)."""

    limits: dict[str, Quantity] = DEFAULT_LIMITS
    """The most the instance may use: above its memory limit its container is OOM-killed and
    restarted, above its CPU limit it is throttled. Giving limits replaces these defaults
    whole; {} sets none."""
    requests: dict[str, Quantity] = DEFAULT_REQUESTS
    """What the scheduler reserves for the instance (each request at most its limit). Giving
    requests replaces these defaults whole; a resource with a limit and no request gets its
    limit as request (Kubernetes)."""


class StateVolume(ApiModel):
    """The instance's local disk for its state stores: an emptyDir on its node."""

    size_limit: Quantity = "10Gi"
    """The most the state stores of one instance may take on its node's disk. The kubelet
    evicts a pod whose state outgrows it: its tasks fail over and the operator re-creates it,
    empty, to restore them from their changelogs. Size it for every task an instance holds
    (active, standby and warm-up) and room for the store's compactions."""


class KeySelector(ApiModel):
    """One key of a Secret or ConfigMap in the app's namespace."""

    name: DnsSubdomain
    """The name of the Secret or ConfigMap."""
    key: SecretKey
    """The key within it."""
    optional: Annotated[bool, Field(strict=True)] | None = None
    """Start the pod even when the object or key does not exist."""


class ObjectFieldSelector(ApiModel):
    """A field of the pod, e.g. metadata.name (core/v1 ObjectFieldSelector)."""

    field_path: Annotated[str, StringConstraints(min_length=1)]
    """The path of the field, e.g. metadata.name or status.podIP."""
    api_version: str | None = None
    """The schema version the path is written in (default v1)."""


class ResourceFieldSelector(ApiModel):
    """A resource limit or request of the container, e.g. limits.memory."""

    resource: Annotated[str, StringConstraints(min_length=1)]
    """The resource, e.g. limits.cpu or requests.memory."""
    container_name: str | None = None
    """The container (default: the instance container)."""
    divisor: Quantity | None = None
    """The unit the value is given in (default 1)."""


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from; give exactly one."""

    rules = (
        Rule(
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
            "has(self.resourceFieldRef)].filter(x, x).size() == 1",
            message="give exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
            check=lambda source: (
                sum(
                    value is not None
                    for value in (
                        source.secret_key_ref,
                        source.config_map_key_ref,
                        source.field_ref,
                        source.resource_field_ref,
                    )
                )
                == 1
            ),
        ),
    )

    secret_key_ref: KeySelector | None = None
    """A key of a Secret."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""
    field_ref: ObjectFieldSelector | None = None
    """A field of the pod."""
    resource_field_ref: ResourceFieldSelector | None = None
    """A resource limit or request of the container."""


class EnvVar(ApiModel):
    """An environment variable of the instance container (core/v1 EnvVar)."""

    rules = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="give either value or valueFrom, not both",
            check=lambda env: env.value is None or env.value_from is None,
        ),
    )

    name: Annotated[
        str,
        StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"),
    ]
    """The variable's name: letters, digits, '_', '-' and '.', not starting with a digit."""
    value: str | None = None
    """The value."""
    value_from: EnvVarSource | None = None
    """Take the value from a Secret, ConfigMap or the pod instead."""


class TolerationOperator(StrEnum):
    """How a toleration matches a taint's value."""

    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    """The taint effect a toleration tolerates."""

    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(ApiModel):
    """Lets instance pods run on nodes with a matching taint (core/v1 Toleration)."""

    rules = (
        Rule(
            cel="!(has(self.operator) && self.operator == 'Exists' && has(self.value))",
            message="a toleration with operator Exists matches any value: leave value out",
            check=lambda toleration: (
                not (
                    toleration.operator == TolerationOperator.EXISTS
                    and toleration.value is not None
                )
            ),
        ),
    )

    key: str | None = None
    """The taint key; empty with operator Exists matches every taint."""
    operator: TolerationOperator | None = None
    """Equal (the default) compares the value; Exists matches any value."""
    value: str | None = None
    """The taint value to match (with operator Equal)."""
    effect: TaintEffect | None = None
    """The effect to tolerate; empty tolerates all effects."""
    toleration_seconds: Annotated[int, Field(strict=True, ge=0)] | None = None
    """With effect NoExecute: how long the pod stays on a node after the taint appears."""


# ---------------------------------------------------------------------------------------------
# Spec


class PipelineSpec(ApiModel):
    """The user's PySpark pipeline."""

    ref: Annotated[str, StringConstraints(max_length=512, pattern=PIPELINE_PATTERN)]
    """The pipeline factory as `module:callable`, e.g. `examples.pipelines.running_count:pipeline`;
    the module must be importable in the image."""
    trigger_interval: Duration = timedelta(seconds=1)
    """How often a micro-batch starts; a task just handed over to an instance starts at once
    instead of at the next one. 0s starts the next micro-batch as soon as the previous one is
    done."""
    stall_timeout: PositiveDuration = timedelta(minutes=2)
    """Once an instance's query runs: a micro-batch running longer than this, or none completed
    for this long while its active tasks have input waiting, makes it stalled (a pipeline that
    blocks, a query that hangs). Its tasks then fail over to other instances with a Warning
    Event, and its liveness probe fails so the kubelet restarts it. Raise it if your batches
    take longer."""


class SecurityProtocol(StrEnum):
    """How clients talk to the brokers (Kafka's security.protocol)."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(StrEnum):
    """The SASL mechanism (Kafka's sasl.mechanism) for a username and password."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class SecretReference(ApiModel):
    """A Secret in the StreamingApp's namespace."""

    name: DnsSubdomain
    """The Secret's name."""


class SaslCredentials(ApiModel):
    """The SASL username and password, read from a Secret."""

    secret_ref: SecretReference
    """The Secret that holds them."""
    username_key: SecretKey = "username"
    """The Secret's key holding the username."""
    password_key: SecretKey = "password"
    """The Secret's key holding the password."""


class CaCertificate(ApiModel):
    """The CA certificate(s) (PEM) that signed the brokers' certificates, read from a Secret."""

    secret_ref: SecretReference
    """The Secret that holds them."""
    key: SecretKey = "ca.crt"
    """The Secret's key holding the PEM bundle."""


def _is_sasl(protocol: SecurityProtocol) -> bool:
    return protocol in {SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL}


class KafkaSecurity(ApiModel):
    """How the operator and the instances authenticate to Kafka; credentials stay in Secrets."""

    rules = (
        Rule(
            cel="self.securityProtocol.startsWith('SASL_') == has(self.saslMechanism)",
            message="saslMechanism is required with securityProtocol SASL_PLAINTEXT or "
            "SASL_SSL and not allowed with PLAINTEXT or SSL",
            check=lambda s: _is_sasl(s.security_protocol) == (s.sasl_mechanism is not None),
            field_path=".saslMechanism",
        ),
        Rule(
            cel="self.securityProtocol.startsWith('SASL_') == has(self.credentials)",
            message="credentials are required with securityProtocol SASL_PLAINTEXT or "
            "SASL_SSL and not allowed with PLAINTEXT or SSL",
            check=lambda s: _is_sasl(s.security_protocol) == (s.credentials is not None),
            field_path=".credentials",
        ),
        Rule(
            cel="!has(self.caCertificate) || self.securityProtocol.endsWith('SSL')",
            message="caCertificate is only used with securityProtocol SSL or SASL_SSL",
            check=lambda s: s.ca_certificate is None or s.security_protocol.endswith("SSL"),
            field_path=".caCertificate",
        ),
    )

    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    sasl_mechanism: SaslMechanism | None = None
    """PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; required with the SASL protocols."""
    credentials: SaslCredentials | None = None
    """The SASL username and password; required with the SASL protocols."""
    ca_certificate: CaCertificate | None = None
    """The CA that signed the brokers' certificates, when not a publicly trusted one."""


class StateStore(ApiModel):
    """A state store of the pipeline, backed by a changelog topic."""

    name: DnsLabel
    """The store's name (an RFC 1123 label: lowercase letters, digits, '-')."""
    changelog_topic: TopicName | None = None
    """The changelog topic; by default `<applicationId>-<name>-changelog`. It must have as many
    partitions as the input topics."""


def _changelogs_are_distinct(kafka: KafkaSpec) -> bool:
    named = [store.changelog_topic for store in kafka.state_stores if store.changelog_topic]
    others = {*kafka.input_topics, kafka.output_topic, kafka.dead_letter_topic}
    return len(set(named)) == len(named) and not others.intersection(named)


class KafkaSpec(ApiModel):
    """The Kafka cluster and the topics the app reads, writes and keeps its state in."""

    rules = (
        Rule(
            cel="!(self.outputTopic in self.inputTopics)",
            message="outputTopic must not be one of the inputTopics: the app would read its own "
            "output",
            check=lambda kafka: kafka.output_topic not in kafka.input_topics,
            field_path=".outputTopic",
        ),
        Rule(
            cel="!has(self.deadLetterTopic) || (!(self.deadLetterTopic in self.inputTopics) "
            "&& self.deadLetterTopic != self.outputTopic)",
            message="deadLetterTopic must differ from the inputTopics and the outputTopic",
            check=lambda kafka: (
                kafka.dead_letter_topic is None
                or kafka.dead_letter_topic not in {*kafka.input_topics, kafka.output_topic}
            ),
            field_path=".deadLetterTopic",
        ),
        Rule(
            cel="self.stateStores.all(s, !has(s.changelogTopic) || ("
            "!(s.changelogTopic in self.inputTopics) && s.changelogTopic != self.outputTopic "
            "&& (!has(self.deadLetterTopic) || s.changelogTopic != self.deadLetterTopic) "
            "&& self.stateStores.exists_one(t, has(t.changelogTopic) "
            "&& t.changelogTopic == s.changelogTopic)))",
            message="each changelogTopic must be a topic of its own: not an input, output or "
            "dead-letter topic, nor another store's changelog",
            check=_changelogs_are_distinct,
            field_path=".stateStores",
        ),
    )

    bootstrap_servers: Annotated[
        str, StringConstraints(min_length=1, max_length=4096, pattern=BOOTSTRAP_SERVERS_PATTERN)
    ]
    """Comma-separated host:port pairs of brokers, e.g. `kafka-0.kafka:9092,kafka-1.kafka:9092`."""
    application_id: (
        Annotated[str, StringConstraints(min_length=1, max_length=150, pattern=TOPIC_PATTERN)]
        | None
    ) = None
    """Prefix of every Kafka name the app owns (changelog topics, groups, transactional ids).
    Default: `<namespace>.<name>` of the StreamingApp. Changing it abandons the app's state."""
    security: KafkaSecurity = Field(
        default_factory=KafkaSecurity, json_schema_extra={"default": {}}
    )
    """Authentication and encryption; plaintext by default."""
    input_topics: Annotated[
        list[TopicName],
        Field(min_length=1, max_length=100),
        *_as_set(),
    ]
    """The topics the pipeline reads; they must be co-partitioned (same partition count):
    task i is partition i of each."""
    output_topic: TopicName
    """The topic the pipeline writes its results to."""
    dead_letter_topic: TopicName | None = None
    """Where records the pipeline cannot process go; default `<applicationId>-dead-letters`."""
    state_stores: Annotated[
        list[StateStore],
        Field(min_length=1, max_length=16),
        *_as_map("name"),
    ]
    """The pipeline's state stores (names unique); each is partitioned like the input."""


class DeletionPolicy(StrEnum):
    """What deleting the StreamingApp does to its state (spec.deletionPolicy)."""

    RETAIN = "Retain"
    DELETE = "Delete"


class ScalingStrategy(StrEnum):
    """How tasks move to a new owner (spec.scaling.strategy)."""

    WARM_UP = "WarmUp"
    COOPERATIVE = "Cooperative"
    RESTART = "Restart"
    STOP_THE_WORLD = "StopTheWorld"


class ScalingSpec(ApiModel):
    """How smoothscale moves tasks between instances (the knobs of KIP-441)."""

    strategy: ScalingStrategy = ScalingStrategy.WARM_UP
    """WarmUp: a task moves only once its new owner has caught up, warmed up in the background
    while the old owner keeps processing. Cooperative: no warm-ups; a task moves as soon as its
    new owner's pod is ready, and is stopped while the new owner restores its state (Kafka
    Streams without KIP-441's warm-ups). Restart: on any change of the instance count or the
    pod template, every pod releases its tasks and stops, then the new count starts and every
    task restores before it processes (what the Spark operators do; switching an app to it
    restarts it once). StopTheWorld: every task goes at once to its new owner, even a pod
    still starting, which restores the task's state before it processes it: the worst case.
    Cooperative, Restart and StopTheWorld are baselines to measure against
    (benchmarks/scaling.py), not for production."""

    acceptable_recovery_lag: Annotated[int, Field(strict=True, ge=0)] = 10_000
    """A warm-up whose changelog lag (records, summed over the task's stores) is at most this is
    caught up: its task moves to it within one lag poll."""
    max_warmup_replicas: Annotated[int, Field(strict=True, ge=1, le=1000)] = 2
    """At most this many warm-up tasks restore at once across the app (bounds the extra load on
    Kafka and the pods while scaling)."""
    num_standby_replicas: Annotated[int, Field(strict=True, ge=0, le=10)] = 0
    """Hot copies kept of every task on other instances, for fast fail-over."""
    probing_interval: PositiveDuration = timedelta(minutes=1)
    """How often the operator re-plans when nothing changed, to start new warm-ups towards a
    balanced assignment (KIP-441's probing rebalance). Caught-up warm-ups do not wait for it."""
    lag_poll_interval: PositiveDuration = timedelta(seconds=5)
    """How often the operator reads changelog lag while tasks are warming up or moving."""
    drain_timeout: PositiveDuration = timedelta(minutes=10)
    """On scale-in: how long to wait for the replacements of a draining instance to catch up
    before moving its tasks anyway (with a Warning event)."""


class NodeSpread(StrEnum):
    """How the instance pods spread over nodes."""

    PREFERRED = "Preferred"
    REQUIRED = "Required"
    NONE = "None"


class StreamingAppSpec(ApiModel):
    """The desired state of a StreamingApp; the operator never writes it."""

    replicas: Annotated[int, Field(strict=True, ge=0, le=10_000)] = 1
    """How many instances (pods) to run; the scale subresource (kubectl scale, an HPA) sets it."""
    image: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    """The container image of the instances: smoothscale's image plus the pipeline's code."""
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    """Always, IfNotPresent or Never."""
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, json_schema_extra={"default": {}}
    )
    """CPU and memory per instance; bounded by default."""
    state_volume: StateVolume = Field(
        default_factory=StateVolume, json_schema_extra={"default": {}}
    )
    """The local disk of each instance's state stores."""
    env: Annotated[
        list[EnvVar] | None,
        Field(max_length=256),
        *_as_map("name"),
    ] = None
    """Extra environment variables of the instance container."""
    service_account_name: DnsSubdomain | None = None
    """The ServiceAccount of the instance pods (default: the namespace's default)."""
    node_selector: dict[str, str] | None = None
    """Node labels an instance pod's node must have."""
    tolerations: Annotated[list[Toleration] | None, Field(max_length=64)] = None
    """Taints the instance pods tolerate."""
    node_spread: NodeSpread = NodeSpread.PREFERRED
    """How the instance pods spread over nodes (a topology spread constraint on
    kubernetes.io/hostname, max skew 1): Preferred (ScheduleAnyway), Required (DoNotSchedule)
    or None. A node lost at once takes with it the tasks of the instances on it: spread, and
    with numStandbyReplicas a standby elsewhere, bound that loss (docs/disruptions.md)."""
    termination_grace_period_seconds: Annotated[int, Field(strict=True, ge=0, le=86_400)] | None = (
        None
    )
    """Seconds a pod gets to stop after SIGTERM (default 30). The operator drains an instance
    before deleting it, so this only bounds the final commit; a pod deleted or evicted by
    someone else goes on processing while its tasks are handed over, for half of it."""
    pipeline: PipelineSpec
    """The pipeline every instance runs."""
    kafka: KafkaSpec
    """Kafka connection, topics and state stores."""
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, json_schema_extra={"default": {}})
    """How tasks move while scaling."""
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    """When the StreamingApp is deleted, once every task is released and every pod is gone:
    Retain keeps its changelog and assignments topics, so the app applied again under the same
    name resumes exactly where it stopped; Delete deletes them (its state is gone for good).
    The input, output and dead-letter topics are never deleted: they hold your data."""


# ---------------------------------------------------------------------------------------------
# Status


class Phase(StrEnum):
    """The app's state at a glance."""

    PENDING = "Pending"
    """Accepted; instances are not all running yet."""
    RUNNING = "Running"
    """Every task is active on a caught-up instance and the assignment is balanced."""
    SCALING = "Scaling"
    """Tasks are warming up, moving or draining towards spec.replicas."""
    DEGRADED = "Degraded"
    """Running, but some task has no active owner or an instance is failing."""
    FAILED = "Failed"
    """The operator cannot run the app as specified (see the conditions)."""


class ConditionType(StrEnum):
    """The condition types smoothscale sets."""

    READY = "Ready"
    """Every task has an active owner that is processing."""
    PROGRESSING = "Progressing"
    """A scale-out, scale-in or hand-over is under way."""
    DEGRADED = "Degraded"
    """Something needs attention (a failed pod, a drain that timed out, an unreachable broker)."""


class ConditionStatus(StrEnum):
    """metav1.ConditionStatus."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def _kubernetes_time(value: datetime) -> str:
    return value.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


KubernetesTime = Annotated[datetime, PlainSerializer(_kubernetes_time, return_type=str)]
"""An RFC 3339 timestamp in UTC, whole seconds (metav1.Time)."""


class Condition(ApiModel):
    """One aspect of the app's state (the shape of metav1.Condition)."""

    type: Annotated[
        str,
        StringConstraints(
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    ]
    """The condition's type: Ready, Progressing or Degraded (ConditionType)."""
    status: ConditionStatus
    """True, False or Unknown."""
    observed_generation: Annotated[int, Field(strict=True, ge=0)] | None = None
    """The metadata.generation the condition was set from."""
    last_transition_time: KubernetesTime
    """When status last changed."""
    reason: Annotated[
        str,
        StringConstraints(
            min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
        ),
    ]
    """A CamelCase word saying why, e.g. WarmupsCatchingUp."""
    message: Annotated[str, StringConstraints(max_length=32768)]
    """A sentence for people."""


class TaskHolder(ApiModel):
    """An instance holding a task, in one role."""

    instance: DnsSubdomain
    """The instance (pod name)."""
    role: TaskRole
    """active, standby or warmup."""
    lag: Annotated[int, Field(strict=True, ge=0)] | None = None
    """Changelog records the instance is behind (summed over stores); absent until it reports."""


class TaskHandover(ApiModel):
    """A change of active owner under way (steps 3 to 5 of the hand-over protocol)."""

    from_instance: DnsSubdomain | None = None
    """The owner giving the task up; absent when it died (fail-over)."""
    to_instance: DnsSubdomain
    """The caught-up instance taking the task over."""
    restore_until: dict[str, Annotated[int, Field(strict=True, ge=0)]] | None = None
    """Per state store, the changelog offset the old owner acknowledged on release; the new
    owner restores up to it before processing. Absent until the old owner has released."""
    started: KubernetesTime | None = None
    """When the old owner was told to release the task (the hand-over's step 3)."""


class TaskStatus(ApiModel):
    """Who holds one task, as the operator last assigned it."""

    task: Annotated[TaskId, Field(strict=True, ge=0)]
    """The task id: partition i of the input and changelog topics."""
    epoch: Annotated[int, Field(strict=True, ge=0)] = 0
    """The ownership epoch; the operator bumps it at every change of active owner."""
    holders: Annotated[
        list[TaskHolder],
        *_as_map("instance"),
    ] = Field(default_factory=list)
    """The instances holding the task, at most one of them active."""
    handover: TaskHandover | None = None
    """Set while the task moves to a new active owner; cleared once the new owner is active."""
    input_lag: Annotated[int, Field(strict=True, ge=0)] | None = None
    """Input records of the task's partitions not processed yet (as of the active owner's
    last report); absent while it has no active owner."""
    input_lag_seconds: Annotated[float, Field(ge=0)] | None = None
    """How old the newest input record the active owner has processed is, while input waits
    (0 when none does); absent when the records carry no timestamps."""

    def holders_in(self, role: TaskRole) -> list[TaskHolder]:
        """The holders in `role`."""
        return [holder for holder in self.holders if holder.role == role]

    @property
    def active(self) -> TaskHolder | None:
        """The active owner, if the task has one."""
        return next(iter(self.holders_in(TaskRole.ACTIVE)), None)


class InstanceSummary(ApiModel):
    """One instance (pod) as the operator sees it."""

    name: DnsSubdomain
    """The pod's name, also the instance id."""
    uid: str | None = None
    """The pod's uid: a pod re-created under the same name is a new instance (empty disk)."""
    ready: bool = False
    """Whether the pod is ready (its worker's streaming query runs)."""
    draining: bool = False
    """Being removed by a scale-in: its tasks move off it before the pod is deleted."""
    draining_since: KubernetesTime | None = None
    """When its drain began (spec.scaling.drainTimeout counts from here)."""
    active_tasks: Annotated[int, Field(strict=True, ge=0)] = 0
    """Tasks it holds active."""
    warmup_tasks: Annotated[int, Field(strict=True, ge=0)] = 0
    """Tasks it is warming up."""
    standby_tasks: Annotated[int, Field(strict=True, ge=0)] = 0
    """Tasks it keeps as standby."""


class ScalingSummary(ApiModel):
    """The last change of the instance count, from the first poll that saw it until settled."""

    from_replicas: Annotated[int, Field(strict=True, ge=0)]
    """Instances before the change."""
    to_replicas: Annotated[int, Field(strict=True, ge=0)]
    """Instances asked for (spec.replicas, capped at the task count)."""
    started: KubernetesTime
    """When the operator first acted on the change."""
    finished: KubernetesTime | None = None
    """When every task was active on the new instances and the drained pods were gone."""
    hand_overs: Annotated[int, Field(strict=True, ge=0)] = 0
    """Tasks handed over from one instance to another during the change."""
    longest_hand_over_seconds: Annotated[float, Field(ge=0)] | None = None
    """The longest hand-over, from the operator asking the old owner to release the task to
    the new owner reporting it active. The old owner processes the task until the end of its
    micro-batch, so the task stands still for less than this."""


class StreamingAppStatus(ApiModel):
    """What the operator observed and decided; only the operator writes it."""

    observed_generation: Annotated[int, Field(strict=True, ge=0)] | None = None
    """The metadata.generation of the spec this status reflects."""
    phase: Phase = Phase.PENDING
    """Pending, Running, Scaling, Degraded or Failed."""
    replicas: Annotated[int, Field(strict=True, ge=0)] = 0
    """Instances (pods) that exist, whatever their state: the scale subresource's replicas."""
    ready_replicas: Annotated[int, Field(strict=True, ge=0)] = 0
    """Instances whose pod is ready."""
    active_replicas: Annotated[int, Field(strict=True, ge=0)] = 0
    """Instances that own at least one active task."""
    warmup_replicas: Annotated[int, Field(strict=True, ge=0)] = 0
    """Instances restoring at least one warm-up task."""
    selector: str | None = None
    """The label selector of the app's pods, for the scale subresource (an HPA reads it)."""
    desired_replicas: Annotated[int, Field(strict=True, ge=0)] | None = None
    """spec.replicas capped at the number of tasks (an instance beyond it would hold nothing)."""
    tasks_total: Annotated[int, Field(strict=True, ge=0)] | None = None
    """The number of tasks: the partition count of the input topics."""
    max_lag: Annotated[int, Field(strict=True, ge=0)] | None = None
    """The largest changelog lag of any warm-up or standby task (records)."""
    input_lag: Annotated[int, Field(strict=True, ge=0)] | None = None
    """Input records not processed yet, summed over the tasks that have an active owner: the
    number that says whether the app keeps up (also the metric
    smoothscale_app_input_lag_records, for an HPA or KEDA)."""
    input_lag_seconds: Annotated[float, Field(ge=0)] | None = None
    """The largest input lag in seconds of any task (see tasks[].inputLagSeconds)."""
    assignment_generation: Annotated[int, Field(strict=True, ge=0)] = 0
    """The generation of the last assignment written to the assignments topic."""
    tasks: Annotated[
        list[TaskStatus],
        *_as_map("task"),
    ] = Field(default_factory=list)
    """Per task: who holds it, in which role, how far behind."""
    instances: Annotated[
        list[InstanceSummary],
        *_as_map("name"),
    ] = Field(default_factory=list)
    """Per instance (pod): readiness, drain and the tasks it holds."""
    last_scaling: ScalingSummary | None = None
    """The last change of the instance count and how it went."""
    conditions: Annotated[
        list[Condition],
        *_as_map("type"),
    ] = Field(default_factory=list)
    """Ready, Progressing and Degraded, in the metav1.Condition shape."""

    def condition(self, type_: ConditionType) -> Condition | None:
        """The condition of this type, if set."""
        return next((c for c in self.conditions if c.type == type_), None)


# ---------------------------------------------------------------------------------------------
# The resource


class StreamingApp(ApiModel):
    """A stateful PySpark streaming app that smoothscale scales without stopping it."""

    api_version: Literal["smoothscale.io/v1alpha1"] = "smoothscale.io/v1alpha1"
    """smoothscale.io/v1alpha1."""
    kind: Literal["StreamingApp"] = "StreamingApp"
    """StreamingApp."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata (name, namespace, labels, ...)."""
    spec: StreamingAppSpec
    """The desired state."""
    status: StreamingAppStatus | None = None
    """The observed state, written by the operator."""

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")


def application_id(app: StreamingApp) -> str:
    """The app's Kafka application id: spec.kafka.applicationId, else `<namespace>.<name>`."""
    return app.spec.kafka.application_id or names.default_application_id(app.namespace, app.name)
