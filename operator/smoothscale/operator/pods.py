"""The instance pods of a StreamingApp: their names, labels, and the Pod object itself.

The operator manages bare Pods named `<app>-<ordinal>` (docs/decisions/instance-pods.md says
why not a StatefulSet). Everything here is pure: the StreamingApp in, JSON out, no API calls.

A pod runs `smoothscale worker` with its WorkerConfig as JSON in $SMOOTHSCALE_WORKER_CONFIG.
Paths in that config are relative to the working directory, which in the image is a writable
emptyDir at the image's home (the Dockerfile's WORKDIR and HOME); the local process kubelet
gives each container a directory of its own instead, and the same pod runs there unchanged.
Each instance listens on a port of its own (8080 + ordinal) for the same reason: instances
that share a network namespace (the process kubelet, where every pod is 127.0.0.1) must not
collide, and in a cluster the probes and a PodMonitor find it by its name, `http`. The base
is the operator's `--instance-port` (so two local stacks on one machine can keep apart).
"""

import hashlib
import json
import re
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Any

from smoothscale.api.models import API_VERSION, KIND, NodeSpread, StreamingApp, application_id
from smoothscale.operator.kafka_client import security_settings
from smoothscale.runtime.config import (
    CONFIG_ENV,
    INSTANCE_ID_ENV,
    SASL_PASSWORD_ENV,
    SASL_USERNAME_ENV,
    WorkerConfig,
)
from smoothscale.runtime.spark import DRIVER_MEMORY
from smoothscale.tasks import TaskRole

JsonObject = dict[str, Any]

LABEL_PREFIX = "smoothscale.io/"
APP_LABEL = f"{LABEL_PREFIX}app"
INSTANCE_LABEL = f"{LABEL_PREFIX}instance"
ROLE_LABEL = f"{LABEL_PREFIX}role"
EVICTABLE_LABEL = f"{LABEL_PREFIX}evictable"
"""Set by the operator on a pod that holds no task any more and sits on a node being drained:
the app's PodDisruptionBudget no longer selects it, so the drain's eviction takes it."""
TEMPLATE_HASH_ANNOTATION = f"{LABEL_PREFIX}pod-template-hash"
INSTANCES_ANNOTATION = f"{LABEL_PREFIX}instances"
"""The app's instance count when the pod was created: strategy Restart restarts every pod
created for another count."""
MANAGED_BY = "smoothscale"
COMPONENT = "worker"
CONTAINER_NAME = "worker"

MAX_NAME_LENGTH = 63
"""Instance names are label values (smoothscale.io/instance) and hostnames: at most 63."""
_ORDINAL_NAME = re.compile(r"^(?P<app>.+)-(?P<ordinal>0|[1-9][0-9]*)$")

BASE_PORT = 8080
"""The port of instance 0's /metrics, /readyz and /healthz; instance n listens on 8080 + n."""
PORT_NAME = "http"

RUN_AS_ID = 10001
"""The uid and gid of the image's user (Dockerfile: useradd --uid 10001)."""
IMAGE_HOME = "/home/smoothscale"
"""The image's HOME and working directory; a writable emptyDir in the pod."""
STATE_DIR = Path("state")
"""The instance's local state stores, relative to the working directory (an emptyDir)."""
HOME_SIZE_LIMIT = "1Gi"
"""The working directory holds nothing but the state mount; a bound, not a budget."""
TMP_SIZE_LIMIT = "2Gi"
"""Spark's scratch space (its query checkpoint and shuffle files of micro-batches, which the
source caps per partition)."""
CA_DIR = "/etc/smoothscale/kafka-ca"
CA_FILE = "ca.crt"

DEFAULT_TERMINATION_GRACE_SECONDS = 30
"""Kubernetes' default, and the CRD's documented default for terminationGracePeriodSeconds."""
SHUTDOWN_MARGIN_SECONDS = 5.0
"""Of the grace period, what the worker keeps after its shutdown_timeout to release its tasks
and stop Spark before the kubelet's SIGKILL."""

STARTUP_PERIOD_SECONDS = 2
STARTUP_FAILURE_THRESHOLD = 90
"""A Spark session starts in 10 to 35 s; 2 s x 90 = 3 minutes leaves room for a loaded node
before the kubelet restarts the container."""


class PodSpecError(ValueError):
    """The StreamingApp cannot be turned into a pod; the message says what to change."""


