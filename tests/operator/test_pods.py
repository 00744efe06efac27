"""Instance pods built from a StreamingApp: names, labels, and every spec field in its place."""

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.utils import parse_quantity
from kubernetes_validate.utils import latest_version

from smoothscale.api.models import StreamingApp
from smoothscale.operator.pods import (
    MIN_MEMORY_LIMIT,
    TEMPLATE_HASH_ANNOTATION,
    InstanceRole,
    PodSpecError,
    app_selector,
    build_pod,
    disruption_budget,
    instance_name,
    instance_role,
    ordinal_of,
    pod_labels,
    worker_config,
)
from smoothscale.runtime.config import CONFIG_ENV, WorkerConfig
from smoothscale.runtime.spark import DRIVER_MEMORY
from smoothscale.tasks import TaskRole

REPOSITORY = Path(__file__).resolve().parents[2]
OWNER_UID = "6f1c2a4e-0000-4000-8000-000000000001"
USERNAME = "alice-the-user"
PASSWORD = "s3cret-passw0rd"

MINIMAL: dict[str, Any] = {
    "metadata": {"name": "counter", "namespace": "shop"},
    "spec": {
        "image": "registry.example/counter:1.0",
        "pipeline": {"ref": "examples.pipelines.running_count:pipeline"},
        "kafka": {
            "bootstrapServers": "kafka:9092",
            "inputTopics": ["clicks"],
            "outputTopic": "totals",
            "stateStores": [{"name": "counts"}],
        },
    },
}

FULL: dict[str, Any] = {
    "metadata": {"name": "counter", "namespace": "shop"},
    "spec": {
        "replicas": 3,
        "image": "registry.example/counter:1.0",
        "imagePullPolicy": "Always",
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "3Gi"}},
        "env": [
            {"name": "SPARK_DRIVER_MEMORY", "value": "1g"},
            {
                "name": "TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "api-token", "key": "token"}},
            },
        ],
        "serviceAccountName": "counter-runner",
        "nodeSelector": {"pool": "streaming"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "streaming"}],
        "terminationGracePeriodSeconds": 60,
        "pipeline": {"ref": "examples.pipelines.running_count:pipeline", "triggerInterval": "5s"},
        "kafka": {
            "bootstrapServers": "kafka-0:9093,kafka-1:9093",
            "applicationId": "counter-v2",
            "security": {
                "securityProtocol": "SASL_SSL",
                "saslMechanism": "SCRAM-SHA-512",
                "credentials": {
                    "secretRef": {"name": "kafka-user"},
                    "usernameKey": "user",
                    "passwordKey": "pass",
                },
                "caCertificate": {"secretRef": {"name": "kafka-ca"}, "key": "ca.pem"},
            },
            "inputTopics": ["clicks", "views"],
            "outputTopic": "totals",
            "deadLetterTopic": "bad-clicks",
            "stateStores": [{"name": "counts"}, {"name": "windows", "changelogTopic": "win-log"}],
        },
    },
}


def app(source: dict[str, Any]) -> StreamingApp:
    return StreamingApp.model_validate(source)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    [only] = pod["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def env_of(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in container(pod)["env"]}


def config_of(pod: dict[str, Any]) -> dict[str, Any]:
    loaded = json.loads(env_of(pod)["SMOOTHSCALE_WORKER_CONFIG"]["value"])
    assert isinstance(loaded, dict)
    return loaded


# --- Names and labels --------------------------------------------------------------------------


def test_instance_names_are_the_app_name_and_an_ordinal_and_parse_back() -> None:
    assert instance_name("page-counts", 0) == "page-counts-0"
    assert instance_name("page-counts", 12) == "page-counts-12"
    assert ordinal_of("page-counts-12") == 12
    assert ordinal_of("my-app-2-7") == 7


@pytest.mark.parametrize("name", ["page-counts", "page-counts-", "page-counts-01", "a-x"])
def test_a_name_without_an_ordinal_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="does not end in -<ordinal>"):
        ordinal_of(name)


def test_an_app_name_too_long_for_its_instances_says_how_long_it_may_be() -> None:
    assert len(instance_name("a" * 61, 9)) == 63
    with pytest.raises(PodSpecError, match="at most 60 characters"):
        instance_name("a" * 61, 10)


