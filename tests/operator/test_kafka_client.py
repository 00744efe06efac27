"""The operator's Kafka client settings: security from the spec, credentials from Secrets."""

from typing import Any

import pytest

from smoothscale.api.models import KafkaSpec
from smoothscale.operator.kafka_client import MissingSecretError, client_config

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SECRETS = {
    ("kafka-user", "user"): "alice",
    ("kafka-user", "pass"): "s3cret",
    ("kafka-ca", "ca.crt"): CA_PEM,
}


def secret(name: str, key: str) -> str | None:
    return SECRETS.get((name, key))


def kafka(security: dict[str, Any] | None = None) -> KafkaSpec:
    return KafkaSpec.model_validate(
        {
            "bootstrapServers": "kafka-0:9093",
            "inputTopics": ["clicks"],
            "outputTopic": "totals",
            "stateStores": [{"name": "counts"}],
            **({"security": security} if security is not None else {}),
        }
    )


SASL_SSL = {
    "securityProtocol": "SASL_SSL",
    "saslMechanism": "SCRAM-SHA-256",
    "credentials": {
        "secretRef": {"name": "kafka-user"},
        "usernameKey": "user",
        "passwordKey": "pass",
    },
    "caCertificate": {"secretRef": {"name": "kafka-ca"}},
}


def test_plaintext_needs_no_secret() -> None:
    def no_secret(name: str, key: str) -> str | None:
        raise AssertionError(f"read Secret {name}/{key}")

    assert client_config(kafka(), no_secret) == {
        "bootstrap.servers": "kafka-0:9093",
        "security.protocol": "PLAINTEXT",
    }


def test_sasl_ssl_reads_username_password_and_ca_from_their_secrets() -> None:
    assert client_config(kafka(SASL_SSL), secret) == {
        "bootstrap.servers": "kafka-0:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": "s3cret",
        "ssl.ca.pem": CA_PEM,
    }


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        (("kafka-user", "pass"), "SASL password is missing.*key 'pass' of Secret 'kafka-user'"),
        (("kafka-ca", "ca.crt"), "CA certificate is missing.*key 'ca.crt' of Secret 'kafka-ca'"),
    ],
)
def test_a_missing_secret_key_is_named_with_what_to_do(
    missing: tuple[str, str], message: str
) -> None:
    def partial(name: str, key: str) -> str | None:
        return None if (name, key) == missing else secret(name, key)

    with pytest.raises(MissingSecretError, match=message) as raised:
        client_config(kafka(SASL_SSL), partial)
    assert "add it to the Secret" in str(raised.value)