class InstanceRole(StrEnum):
    """What an instance does for its app, at a glance (the smoothscale.io/role label)."""

    ACTIVE = "active"
    """Holds at least one active task."""
    STANDBY = "standby"
    """Holds only standby tasks (and maybe warm-ups)."""
    WARMUP = "warmup"
    """Holds only warm-up tasks: restoring state before taking tasks over."""
    IDLE = "idle"
    """Holds nothing: just created, or drained before its deletion."""


def instance_role(roles: set[TaskRole]) -> InstanceRole:
    """The role label of an instance holding tasks in `roles`: the most serving one wins."""
    if TaskRole.ACTIVE in roles:
        return InstanceRole.ACTIVE
    if TaskRole.STANDBY in roles:
        return InstanceRole.STANDBY
    if TaskRole.WARMUP in roles:
        return InstanceRole.WARMUP
    return InstanceRole.IDLE


def instance_name(app_name: str, ordinal: int) -> str:
    """The name of the app's instance `ordinal`: `<app>-<ordinal>`, also its pod's name."""
    if ordinal < 0:
        raise ValueError(f"an instance ordinal is a number from 0 up, not {ordinal}")
    name = f"{app_name}-{ordinal}"
    if len(name) > MAX_NAME_LENGTH:
        raise PodSpecError(
            f"the StreamingApp name {app_name!r} is too long for its instances: pod "
            f"{name!r} has {len(name)} characters, and an instance name is a label value of at "
            f"most {MAX_NAME_LENGTH}; name the StreamingApp with at most "
            f"{MAX_NAME_LENGTH - len(str(ordinal)) - 1} characters"
        )
    return name


def ordinal_of(name: str) -> int:
    """The ordinal of an instance name `<app>-<ordinal>`."""
    match = _ORDINAL_NAME.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not an instance name: it does not end in -<ordinal>")
    return int(match.group("ordinal"))


def instance_port(ordinal: int, base_port: int = BASE_PORT) -> int:
    """The port instance `ordinal` serves /metrics, /readyz and /healthz on: `base_port` + n."""
    port = base_port + ordinal
    if port > 65535:
        raise PodSpecError(
            f"instance ordinal {ordinal} has no port: instance n listens on {base_port} + n, "
            f"so ordinals stop at {65535 - base_port}"
        )
    return port


def pod_labels(app: str, instance: str, role: InstanceRole) -> dict[str, str]:
    """The labels of an instance pod: which app, which instance, what it holds."""
    return {
        APP_LABEL: app,
        INSTANCE_LABEL: instance,
        ROLE_LABEL: role.value,
        "app.kubernetes.io/name": "smoothscale",
        "app.kubernetes.io/instance": app,
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def app_selector(app: str) -> str:
    """The label selector of the app's instance pods (status.selector, the scale subresource)."""
    return f"{APP_LABEL}={app},app.kubernetes.io/managed-by={MANAGED_BY}"


def termination_grace_seconds(app: StreamingApp) -> int:
    """The pod's grace period: the spec's, or Kubernetes' default of 30 s."""
    grace = app.spec.termination_grace_period_seconds
    return DEFAULT_TERMINATION_GRACE_SECONDS if grace is None else grace


def shutdown_timeout(grace_seconds: int) -> float:
    """How long the worker waits for its micro-batch on SIGTERM: the grace period less a margin
    to release and stop (at least half the grace period, and never zero)."""
    return max(grace_seconds - SHUTDOWN_MARGIN_SECONDS, grace_seconds / 2, 0.5)


def worker_config(
    app: StreamingApp, instance_name: str, base_port: int = BASE_PORT
) -> WorkerConfig:
    """The configuration of one instance, rendered from the app's spec (no secrets in it)."""
    spec = app.spec
    kafka_config = security_settings(spec.kafka.security)
    if spec.kafka.security.ca_certificate is not None:
        kafka_config["ssl.ca.location"] = f"{CA_DIR}/{CA_FILE}"
    return WorkerConfig.model_validate(
        {
            "app_id": application_id(app),
            "instance_id": instance_name,
            "bootstrap_servers": spec.kafka.bootstrap_servers,
            "kafka_config": kafka_config,
            "input_topics": spec.kafka.input_topics,
            "output_topic": spec.kafka.output_topic,
            "dead_letter_topic": spec.kafka.dead_letter_topic,
            "stores": {store.name: store.changelog_topic for store in spec.kafka.state_stores},
            "pipeline": spec.pipeline.ref,
            "trigger_interval": spec.pipeline.trigger_interval.total_seconds(),
            "stall_timeout": spec.pipeline.stall_timeout.total_seconds(),
            "state_dir": STATE_DIR,
            "metrics_port": instance_port(ordinal_of(instance_name), base_port),
            "shutdown_timeout": shutdown_timeout(termination_grace_seconds(app)),
        }
    )


def pod_template_hash(app: StreamingApp) -> str:
    """A stable hash of everything in a pod that comes from the spec: when it changes, the
    running pods are out of date. replicas and scaling shape no pod, so they are left out."""
    shaping = app.spec.model_dump(mode="json", by_alias=True, exclude={"replicas", "scaling"})
    canonical = json.dumps({"applicationId": application_id(app), "spec": shaping}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _owned_by(app: StreamingApp, owner_uid: str) -> list[JsonObject]:
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": app.name,
            "uid": owner_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _app_pods(app: StreamingApp) -> JsonObject:
    """A label selector of the app's instance pods (a PodDisruptionBudget's, a spread's)."""
    return {"matchLabels": {APP_LABEL: app.name, "app.kubernetes.io/managed-by": MANAGED_BY}}


def disruption_budgets_path(namespace: str) -> str:
    return f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"


def disruption_budget(app: StreamingApp, owner_uid: str, pods: int) -> JsonObject:
    """The app's policy/v1 PodDisruptionBudget, owned by the StreamingApp: no instance pod may
    be evicted. A drain (`kubectl drain`, a node autoscaler) then waits, retrying, while the
    operator moves each pod's state off its node by warm-ups and hand-overs; the eviction API
    never kills an active owner.

    `minAvailable` is the app's `pods` (the operator keeps it equal to the pods it selects),
    not `maxUnavailable: 0`: with that, the API server expects as many healthy pods as the
    app's scale says (spec.replicas), so the surge pod of a rolling update or a drain, once
    ready, lets one eviction through, and the drain takes an active owner out from under the
    hand-over being prepared for it.

    A pod labelled EVICTABLE_LABEL (drained, on a node being drained) is not selected: the
    drain's eviction takes it, rather than the operator deleting it. A drain evicts by name
    and tries again every few seconds: had the operator deleted the pod and created it again
    under the same name on another node, the drain would go on evicting the new pod, refused
    for ever."""
    selector = {
        **_app_pods(app),
        "matchExpressions": [{"key": EVICTABLE_LABEL, "operator": "DoesNotExist"}],
    }
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": app.name,
            "labels": {APP_LABEL: app.name, "app.kubernetes.io/managed-by": MANAGED_BY},
            "ownerReferences": _owned_by(app, owner_uid),
        },
        "spec": {"minAvailable": pods, "selector": selector},
    }