def test_labels_name_app_instance_and_role_and_the_selector_matches_them() -> None:
    labels = pod_labels("counter", "counter-1", InstanceRole.WARMUP)
    assert labels == {
        "smoothscale.io/app": "counter",
        "smoothscale.io/instance": "counter-1",
        "smoothscale.io/role": "warmup",
        "app.kubernetes.io/name": "smoothscale",
        "app.kubernetes.io/instance": "counter",
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/managed-by": "smoothscale",
    }
    selector = dict(term.split("=") for term in app_selector("counter").split(","))
    assert selector.items() <= labels.items()
    assert not selector.items() <= pod_labels("other", "other-1", InstanceRole.WARMUP).items()


def test_the_role_label_says_the_most_serving_role_an_instance_holds() -> None:
    assert instance_role({TaskRole.WARMUP, TaskRole.ACTIVE}) is InstanceRole.ACTIVE
    assert instance_role({TaskRole.WARMUP, TaskRole.STANDBY}) is InstanceRole.STANDBY
    assert instance_role({TaskRole.WARMUP}) is InstanceRole.WARMUP
    assert instance_role(set()) is InstanceRole.IDLE


# --- The pod -------------------------------------------------------------------------------------


def minimum_kubernetes_version() -> str:
    """The oldest Kubernetes the chart installs on (Chart.yaml's kubeVersion)."""
    chart = yaml.safe_load((REPOSITORY / "charts" / "smoothscale" / "Chart.yaml").read_text())
    version = chart["kubeVersion"].removeprefix(">=").removesuffix("-0")
    assert isinstance(version, str)
    return version


@pytest.mark.parametrize("source", [MINIMAL, FULL], ids=["minimal", "full"])
@pytest.mark.parametrize("kubernetes_version", [minimum_kubernetes_version(), latest_version()])
def test_the_pod_is_valid_kubernetes(source: dict[str, Any], kubernetes_version: str) -> None:
    kubernetes_validate.validate(build_pod(app(source), 1, OWNER_UID), kubernetes_version, True)


