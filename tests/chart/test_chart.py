"""The Helm chart, rendered by the real helm binary and checked against Kubernetes' schemas.

What the operator may do with the API is a contract (docs/install.md): the RBAC tests state it
as the exact set of (API group, resource, verbs) and fail on anything more or less.
"""

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from smoothscale import __version__
from smoothscale.cli import build_parser
from smoothscale.operator.cli import access_policy
from smoothscale.operator.policy import AccessPolicy
from tests.chart.helm import (
    CHART,
    NAMESPACE,
    ROOT,
    Manifest,
    of_kind,
    one,
    render,
    render_error,
    run_helm,
)

# What the operator does with the Kubernetes API, and so all that RBAC may grant it.
OPERATOR_PERMISSIONS: dict[tuple[str, str], set[str]] = {
    ("smoothscale.io", "streamingapps"): {"get", "list", "watch", "patch"},
    ("smoothscale.io", "streamingapps/status"): {"patch"},
    ("", "pods"): {"list", "watch", "create", "delete", "patch"},
    ("", "events"): {"create"},
    # Only list, with a label selector: RBAC cannot limit reads by label, so the operator never
    # gets a Secret by name (smoothscale.operator.observe.observe_secrets).
    ("", "secrets"): {"list"},
    # Each app's PodDisruptionBudget, created once: evictions wait while state moves.
    ("policy", "poddisruptionbudgets"): {"create", "patch"},
}
# Cluster-scoped, read-only, in a ClusterRole of its own in every mode: which nodes are drained.
NODE_PERMISSIONS = {("", "nodes"): {"list"}}
# kopf peering: keep-alives in a KopfPeering (namespaced) or ClusterKopfPeering (cluster-wide).
PEERING_VERBS = {"list", "watch", "patch"}

NAMESPACED: dict[str, Any] = {}
MULTI_NAMESPACE: dict[str, Any] = {"watch": {"namespaces": ["team-a", "team-b", "team-c"]}}
CLUSTER_WIDE: dict[str, Any] = {"watch": {"allNamespaces": True}}
MODES = pytest.mark.parametrize(
    "values",
    [NAMESPACED, MULTI_NAMESPACE, CLUSTER_WIDE],
    ids=["namespaced", "multi-namespace", "cluster-wide"],
)
RBAC_KINDS = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def with_peering(values: dict[str, Any], **peering: Any) -> dict[str, Any]:
    return {**values, "peering": {"enabled": True, **peering}}