def build_pod(
    app: StreamingApp,
    ordinal: int,
    owner_uid: str,
    base_port: int = BASE_PORT,
    instances: int | None = None,
) -> JsonObject:
    """The core/v1 Pod of the app's instance `ordinal`, owned by the StreamingApp (`owner_uid`),
    created while the app runs `instances` instances (INSTANCES_ANNOTATION, when given).

    It starts with role idle: a new instance holds nothing until the operator assigns it tasks.
    """
    spec = app.spec
    name = instance_name(app.name, ordinal)
    config = worker_config(app, name, base_port)
    pod_spec: JsonObject = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": termination_grace_seconds(app),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_ID,
            "runAsGroup": RUN_AS_ID,
            "fsGroup": RUN_AS_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(app, config)],
        "volumes": _volumes(app),
    }
    if spec.service_account_name is not None:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.node_spread is not NodeSpread.NONE:
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule"
                if spec.node_spread is NodeSpread.REQUIRED
                else "ScheduleAnyway",
                "labelSelector": _app_pods(app),
            }
        ]
    if spec.tolerations:
        pod_spec["tolerations"] = [toleration.to_kubernetes() for toleration in spec.tolerations]
    annotations = {TEMPLATE_HASH_ANNOTATION: pod_template_hash(app)}
    if instances is not None:
        annotations[INSTANCES_ANNOTATION] = str(instances)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": app.namespace,
            "labels": pod_labels(app.name, name, InstanceRole.IDLE),
            "annotations": annotations,
            "ownerReferences": _owned_by(app, owner_uid),
        },
        "spec": pod_spec,
    }


def _container(app: StreamingApp, config: WorkerConfig) -> JsonObject:
    spec = app.spec
    container: JsonObject = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": ["smoothscale"],
        "args": ["worker"],
        "workingDir": IMAGE_HOME,
        "ports": [{"name": PORT_NAME, "containerPort": config.metrics_port, "protocol": "TCP"}],
        "env": _env(app, config),
        # A worker that fails before it can say why (a pipeline that does not import) still
        # leaves the end of its log as the reason, for the operator and `kubectl describe`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "startupProbe": _probe(
            "/readyz", STARTUP_PERIOD_SECONDS, failure_threshold=STARTUP_FAILURE_THRESHOLD
        ),
        "readinessProbe": _probe("/readyz", period_seconds=5, failure_threshold=2),
        "livenessProbe": _probe("/healthz", period_seconds=10, failure_threshold=6),
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": _volume_mounts(app),
        "resources": _resources(app),
    }
    return container


