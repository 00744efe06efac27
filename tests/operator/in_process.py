"""The operator's control loop in this process, as the chart installs it: with the chart's
ServiceAccount token and RBAC, against the local API server and its audit log.

What the operator asked of the API server is in the audit log, so what it did not read is
shown, not assumed. No kubelet and no Spark: the pods it creates are objects nothing runs. The
`platform` fixture (conftest.py) gives a `Platform` per test.
"""

import base64
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes.client import ApiClient, Configuration

from devstack.apiserver import LocalApiServer, write_kubeconfig
from devstack.apiserver.auth import AuditedRequest, read_audit_log
from smoothscale.api.models import API_VERSION, PLURAL
from smoothscale.kubeapi import MERGE_PATCH, KubeApi
from smoothscale.operator.metrics import OperatorMetrics
from smoothscale.operator.policy import AccessPolicy
from smoothscale.operator.reconcile import AppController
from tests.chart.helm import NAMESPACE as OPERATOR_NAMESPACE
from tests.chart.helm import Manifest, of_kind, one

ROOT = Path(__file__).resolve().parents[2]
APPS = "shop"
"""The namespace the operator serves."""
LABEL = "smoothscale.io/streamingapps=allowed"


def streaming_app(
    bootstrap: str, security: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """A StreamingApp with a name of its own, reading `<name>-in` and writing `<name>-out`."""
    name = f"app-{uuid.uuid4().hex[:6]}"
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamingApp",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {
            "image": "registry.example/counter:1.0",
            "pipeline": {"ref": "examples.pipelines.running_count:pipeline"},
            "kafka": {
                "bootstrapServers": bootstrap,
                "security": security or {},
                "inputTopics": [f"{name}-in"],
                "outputTopic": f"{name}-out",
                "stateStores": [{"name": "counts"}],
            },
            **spec,
        },
    }


def create_topics(bootstrap_servers: str, source: dict[str, Any], partitions: int = 2) -> None:
    """The app's input and output topics, which are the user's to create."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    kafka = source["spec"]["kafka"]
    for topic in (*kafka["inputTopics"], kafka["outputTopic"]):
        admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)


@dataclass
class Platform:
    """The API server with the operator's ServiceAccount as the chart installs it (serving
    APPS), an admin client, and the Events the control loops posted."""

    audit_log: Path
    admin: KubeApi
    operator: KubeApi
    service_account: str
    events: list[tuple[str, str, str]] = field(default_factory=list)
    controllers: list[AppController] = field(default_factory=list)

    def apply(self, source: dict[str, Any]) -> None:
        self.admin.request("POST", f"/apis/{API_VERSION}/namespaces/{APPS}/{PLURAL}", body=source)

    def secret(self, name: str, data: dict[str, str], *, labelled: bool) -> None:
        key, value = LABEL.split("=")
        metadata: dict[str, Any] = {"name": name, "labels": {key: value} if labelled else {}}
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "data": encoded}
        self.admin.request("POST", f"/api/v1/namespaces/{APPS}/secrets", body=body)

    def controller(
        self, source: dict[str, Any], policy: AccessPolicy | None = None
    ) -> AppController:
        """The app's control loop, as the operator's kopf daemon runs it."""
        controller = AppController(
            self.operator,
            APPS,
            name=source["metadata"]["name"],
            events=lambda *event: self.events.append(event),
            metrics=OperatorMetrics(),
            policy=policy or AccessPolicy(),
        )
        self.controllers.append(controller)
        return controller

    def degraded(self, source: dict[str, Any]) -> dict[str, Any]:
        """The app's Degraded condition, which must be True."""
        name = source["metadata"]["name"]
        app = self.admin.request("GET", f"/apis/{API_VERSION}/namespaces/{APPS}/{PLURAL}/{name}")
        conditions = app["status"]["conditions"]
        found: dict[str, Any] = next(c for c in conditions if c["type"] == "Degraded")
        assert found["status"] == "True", found
        return found

    def pods(self) -> list[dict[str, Any]]:
        listing = self.admin.request("GET", f"/api/v1/namespaces/{APPS}/pods")
        items: list[dict[str, Any]] = listing["items"]
        return items

    def set_pod_status(self, name: str, status: dict[str, Any]) -> None:
        """What a kubelet reports, e.g. that it evicted the pod."""
        self.admin.request(
            "PATCH",
            f"/api/v1/namespaces/{APPS}/pods/{name}/status",
            body={"status": status},
            content_type=MERGE_PATCH,
        )

    def secret_requests(self) -> list[AuditedRequest]:
        """Every request of the operator's ServiceAccount on Secrets, allowed or not."""
        return [
            request
            for request in read_audit_log(self.audit_log)
            if request.user == self.service_account and request.attributes.resource == "secrets"
        ]


def _kube_with_token(url: str, token: str) -> KubeApi:
    configuration = Configuration(host=url)
    configuration.api_key = {"BearerToken": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return KubeApi(ApiClient(configuration))


@contextmanager
def installed(chart: list[Manifest], workdir: Path) -> Iterator[Platform]:
    """A fresh API server with the chart's ServiceAccount, Role and RoleBinding applied."""
    audit_log = workdir / "audit.log"
    with LocalApiServer(crd_paths=[ROOT / "crds"], audit_log=audit_log) as server:
        write_kubeconfig(workdir / "kubeconfig", server.url)
        admin = KubeApi.from_kubeconfig(workdir / "kubeconfig")
        for namespace in (OPERATOR_NAMESPACE, APPS):
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            admin.request("POST", "/api/v1/namespaces", body=body)
        account = one(chart, "ServiceAccount")
        admin.request(
            "POST", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/serviceaccounts", body=account
        )
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        for kind, plural in (("Role", "roles"), ("RoleBinding", "rolebindings")):
            for manifest in of_kind(chart, kind):
                admin.request("POST", f"{rbac}/namespaces/{APPS}/{plural}", body=manifest)
        for kind, plural in (
            ("ClusterRole", "clusterroles"),
            ("ClusterRoleBinding", "clusterrolebindings"),
        ):
            for manifest in of_kind(chart, kind):
                admin.request("POST", f"{rbac}/{plural}", body=manifest)
        name = account["metadata"]["name"]
        token = admin.request(
            "POST",
            f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/serviceaccounts/{name}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
        operator = _kube_with_token(server.url, token)
        platform = Platform(
            audit_log, admin, operator, f"system:serviceaccount:{OPERATOR_NAMESPACE}:{name}"
        )
        try:
            yield platform
        finally:
            for controller in platform.controllers:
                controller.close()
            operator.close()
            admin.close()