def permissions(role: Manifest) -> dict[tuple[str, str], set[str]]:
    """(API group, resource) -> verbs granted by a Role or ClusterRole."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def node_roles(manifests: list[Manifest]) -> list[Manifest]:
    """The ClusterRole that lets the operator list nodes (rbac.readNodes)."""
    return [r for r in of_kind(manifests, "ClusterRole") if permissions(r) == NODE_PERMISSIONS]


def app_roles(manifests: list[Manifest]) -> list[Manifest]:
    """The Roles and ClusterRoles that grant what the operator does with the apps."""
    nodes = {r["metadata"]["name"] for r in node_roles(manifests)}
    return [
        r
        for r in of_kind(manifests, "Role") + of_kind(manifests, "ClusterRole")
        if r["kind"] == "Role" or r["metadata"]["name"] not in nodes
    ]


def operator_container(manifests: list[Manifest]) -> Manifest:
    containers = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: Manifest = containers[0]
    return container


def served_namespaces(args: list[str]) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--namespace"]


def crd_file() -> Manifest:
    path = CHART / "crds" / "streamingapp.yaml"
    assert path.exists(), f"{path} is missing: generate it with `.venv/bin/smoothscale crd`"
    crd: Manifest = yaml.safe_load(path.read_text())
    return crd


# --- Watch modes ---------------------------------------------------------------------------


def test_default_install_serves_only_the_release_namespace_without_cluster_permissions() -> None:
    manifests = render()
    args = operator_container(manifests)["args"]

    assert args[0] == "operator"
    assert served_namespaces(args) == [NAMESPACE]
    assert "--all-namespaces" not in args
    assert [(r["kind"], r["metadata"]["namespace"]) for r in of_kind(manifests, "Role")] == [
        ("Role", NAMESPACE)
    ]
    # Nothing cluster-wide but listing nodes.
    assert of_kind(manifests, "ClusterRole") == node_roles(manifests) != []
    assert len(of_kind(manifests, "ClusterRoleBinding")) == 1


def test_each_watched_namespace_gets_its_own_role_and_binding() -> None:
    manifests = render(MULTI_NAMESPACE)
    watched = MULTI_NAMESPACE["watch"]["namespaces"]

    assert served_namespaces(operator_container(manifests)["args"]) == watched
    for kind in ("Role", "RoleBinding"):
        assert sorted(m["metadata"]["namespace"] for m in of_kind(manifests, kind)) == watched
    # The operator itself still runs in the release namespace.
    assert one(manifests, "Deployment")["metadata"]["namespace"] == NAMESPACE
    assert of_kind(manifests, "ClusterRole") == node_roles(manifests)


def test_cluster_wide_mode_uses_one_cluster_role_and_no_roles() -> None:
    manifests = render(CLUSTER_WIDE)
    args = operator_container(manifests)["args"]

    assert "--all-namespaces" in args
    assert served_namespaces(args) == []
    assert len(app_roles(manifests)) == 1
    assert len(node_roles(manifests)) == 1
    assert len(of_kind(manifests, "ClusterRoleBinding")) == 2
    assert of_kind(manifests, "Role") == []
    assert of_kind(manifests, "RoleBinding") == []


def test_listing_nodes_can_be_left_out() -> None:
    manifests = render({"rbac": {"create": True, "readNodes": False}})

    assert node_roles(manifests) == []
    assert of_kind(manifests, "ClusterRole") == []


def test_rbac_can_be_left_to_the_user() -> None:
    manifests = render({"rbac": {"create": False}})

    assert [m for m in manifests if m["kind"] in RBAC_KINDS] == []


# --- Least privilege -----------------------------------------------------------------------


@MODES
def test_rbac_grants_exactly_what_the_operator_uses(values: dict[str, Any]) -> None:
    manifests = render(values)
    roles = app_roles(manifests)

    assert roles
    for role in roles:
        assert permissions(role) == OPERATOR_PERMISSIONS
    assert [permissions(role) for role in node_roles(manifests)] == [NODE_PERMISSIONS]


@pytest.mark.parametrize(
    ("values", "peering_resource"),
    [
        (NAMESPACED, "kopfpeerings"),
        (MULTI_NAMESPACE, "kopfpeerings"),
        (CLUSTER_WIDE, "clusterkopfpeerings"),
    ],
    ids=["namespaced", "multi-namespace", "cluster-wide"],
)
def test_peering_adds_kopf_peering_permissions_in_the_matching_scope(
    values: dict[str, Any], peering_resource: str
) -> None:
    manifests = render(with_peering(values))
    roles = app_roles(manifests)

    assert roles
    for role in roles:
        assert permissions(role) == {
            **OPERATOR_PERMISSIONS,
            ("kopf.dev", peering_resource): PEERING_VERBS,
        }


@pytest.mark.parametrize(
    "values",
    [
        NAMESPACED,
        MULTI_NAMESPACE,
        CLUSTER_WIDE,
        with_peering(NAMESPACED),
        with_peering(CLUSTER_WIDE),
    ],
    ids=["namespaced", "multi-namespace", "cluster-wide", "peering", "peering-cluster-wide"],
)
def test_rbac_has_no_wildcards(values: dict[str, Any]) -> None:
    manifests = render(values)
    for role in of_kind(manifests, "Role") + of_kind(manifests, "ClusterRole"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in item for item in rule[field]), rule


@MODES
def test_bindings_give_the_roles_to_the_operator_service_account(values: dict[str, Any]) -> None:
    manifests = render(values)
    account = one(manifests, "ServiceAccount")["metadata"]
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    roles = {
        (r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"])
        for r in of_kind(manifests, "Role") + of_kind(manifests, "ClusterRole")
    }
    bindings = of_kind(manifests, "RoleBinding") + of_kind(manifests, "ClusterRoleBinding")

    assert pod["serviceAccountName"] == account["name"]
    assert account["namespace"] == NAMESPACE
    assert len(bindings) == len(roles)
    for binding in bindings:
        ref = binding["roleRef"]
        assert (ref["kind"], binding["metadata"].get("namespace"), ref["name"]) in roles
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
        ]


def test_an_existing_service_account_gets_the_roles() -> None:
    manifests = render({"serviceAccount": {"create": False, "name": "platform-operator"}})

    assert of_kind(manifests, "ServiceAccount") == []
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-operator"
    assert one(manifests, "RoleBinding")["subjects"][0]["name"] == "platform-operator"


def test_rbac_names_the_group_and_resources_the_crd_defines() -> None:
    crd = crd_file()
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    stored = [v for v in crd["spec"]["versions"] if v["storage"]]

    granted = permissions(one(render(), "Role"))

    assert (group, plural) in granted
    assert len(stored) == 1
    assert "status" in stored[0]["subresources"]
    assert (group, f"{plural}/status") in granted


# --- The operator Deployment ---------------------------------------------------------------


@MODES
def test_operator_runs_locked_down(values: dict[str, Any]) -> None:
    manifests = render(values)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(manifests)
    security = container["securityContext"]

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]


def test_the_operator_is_bounded_in_cpu_and_memory_and_the_values_say_how_much() -> None:
    default = operator_container(render())["resources"]
    given = {
        "requests": {"cpu": "250m", "memory": "384Mi"},
        "limits": {"cpu": "2", "memory": "1Gi"},
    }

    assert set(default["requests"]) == set(default["limits"]) == {"cpu", "memory"}
    assert operator_container(render({"resources": given}))["resources"] == given


def operator_policy(container: Manifest) -> AccessPolicy:
    """The policy the operator runs with: its command line, parsed as `smoothscale` parses it."""
    return access_policy(build_parser().parse_args(container["args"]))


def test_a_fresh_install_sends_credentials_nowhere_and_reads_only_labelled_secrets() -> None:
    policy = operator_policy(operator_container(render()))

    assert policy == AccessPolicy()
    assert policy.bootstrap_servers == ()
    assert policy.allow_sasl_plaintext is False
    assert policy.ca_secrets == ()
    assert policy.secret_selector == "smoothscale.io/streamingapps=allowed"


def test_the_platforms_allow_lists_reach_the_operator() -> None:
    values = {
        "secrets": {"label": {"key": "platform.example/kafka", "value": "yes"}},
        "kafka": {
            "allowedBootstrapServers": ["kafka-*.kafka.svc:9093", "kafka.other.example:9094"],
            "allowSaslPlaintext": True,
            "allowedCaSecrets": ["kafka-cluster-ca"],
        },
    }

    assert operator_policy(operator_container(render(values))) == AccessPolicy(
        secret_label=("platform.example/kafka", "yes"),
        bootstrap_servers=("kafka-*.kafka.svc:9093", "kafka.other.example:9094"),
        allow_sasl_plaintext=True,
        ca_secrets=("kafka-cluster-ca",),
    )


def test_the_only_writable_path_is_an_empty_dir_at_tmp() -> None:
    manifests = render()
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    mounts = operator_container(manifests)["volumeMounts"]

    assert [(m["name"], m["mountPath"]) for m in mounts] == [("tmp", "/tmp")]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    assert "emptyDir" in pod["volumes"][0]


def test_probes_ask_the_liveness_endpoint_the_operator_is_told_to_serve() -> None:
    container = operator_container(render())
    args = container["args"]
    liveness_url = args[args.index("--liveness") + 1]
    match = re.fullmatch(r"http://0\.0\.0\.0:(\d+)(/\S*)", liveness_url)
    assert match, liveness_url
    port, path = int(match.group(1)), match.group(2)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        http_get = container[probe]["httpGet"]
        assert http_get["path"] == path, probe
        assert ports[http_get["port"]] == port, probe


def test_operator_runs_standalone_as_one_pod_that_never_overlaps_its_successor() -> None:
    manifests = render()
    deployment = one(manifests, "Deployment")
    args = operator_container(manifests)["args"]

    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--standalone" in args
    assert "--peering" not in args


def test_peering_lets_spare_replicas_wait_behind_the_active_one() -> None:
    manifests = render(with_peering({"replicas": 2}, name="smoothscale", priority=100))
    deployment = one(manifests, "Deployment")
    args = operator_container(manifests)["args"]

    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--standalone" not in args
    assert args[args.index("--peering") + 1] == "smoothscale"
    assert args[args.index("--priority") + 1] == "100"


def test_without_a_priority_the_operator_chooses_one() -> None:
    args = operator_container(render(with_peering({})))["args"]

    assert "--priority" not in args


def test_the_operator_runs_the_image_entrypoint_explicitly_so_a_process_kubelet_can_too() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    container = operator_container(render())

    assert 'ENTRYPOINT ["smoothscale"]' in dockerfile
    assert container["command"] == ["smoothscale"]
    assert container["args"][0] == "operator"


def test_ports_reach_the_operator_its_probes_and_its_instances() -> None:
    values = {"ports": {"healthz": 18080, "metrics": 19090}, "instancePort": 18100}
    container = operator_container(render(values))
    args = container["args"]

    assert args[args.index("--liveness") + 1] == "http://0.0.0.0:18080/healthz"
    assert args[args.index("--metrics-port") + 1] == "19090"
    assert args[args.index("--instance-port") + 1] == "18100"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "healthz": 18080,
        "metrics": 19090,
    }


def test_log_level_reaches_the_operator() -> None:
    args = operator_container(render({"logLevel": "debug"}))["args"]

    assert args[args.index("--log-level") + 1] == "debug"


def test_image_tag_defaults_to_the_app_version_which_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    container = operator_container(render())
    pinned = operator_container(
        render({"image": {"repository": "registry.example/ss", "tag": "x"}})
    )

    assert chart["appVersion"] == __version__
    assert container["image"] == f"ghcr.io/smoothscale/smoothscale:{__version__}"
    assert pinned["image"] == "registry.example/ss:x"


def test_scheduling_values_reach_the_pod() -> None:
    scheduling = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
                    ]
                }
            }
        },
    }
    pod = one(render(scheduling), "Deployment")["spec"]["template"]["spec"]

    for key, value in scheduling.items():
        assert pod[key] == value


# --- Metrics -------------------------------------------------------------------------------


def test_metrics_service_selects_the_operator_pods_on_the_metrics_port() -> None:
    manifests = render()
    service = one(manifests, "Service")
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in operator_container(manifests)["ports"]}

    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert ports["metrics"] == 9090
    assert of_kind(manifests, "ServiceMonitor") == []


def test_metrics_can_be_turned_off() -> None:
    assert of_kind(render({"metrics": {"enabled": False}}), "Service") == []


def test_service_monitor_scrapes_the_metrics_service() -> None:
    manifests = render(
        {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    )
    service = one(manifests, "Service")
    monitor = one(manifests, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoints = monitor["spec"]["endpoints"]

    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [(e["port"], e["path"]) for e in endpoints] == [("metrics", "/metrics")]


# --- Values that helm must refuse -----------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"watch": {"allNamespace": True}}, "'allNamespace' not allowed"),
        ({"replica": 1}, "'replica' not allowed"),
        ({"securityContext": {"readOnlyRootFileSystem": True}}, "'readOnlyRootFileSystem'"),
        ({"metrics": {"serviceMonitor": {"enable": True}}}, "'enable' not allowed"),
        ({"replicas": "two"}, "/replicas"),
        ({"logLevel": "verbose"}, "/logLevel"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"watch": {"namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"kafka": {"allowedBootstrapServers": ["kafka.svc"]}}, "/kafka/allowedBootstrapServers/0"),
        ({"secrets": {"label": {"key": "smoothscale.io/ok", "value": ""}}}, "/secrets/label/value"),
    ],
    ids=[
        "typo",
        "top-level-typo",
        "nested-typo",
        "deep-typo",
        "type",
        "enum",
        "pull-policy",
        "namespace-name",
        "quantity",
        "server-without-port",
        "empty-label-value",
    ],
)
def test_values_schema_rejects_mistakes(values: dict[str, Any], message: str) -> None:
    error = render_error(values)

    assert "schema" in error
    assert message in error


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"watch": {"allNamespaces": True, "namespaces": ["team-a"]}},
            "watch.namespaces lists [team-a] but watch.allNamespaces is true",
        ),
        ({"replicas": 2}, "replicas is 2 but peering.enabled is false"),
        (
            {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
            "metrics.serviceMonitor.enabled is true but metrics.enabled is false",
        ),
        ({"serviceAccount": {"create": False}}, "serviceAccount.name: name the existing"),
    ],
    ids=[
        "both-watch-modes",
        "replicas-without-peering",
        "monitor-without-service",
        "no-service-account",
    ],
)
def test_contradicting_values_fail_with_what_to_do(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_values_schema_declares_every_default_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def undeclared(value: Any, node: dict[str, Any], path: str) -> list[str]:
        if not isinstance(value, dict) or node.get("additionalProperties") is not False:
            return []
        missing = []
        for key, child in value.items():
            if key not in node["properties"]:
                missing.append(f"{path}.{key}")
            else:
                missing += undeclared(child, node["properties"][key], f"{path}.{key}")
        return missing

    assert schema["additionalProperties"] is False
    assert undeclared(defaults, schema, "") == []


@pytest.mark.parametrize(
    ("values_key", "kubernetes_definition"),
    [("podSecurityContext", "podsecuritycontext"), ("securityContext", "securitycontext")],
)
def test_security_context_schema_only_allows_kubernetes_fields(
    values_key: str, kubernetes_definition: str
) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    declared = set(schema["properties"][values_key]["properties"])
    kubernetes_schema = Path(kubernetes_validate.__file__).parent.joinpath(
        "kubernetes-json-schema",
        f"v{latest_version()}-local-strict",
        f"{kubernetes_definition}-v1.json",
    )
    known = set(json.loads(kubernetes_schema.read_text())["properties"])

    assert declared <= known
    assert {"runAsNonRoot", "runAsUser", "seccompProfile"} <= declared


# --- Valid Kubernetes, lint, CRD, NOTES -----------------------------------------------------


def minimum_kubernetes_version() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    match = re.fullmatch(r">=(\d+\.\d+)\.\d+-0", chart["kubeVersion"])
    assert match, chart["kubeVersion"]
    return match.group(1)


@pytest.mark.parametrize(
    "values",
    [
        NAMESPACED,
        MULTI_NAMESPACE,
        CLUSTER_WIDE,
        with_peering(CLUSTER_WIDE, priority=5),
        with_peering({**MULTI_NAMESPACE, "replicas": 3}),
    ],
    ids=[
        "namespaced",
        "multi-namespace",
        "cluster-wide",
        "peering-cluster-wide",
        "peering-replicas",
    ],
)
@pytest.mark.parametrize("kubernetes_version", [minimum_kubernetes_version(), latest_version()])
def test_every_rendered_object_is_valid_kubernetes(
    values: dict[str, Any], kubernetes_version: str
) -> None:
    manifests = render(values, include_crds=True)

    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= {
        m["kind"] for m in manifests
    }
    for manifest in manifests:
        kubernetes_validate.validate(manifest, kubernetes_version, strict=True)


def test_invalid_objects_fail_validation() -> None:
    # The validation above can fail: an unknown container field is refused.
    deployment = one(render(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFS"] = True

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, latest_version(), strict=True)


@pytest.mark.parametrize(
    "values",
    [NAMESPACED, MULTI_NAMESPACE, CLUSTER_WIDE, with_peering(CLUSTER_WIDE)],
    ids=["namespaced", "multi-namespace", "cluster-wide", "peering"],
)
def test_helm_lint_strict_passes(values: dict[str, Any]) -> None:
    result = run_helm("lint", "--strict", str(CHART), values=values)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_crd_ships_in_the_chart_crds_directory() -> None:
    chart_copy = CHART / "crds" / "streamingapp.yaml"
    crds = of_kind(render(include_crds=True), "CustomResourceDefinition")

    # Helm installs crds/ before the templates and never deletes it on uninstall.
    assert of_kind(render(), "CustomResourceDefinition") == []
    assert crds == [crd_file()]
    assert chart_copy.read_text() == (ROOT / "crds" / "streamingapp.yaml").read_text()


def test_notes_tell_what_the_release_serves() -> None:
    def notes(values: dict[str, Any]) -> str:
        result = run_helm(
            "install",
            "rel",
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--dry-run=client",
            values=values,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split("NOTES:", 1)[1]

    namespaced = notes(MULTI_NAMESPACE)
    cluster_wide = notes(with_peering(CLUSTER_WIDE))

    assert "serves StreamingApps in: team-a, team-b, team-c" in namespaced
    assert "Peering is on" not in namespaced
    assert "every namespace" in cluster_wide
    assert "ClusterKopfPeering" in cluster_wide
    assert "automountServiceAccountToken: false" in namespaced


def test_install_guide_documents_every_value() -> None:
    guide = (ROOT / "docs" / "install.md").read_text()
    documented = set(re.findall(r"^\| `([\w.]+)` \|", guide, flags=re.MULTILINE))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def undocumented(value: Any, path: str) -> list[str]:
        if path in documented:
            return []
        if isinstance(value, dict) and value:
            return [p for key, child in value.items() for p in undocumented(child, f"{path}.{key}")]
        return [path]

    assert [p for key, value in defaults.items() for p in undocumented(value, key)] == []
    assert "watch.allNamespaces" in documented