MIN_MEMORY_LIMIT = "1536Mi"
"""The least memory limit an instance can run in: its driver JVM (512m heap) and Python
processes took about 1.1 GiB at small sizes (docs/decisions/instance-pods.md, Resources)."""


def _resources(app: StreamingApp) -> JsonObject:
    """The container's requests and limits, checked: a memory limit below MIN_MEMORY_LIMIT would
    only OOM-kill the instance, and Kubernetes refuses a request above its limit."""
    resources = app.spec.resources
    memory = resources.limits.get("memory")
    if memory is not None and _quantity(memory) < _quantity(MIN_MEMORY_LIMIT):
        raise PodSpecError(
            f"spec.resources.limits.memory ({memory}) is too small for an instance: its Spark "
            f"driver's JVM ({DRIVER_MEMORY} heap) and Python processes need about 1.1 GiB, so "
            f"the instance would be OOM-killed; give it at least {MIN_MEMORY_LIMIT}"
        )
    for resource, request in resources.requests.items():
        limit = resources.limits.get(resource)
        if limit is not None and _quantity(request) > _quantity(limit):
            raise PodSpecError(
                f"spec.resources.requests.{resource} ({request}) is above "
                f"spec.resources.limits.{resource} ({limit}): a request may not exceed its "
                "limit (requests or limits left out of the spec get their defaults); lower the "
                "request or raise the limit"
            )
    return resources.to_kubernetes()


def _quantity(value: int | str) -> Decimal:
    # Imported here: `smoothscale --help` imports this module, and must stay quick.
    from kubernetes.utils import parse_quantity

    quantity: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]
    return quantity


def _env(app: StreamingApp, config: WorkerConfig) -> list[JsonObject]:
    """The operator's variables first, the user's last (they may refer to ours as $(NAME))."""
    env: list[JsonObject] = [
        _field_env(INSTANCE_ID_ENV, "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_UID", "metadata.uid"),
        {"name": CONFIG_ENV, "value": config.model_dump_json()},
    ]
    credentials = app.spec.kafka.security.credentials
    if credentials is not None:
        env += [
            _secret_env(SASL_USERNAME_ENV, credentials.secret_ref.name, credentials.username_key),
            _secret_env(SASL_PASSWORD_ENV, credentials.secret_ref.name, credentials.password_key),
        ]
    reserved = {variable["name"] for variable in env}
    for variable in app.spec.env or []:
        if variable.name in reserved:
            raise PodSpecError(
                f"spec.env sets {variable.name}, which the operator sets on every instance "
                f"(reserved: {', '.join(sorted(reserved))}); remove it from spec.env"
            )
        env.append(variable.to_kubernetes())
    return env


def _field_env(name: str, field_path: str) -> JsonObject:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def _secret_env(name: str, secret: str, key: str) -> JsonObject:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _probe(path: str, period_seconds: int, failure_threshold: int) -> JsonObject:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period_seconds,
        "timeoutSeconds": 2,
        "failureThreshold": failure_threshold,
    }


def _volumes(app: StreamingApp) -> list[JsonObject]:
    volumes: list[JsonObject] = [
        {"name": "home", "emptyDir": {"sizeLimit": HOME_SIZE_LIMIT}},
        {"name": "state", "emptyDir": {"sizeLimit": app.spec.state_volume.size_limit}},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}},
    ]
    ca = app.spec.kafka.security.ca_certificate
    if ca is not None:
        volumes.append(
            {
                "name": "kafka-ca",
                "secret": {
                    "secretName": ca.secret_ref.name,
                    "items": [{"key": ca.key, "path": CA_FILE}],
                    "defaultMode": 0o444,
                },
            }
        )
    return volumes


def _volume_mounts(app: StreamingApp) -> list[JsonObject]:
    mounts: list[JsonObject] = [
        {"name": "home", "mountPath": IMAGE_HOME},
        {"name": "state", "mountPath": f"{IMAGE_HOME}/{STATE_DIR}"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if app.spec.kafka.security.ca_certificate is not None:
        mounts.append({"name": "kafka-ca", "mountPath": CA_DIR, "readOnly": True})
    return mounts
