"""The librdkafka settings for a StreamingApp's Kafka cluster, on both sides of the pod boundary.

spec.kafka.security names Secrets, never values. The operator's own clients (topic set-up,
reading reports and changelog ends) take the values from the Secrets, read through the
Kubernetes API once the app has passed the platform's policy (`smoothscale.operator.access`),
and put them into their settings (`client_config`). The instances never see a Secret's value in
their config: the pod maps the username and password into env vars with secretKeyRef, and the
CA into a mounted file (`smoothscale.operator.pods`). What both sides share, the protocol and
the mechanism, is `security_settings`.
"""

import base64
from collections.abc import Callable, Mapping

from smoothscale.api.models import KafkaSecurity, KafkaSpec

SecretLookup = Callable[[str, str], str | None]
"""(Secret name, key) -> the key's value, or None when the Secret or the key does not exist.
The Secret is in the StreamingApp's namespace."""


class MissingSecretError(ValueError):
    """A Secret or key that spec.kafka.security names does not exist; the message says which."""


def lookup_in(secrets: Mapping[str, Mapping[str, str]]) -> SecretLookup:
    """Look values up in Secrets read from the API: their data, by Secret name (base64)."""

    def value(name: str, key: str) -> str | None:
        encoded = secrets.get(name, {}).get(key)
        return None if encoded is None else base64.b64decode(encoded).decode()

    return value


def security_settings(security: KafkaSecurity) -> dict[str, str]:
    """security.protocol and, with SASL, sasl.mechanism: the settings that hold no secret."""
    settings = {"security.protocol": security.security_protocol.value}
    if security.sasl_mechanism is not None:
        settings["sasl.mechanism"] = security.sasl_mechanism.value
    return settings


def client_config(kafka: KafkaSpec, secret: SecretLookup) -> dict[str, str]:
    """The settings of an operator client of the app's cluster: bootstrap servers, security,
    the SASL username and password and the CA (as PEM) read through `secret`.

    Raises MissingSecretError naming the Secret and key when one is missing, so the operator
    can say so in the app's status instead of failing to authenticate.
    """
    security = kafka.security
    config = {"bootstrap.servers": kafka.bootstrap_servers, **security_settings(security)}
    if security.credentials is not None:
        credentials = security.credentials
        name = credentials.secret_ref.name
        config["sasl.username"] = _read(secret, name, credentials.username_key, "SASL username")
        config["sasl.password"] = _read(secret, name, credentials.password_key, "SASL password")
    if security.ca_certificate is not None:
        ca = security.ca_certificate
        config["ssl.ca.pem"] = _read(secret, ca.secret_ref.name, ca.key, "CA certificate")
    return config


def _read(secret: SecretLookup, name: str, key: str, what: str) -> str:
    value = secret(name, key)
    if value is None:
        raise MissingSecretError(
            f"the Kafka {what} is missing: spec.kafka.security names key {key!r} of Secret "
            f"{name!r}, which has no such key; add it to the Secret, or change "
            "spec.kafka.security to name the right key"
        )
    return value
