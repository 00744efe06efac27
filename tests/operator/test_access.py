"""The platform's policy: no StreamingApp makes the operator read a Secret it may not, or send
credentials where the platform did not allow them (a confused deputy).

The rules are pure (`refusals`); the rest runs the operator's control loop with the chart's
RBAC against the local API server and its audit log (in_process.py), which shows what the
operator read and what it did not.
"""

import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from devstack.kafka.front import KafkaFront
from smoothscale.api.models import StreamingApp
from smoothscale.operator.access import referenced_secrets, refusals
from smoothscale.operator.policy import AccessPolicy
from tests.operator.in_process import APPS, LABEL, Platform, create_topics
from tests.operator.in_process import streaming_app as any_app

PLATFORM_KAFKA = "kafka-0.kafka.svc:9093"

SASL_SSL = {
    "securityProtocol": "SASL_SSL",
    "saslMechanism": "SCRAM-SHA-512",
    "credentials": {"secretRef": {"name": "kafka-user"}},
}


def streaming_app(
    bootstrap: str = PLATFORM_KAFKA, security: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    return any_app(bootstrap, security, **spec)


def reasons(source: dict[str, Any], policy: AccessPolicy) -> list[str]:
    return [problem.reason for problem in refusals(StreamingApp.model_validate(source), policy)]


# --- The rules -------------------------------------------------------------------------------


def test_credentials_go_only_to_servers_the_platform_allows() -> None:
    policy = AccessPolicy(bootstrap_servers=("kafka-*.kafka.svc:9093",))
    allowed = streaming_app("kafka-0.kafka.svc:9093,KAFKA-1.kafka.svc:9093", SASL_SSL)
    one_elsewhere = streaming_app("kafka-0.kafka.svc:9093,kafka.attacker.example:9093", SASL_SSL)
    other_port = streaming_app("kafka-0.kafka.svc:9092", SASL_SSL)

    assert reasons(allowed, policy) == []
    assert reasons(one_elsewhere, policy) == ["BootstrapServersNotAllowed"]
    assert reasons(other_port, policy) == ["BootstrapServersNotAllowed"]
    [problem] = refusals(StreamingApp.model_validate(one_elsewhere), policy)
    assert "names kafka.attacker.example:9093, which this installation does not allow" in (
        problem.message
    )
    assert "kafka.allowedBootstrapServers" in problem.message


def test_with_no_server_listed_apps_connect_anywhere_but_send_credentials_nowhere() -> None:
    policy = AccessPolicy()

    assert reasons(streaming_app("anywhere.example:9092"), policy) == []
    assert reasons(streaming_app("anywhere.example:9092", SASL_SSL), policy) == [
        "BootstrapServersNotAllowed"
    ]
    [problem] = refusals(StreamingApp.model_validate(streaming_app(security=SASL_SSL)), policy)
    assert "credentials of Secret 'kafka-user'" in problem.message
    assert "allows credentials to no Kafka server" in problem.message


def test_sasl_over_plain_text_is_refused_unless_the_platform_allows_it() -> None:
    source = streaming_app(security={**SASL_SSL, "securityProtocol": "SASL_PLAINTEXT"})
    listed = AccessPolicy(bootstrap_servers=(PLATFORM_KAFKA,))

    assert reasons(source, listed) == ["SaslPlaintextNotAllowed"]
    assert (
        reasons(
            source, AccessPolicy(bootstrap_servers=(PLATFORM_KAFKA,), allow_sasl_plaintext=True)
        )
        == []
    )
    [problem] = refusals(StreamingApp.model_validate(source), listed)
    assert "Use SASL_SSL" in problem.message


def test_a_ca_of_the_apps_choosing_is_refused_unless_its_name_is_allowed() -> None:
    ca = {"securityProtocol": "SSL", "caCertificate": {"secretRef": {"name": "my-own-ca"}}}
    source = streaming_app(security=ca)

    assert reasons(source, AccessPolicy()) == ["CaCertificateNotAllowed"]
    assert reasons(source, AccessPolicy(ca_secrets=("platform-kafka-ca",))) == [
        "CaCertificateNotAllowed"
    ]
    assert reasons(source, AccessPolicy(ca_secrets=("*",))) == []
    assert reasons(streaming_app(security={"securityProtocol": "SSL"}), AccessPolicy()) == []


def test_every_secret_a_pod_or_the_operator_would_use_is_found() -> None:
    source = streaming_app(
        security={**SASL_SSL, "caCertificate": {"secretRef": {"name": "kafka-ca"}}},
        env=[
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
            {"name": "USER", "valueFrom": {"secretKeyRef": {"name": "kafka-user", "key": "u"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "api", "key": "mode"}}},
        ],
    )

    assert referenced_secrets(StreamingApp.model_validate(source)) == {
        "kafka-user": ["spec.kafka.security.credentials", "spec.env USER"],
        "kafka-ca": ["spec.kafka.security.caCertificate"],
        "api": ["spec.env TOKEN"],
    }


# --- The operator against the API server, with the chart's RBAC ---------------------------------


@pytest.fixture
def attacker() -> Iterator[socket.socket]:
    """A server someone who may create StreamingApps runs, to collect credentials."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        yield listener


def test_an_app_that_would_send_credentials_elsewhere_is_refused_before_any_secret_is_read(
    platform: Platform, attacker: socket.socket
) -> None:
    # The platform's own Kafka credentials, labelled for StreamingApps to use with its Kafka.
    platform.secret("kafka-user", {"username": "platform", "password": "s3cret"}, labelled=True)
    host, port = attacker.getsockname()
    source = streaming_app(f"{host}:{port}", SASL_SSL)
    platform.apply(source)

    platform.controller(source, AccessPolicy(bootstrap_servers=(PLATFORM_KAFKA,))).poll()

    degraded = platform.degraded(source)
    assert degraded["reason"] == "BootstrapServersNotAllowed"
    assert f"{host}:{port}" in degraded["message"]
    assert ("Warning", "BootstrapServersNotAllowed", degraded["message"]) in platform.events
    assert platform.pods() == []
    assert platform.secret_requests() == [], "no Secret was read"
    with pytest.raises(BlockingIOError):
        attacker.accept()  # and nothing connected to the attacker's server


@pytest.mark.parametrize(
    "naming",
    [
        {"security": SASL_SSL},
        {
            "security": {
                "securityProtocol": "SSL",
                "caCertificate": {"secretRef": {"name": "kafka-user"}},
            }
        },
        {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "kafka-user", "key": "p"}}}]},
    ],
    ids=["kafka-credentials", "kafka-ca", "env"],
)
def test_an_unlabelled_secret_is_refused_and_never_sent_to_the_operator(
    platform: Platform, naming: dict[str, Any]
) -> None:
    platform.secret("kafka-user", {"username": "admin", "password": "not-yours"}, labelled=False)
    source = streaming_app(**naming)
    platform.apply(source)

    policy = AccessPolicy(bootstrap_servers=(PLATFORM_KAFKA,), ca_secrets=("*",))
    platform.controller(source, policy).poll()

    degraded = platform.degraded(source)
    assert degraded["reason"] == "SecretNotAllowed"
    assert "Secret 'kafka-user'" in degraded["message"]
    assert f"kubectl label secret -n {APPS} kafka-user {LABEL}" in degraded["message"]
    assert ("Warning", "SecretNotAllowed", degraded["message"]) in platform.events
    assert platform.pods() == []
    requests = platform.secret_requests()
    assert requests, "the operator looked for the Secret"
    for request in requests:
        assert request.allowed
        assert request.attributes.verb == "list"
        query = parse_qs(urlsplit(request.attributes.path).query)
        assert query["labelSelector"] == [LABEL]
        assert query["fieldSelector"] == ["metadata.name=kafka-user"]
        # The API server filtered by the label: that very request returns nothing.
        assert platform.admin.request("GET", request.attributes.path)["items"] == []


def test_an_app_naming_only_labelled_secrets_gets_pods_that_reference_them(
    platform: Platform, kafka_front: KafkaFront
) -> None:
    platform.secret("api", {"token": "t0ken"}, labelled=True)
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}]
    source = streaming_app(kafka_front.bootstrap_servers, env=env)
    create_topics(kafka_front.bootstrap_servers, source)
    platform.apply(source)

    platform.controller(source, AccessPolicy()).poll()

    [pod] = platform.pods()
    [container] = pod["spec"]["containers"]
    assert {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}} in (
        container["env"]
    )
    assert [r.attributes.verb for r in platform.secret_requests()] == ["list"]