def test_the_validation_above_can_fail() -> None:
    pod = build_pod(app(MINIMAL), 1, OWNER_UID)
    container(pod)["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, latest_version(), strict=True)


def test_a_minimal_app_gets_a_pod_running_the_worker_with_defaults() -> None:
    pod = build_pod(app(MINIMAL), 2, OWNER_UID)

    assert pod["metadata"]["name"] == "counter-2"
    assert pod["metadata"]["namespace"] == "shop"
    assert pod["metadata"]["labels"]["smoothscale.io/role"] == "idle"
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "smoothscale.io/v1alpha1",
            "kind": "StreamingApp",
            "name": "counter",
            "uid": OWNER_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Always"
    assert spec["terminationGracePeriodSeconds"] == 30
    assert not {"serviceAccountName", "nodeSelector", "tolerations"} & spec.keys()
    worker = container(pod)
    assert worker["image"] == "registry.example/counter:1.0"
    assert worker["imagePullPolicy"] == "IfNotPresent"
    assert [*worker["command"], *worker["args"]] == ["smoothscale", "worker"]
    assert worker["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    }
    assert worker["ports"] == [{"name": "http", "containerPort": 8082, "protocol": "TCP"}]
    assert env_of(pod)["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env_of(pod)["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    assert env_of(pod)["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    config = WorkerConfig.model_validate(config_of(pod))
    assert config.app_id == "shop.counter"
    assert config.instance_id == "counter-2"
    assert config.kafka_config == {"security.protocol": "PLAINTEXT"}
    assert config.changelog_topics() == {"counts": "shop.counter-counts-changelog"}
    assert config.dead_letters() == "shop.counter-dead-letters"
    assert config.trigger_interval == 1.0
    assert config.metrics_port == 8082
    assert config.shutdown_timeout == 25.0


def test_every_field_of_a_full_spec_ends_up_where_it_belongs() -> None:
    source = app(FULL)
    pod = build_pod(source, 0, OWNER_UID)
    spec = pod["spec"]
    worker = container(pod)

    assert worker["imagePullPolicy"] == "Always"
    assert worker["resources"] == FULL["spec"]["resources"]
    assert spec["serviceAccountName"] == "counter-runner"
    assert spec["nodeSelector"] == {"pool": "streaming"}
    assert spec["tolerations"] == FULL["spec"]["tolerations"]
    assert spec["terminationGracePeriodSeconds"] == 60
    env = [variable["name"] for variable in worker["env"]]
    assert env[-2:] == ["SPARK_DRIVER_MEMORY", "TOKEN"]  # the user's, last
    assert env_of(pod)["TOKEN"] == FULL["spec"]["env"][1]
    assert env_of(pod)["SMOOTHSCALE_KAFKA_SASL_USERNAME"]["valueFrom"] == {
        "secretKeyRef": {"name": "kafka-user", "key": "user"}
    }
    assert env_of(pod)["SMOOTHSCALE_KAFKA_SASL_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "kafka-user", "key": "pass"}
    }
    ca_volume = next(volume for volume in spec["volumes"] if volume["name"] == "kafka-ca")
    assert ca_volume["secret"]["secretName"] == "kafka-ca"
    assert ca_volume["secret"]["items"] == [{"key": "ca.pem", "path": "ca.crt"}]
    ca_mount = next(mount for mount in worker["volumeMounts"] if mount["name"] == "kafka-ca")
    assert ca_mount["readOnly"] is True

    config = worker_config(source, "counter-0")
    assert config_of(pod) == json.loads(config.model_dump_json())
    assert config.app_id == "counter-v2"
    assert config.bootstrap_servers == "kafka-0:9093,kafka-1:9093"
    assert config.kafka_config == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.ca.location": f"{ca_mount['mountPath']}/ca.crt",
    }
    assert config.input_topics == ["clicks", "views"]
    assert config.output_topic == "totals"
    assert config.dead_letters() == "bad-clicks"
    assert config.changelog_topics() == {
        "counts": "counter-v2-counts-changelog",
        "windows": "win-log",
    }
    assert config.pipeline == "examples.pipelines.running_count:pipeline"
    assert config.trigger_interval == 5.0
    assert 0 < config.shutdown_timeout <= 60 - 5


def test_kafka_credentials_never_appear_as_plain_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # Even an operator that has the credentials in its own environment does not copy them.
    monkeypatch.setenv("SMOOTHSCALE_KAFKA_SASL_USERNAME", USERNAME)
    monkeypatch.setenv("SMOOTHSCALE_KAFKA_SASL_PASSWORD", PASSWORD)
    pod = build_pod(app(FULL), 0, OWNER_UID)

    text = json.dumps(pod)
    assert USERNAME not in text
    assert PASSWORD not in text
    assert "sasl.password" not in config_of(pod)["kafka_config"]
    for variable in container(pod)["env"]:
        if variable["name"].startswith("SMOOTHSCALE_KAFKA_SASL_"):
            assert "value" not in variable


def test_the_user_cannot_override_what_the_operator_sets() -> None:
    source = json.loads(json.dumps(MINIMAL))
    source["spec"]["env"] = [{"name": "POD_NAME", "value": "someone-else"}]
    with pytest.raises(PodSpecError, match=r"spec.env sets POD_NAME.*remove it"):
        build_pod(app(source), 0, OWNER_UID)


@pytest.mark.parametrize("source", [MINIMAL, FULL], ids=["minimal", "full"])
def test_the_pod_runs_under_restricted_pod_security(source: dict[str, Any]) -> None:
    pod = build_pod(app(source), 0, OWNER_UID)
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == security["runAsGroup"] == security["fsGroup"] == 10001
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["automountServiceAccountToken"] is False
    worker = container(pod)
    assert worker["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
        assert forbidden not in pod["spec"]
    # Everything of the pod's volumes is one of the kinds the restricted profile allows.
    assert all({"emptyDir", "secret"} & volume.keys() for volume in pod["spec"]["volumes"])


def test_the_uid_is_the_images_user() -> None:
    dockerfile = (REPOSITORY / "Dockerfile").read_text()
    pod = build_pod(app(MINIMAL), 0, OWNER_UID)
    assert f"USER {pod['spec']['securityContext']['runAsUser']}:" in dockerfile


def test_the_working_directory_home_state_and_tmp_are_writable_volumes() -> None:
    pod = build_pod(app(MINIMAL), 0, OWNER_UID)
    worker = container(pod)
    dockerfile = (REPOSITORY / "Dockerfile").read_text()
    assert f"WORKDIR {worker['workingDir']}" in dockerfile
    assert f"ENV HOME={worker['workingDir']}" in dockerfile
    empty_dirs = {volume["name"] for volume in pod["spec"]["volumes"] if "emptyDir" in volume}
    mounted = {mount["mountPath"]: mount["name"] for mount in worker["volumeMounts"]}
    state_dir = Path(worker["workingDir"]) / config_of(pod)["state_dir"]
    for path in (worker["workingDir"], str(state_dir), "/tmp"):
        assert mounted[path] in empty_dirs


# --- Resources: bounded by default ------------------------------------------------------------


def with_spec(**spec: Any) -> dict[str, Any]:
    source = json.loads(json.dumps(MINIMAL))
    source["spec"].update(spec)
    assert isinstance(source, dict)
    return source


def test_an_instance_is_bounded_by_default_and_its_memory_never_overcommitted() -> None:
    pod = build_pod(app(MINIMAL), 0, OWNER_UID)
    resources = container(pod)["resources"]

    for resource in ("cpu", "memory"):
        assert parse_quantity(resources["requests"][resource]) > 0
        assert parse_quantity(resources["limits"][resource]) >= parse_quantity(
            resources["requests"][resource]
        )
    # At its memory request it is among the last pods a node under memory pressure evicts.
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert parse_quantity(resources["limits"]["memory"]) >= parse_quantity(MIN_MEMORY_LIMIT)
    # The driver's heap fits well inside (Spark's "512m" is MiB).
    assert parse_quantity(DRIVER_MEMORY.replace("m", "Mi")) * 3 <= parse_quantity(MIN_MEMORY_LIMIT)


def test_every_volume_the_instance_writes_to_has_a_size_limit_and_the_state_one_the_specs() -> None:
    default = build_pod(app(MINIMAL), 0, OWNER_UID)
    sized = build_pod(app(with_spec(stateVolume={"sizeLimit": "50Gi"})), 0, OWNER_UID)

    def size_limits(pod: dict[str, Any]) -> dict[str, Any]:
        return {
            volume["name"]: volume["emptyDir"].get("sizeLimit")
            for volume in pod["spec"]["volumes"]
            if "emptyDir" in volume
        }

    assert set(size_limits(default)) == {"home", "state", "tmp"}
    assert all(size_limits(default).values())
    assert size_limits(default)["state"] == "10Gi"
    assert size_limits(sized)["state"] == "50Gi"
    assert size_limits(sized)["tmp"] == size_limits(default)["tmp"]


def test_the_spec_replaces_the_default_requests_and_limits_and_may_drop_the_limits() -> None:
    given = {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    unlimited = {"limits": {}}

    assert container(build_pod(app(with_spec(resources=given)), 0, OWNER_UID))["resources"] == (
        given
    )
    dropped = container(build_pod(app(with_spec(resources=unlimited)), 0, OWNER_UID))
    assert dropped["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {}}


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            {"requests": {"cpu": "4"}},
            r"spec.resources.requests.cpu \(4\) is above spec.resources.limits.cpu \(2\).*"
            "raise the limit",
        ),
        (
            {"limits": {"memory": "1Gi"}},
            r"spec.resources.limits.memory \(1Gi\) is too small.*at least 1536Mi",
        ),
    ],
    ids=["request-above-limit", "memory-below-the-driver"],
)
def test_resources_no_instance_can_run_in_are_refused_saying_what_to_change(
    resources: dict[str, Any], message: str
) -> None:
    with pytest.raises(PodSpecError, match=message):
        build_pod(app(with_spec(resources=resources)), 0, OWNER_UID)


def test_probes_ask_the_workers_endpoints_and_give_spark_time_to_start() -> None:
    pod = build_pod(app(MINIMAL), 0, OWNER_UID)
    worker = container(pod)
    assert worker["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3 * 35


def test_instances_of_one_app_listen_on_ports_of_their_own() -> None:
    ports = {
        container(build_pod(app(MINIMAL), ordinal, OWNER_UID))["ports"][0]["containerPort"]
        for ordinal in range(5)
    }
    assert ports == {8080, 8081, 8082, 8083, 8084}
    with pytest.raises(PodSpecError, match="ordinals stop at 57455"):
        build_pod(app(MINIMAL), 57456, OWNER_UID)


def test_the_operator_can_move_every_instance_port_to_another_base() -> None:
    """Two local stacks on one machine share its network: --instance-port keeps them apart."""
    pod = build_pod(app(MINIMAL), 3, OWNER_UID, base_port=20_000)
    (port,) = container(pod)["ports"]
    assert port["containerPort"] == 20_003
    assert container(pod)["readinessProbe"]["httpGet"]["port"] == port["name"]
    config = json.loads(next(e["value"] for e in container(pod)["env"] if e["name"] == CONFIG_ENV))
    assert config["metrics_port"] == 20_003


def test_the_template_hash_follows_what_shapes_the_pod_and_nothing_else() -> None:
    def template_hash(source: dict[str, Any], ordinal: int = 0) -> str:
        annotations = build_pod(app(source), ordinal, OWNER_UID)["metadata"]["annotations"]
        value = annotations[TEMPLATE_HASH_ANNOTATION]
        assert isinstance(value, str)
        return value

    scaled = json.loads(json.dumps(MINIMAL))
    scaled["spec"]["replicas"] = 7
    scaled["spec"]["scaling"] = {"maxWarmupReplicas": 5}
    new_image = json.loads(json.dumps(MINIMAL))
    new_image["spec"]["image"] = "registry.example/counter:1.1"

    assert template_hash(MINIMAL) == template_hash(MINIMAL, ordinal=3)
    assert template_hash(MINIMAL) == template_hash(scaled)
    assert template_hash(MINIMAL) != template_hash(new_image)
    assert template_hash(MINIMAL) != template_hash(FULL)


def test_the_example_app_builds_a_valid_pod() -> None:
    example = yaml.safe_load((REPOSITORY / "examples" / "streamingapp.yaml").read_text())
    pod = build_pod(app(example), 0, OWNER_UID)
    kubernetes_validate.validate(pod, latest_version(), strict=True)
    assert env_of(pod)["SPARK_DRIVER_MEMORY"] == {"name": "SPARK_DRIVER_MEMORY", "value": "1g"}


@pytest.mark.parametrize(
    ("spread", "when"),
    [(None, "ScheduleAnyway"), ("Preferred", "ScheduleAnyway"), ("Required", "DoNotSchedule")],
)
def test_instance_pods_spread_over_nodes(spread: str | None, when: str) -> None:
    source = json.loads(json.dumps(FULL))
    if spread is not None:
        source["spec"]["nodeSpread"] = spread
    [constraint] = build_pod(app(source), 0, "uid-1")["spec"]["topologySpreadConstraints"]

    assert constraint == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": when,
        "labelSelector": {
            "matchLabels": {
                "smoothscale.io/app": "counter",
                "app.kubernetes.io/managed-by": "smoothscale",
            }
        },
    }


def test_a_spread_can_be_left_out() -> None:
    source = json.loads(json.dumps(FULL))
    source["spec"]["nodeSpread"] = "None"

    assert "topologySpreadConstraints" not in build_pod(app(source), 0, "uid-1")["spec"]


def test_the_disruption_budget_lets_no_instance_pod_be_evicted() -> None:
    """As many pods available as the app has, surge pod included: `maxUnavailable: 0` would
    count from the app's replicas and let one eviction through while a surge pod is up."""
    budget = disruption_budget(app(FULL), "uid-1", pods=3)

    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["minAvailable"] == 3
    assert "maxUnavailable" not in budget["spec"]
    selector = budget["spec"]["selector"]["matchLabels"]
    pod = build_pod(app(FULL), 2, "uid-1")
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert budget["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
