"""What a StreamingApp may make the operator, and its pods, do with credentials.

Whoever may create a StreamingApp chooses its Kafka servers and the Secrets it names. The
operator reads those Secrets with its own permissions and sends the credentials in them to those
servers, and its pods map Secrets into the environment of the app's own code. Left unchecked, an
app could make the operator read a Secret its author cannot read and send it to a broker its
author runs: a confused deputy. So the platform that installs the operator gives it a policy
(`policy.AccessPolicy`: the chart's `secrets` and `kafka` values, docs/install.md "Security"),
and an app must pass it before the operator reads a Secret, connects to Kafka or creates a pod
for it:

- `refusals`: what the spec asks and the policy does not allow (its bootstrap servers, SASL over
  plain text, a CA of its own). Pure: nothing at all is read for an app refused here.
- `referenced_secrets`: every Secret the operator's clients and the app's pods would use. The
  operator asks the API server only for those that carry the policy's label
  (`observe.observe_secrets`), so a Secret without it never reaches the operator, and
  `unlabelled` says which ones the app may not use.
"""

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase

from smoothscale.api.models import SecurityProtocol, StreamingApp
from smoothscale.operator.policy import AccessPolicy
from smoothscale.operator.status import Problem


class AccessRefused(Exception):
    """The app asks for something the platform's policy does not allow; nothing was done."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(problem.message for problem in problems))
        self.problems = tuple(problems)


def refusals(app: StreamingApp, policy: AccessPolicy) -> list[Problem]:
    """What the app's spec asks that the policy does not allow, each with what to do."""
    kafka = app.spec.kafka
    security = kafka.security
    problems: list[Problem] = []
    servers = kafka.bootstrap_servers.split(",")
    denied = [server for server in servers if not _matches(server, policy.bootstrap_servers)]
    if policy.bootstrap_servers and denied:
        problems.append(
            Problem(
                "BootstrapServersNotAllowed",
                f"spec.kafka.bootstrapServers names {', '.join(denied)}, which this installation "
                f"does not allow (allowed: {', '.join(policy.bootstrap_servers)}): the operator "
                "connects only to the Kafka servers the platform lists (the chart's "
                "kafka.allowedBootstrapServers). Name an allowed server, or ask your platform "
                "team to allow this one",
            )
        )
    if not policy.bootstrap_servers and security.credentials is not None:
        problems.append(
            Problem(
                "BootstrapServersNotAllowed",
                f"spec.kafka.security.credentials would send the credentials of Secret "
                f"{security.credentials.secret_ref.name!r} to {kafka.bootstrap_servers}, and "
                "this installation allows credentials to no Kafka server (the chart's "
                "kafka.allowedBootstrapServers is empty). Ask your platform team to list your "
                "Kafka servers there",
            )
        )
    if security.security_protocol is SecurityProtocol.SASL_PLAINTEXT and not (
        policy.allow_sasl_plaintext
    ):
        problems.append(
            Problem(
                "SaslPlaintextNotAllowed",
                "spec.kafka.security.securityProtocol is SASL_PLAINTEXT, which sends the "
                "credentials over an unencrypted connection (the password itself with PLAIN), "
                "and this installation does not allow it (the chart's kafka.allowSaslPlaintext). "
                "Use SASL_SSL, or ask your platform team to allow SASL_PLAINTEXT",
            )
        )
    ca = security.ca_certificate
    if ca is not None and not _matches(ca.secret_ref.name, policy.ca_secrets):
        allowed = (
            ", ".join(policy.ca_secrets)
            if policy.ca_secrets
            else "none, the brokers are verified against the image's CAs"
        )
        problems.append(
            Problem(
                "CaCertificateNotAllowed",
                f"spec.kafka.security.caCertificate names Secret {ca.secret_ref.name!r}, which "
                f"this installation does not allow as a CA (allowed: {allowed}; the chart's "
                "kafka.allowedCaSecrets). Leave caCertificate out, name an allowed one, or ask "
                "your platform team to allow it",
            )
        )
    return problems


def referenced_secrets(app: StreamingApp) -> dict[str, list[str]]:
    """Every Secret the app's pods or the operator's clients would use, with the fields that
    name it: the Kafka credentials, the CA, and the secretKeyRefs of spec.env."""
    security = app.spec.kafka.security
    named: dict[str, list[str]] = {}
    if security.credentials is not None:
        named.setdefault(security.credentials.secret_ref.name, []).append(
            "spec.kafka.security.credentials"
        )
    if security.ca_certificate is not None:
        named.setdefault(security.ca_certificate.secret_ref.name, []).append(
            "spec.kafka.security.caCertificate"
        )
    for variable in app.spec.env or []:
        source = variable.value_from
        if source is not None and source.secret_key_ref is not None:
            named.setdefault(source.secret_key_ref.name, []).append(f"spec.env {variable.name}")
    return named


def unlabelled(
    named: Mapping[str, Sequence[str]],
    found: Iterable[str],
    namespace: str,
    policy: AccessPolicy,
) -> list[Problem]:
    """A problem for each named Secret that the labelled read did not find: it is missing, or
    it lacks the label (the operator cannot tell which, and does not look)."""
    key, value = policy.secret_label
    missing = sorted(set(named) - set(found))
    return [
        Problem(
            "SecretNotAllowed",
            f"Secret {name!r} ({', '.join(named[name])}) does not exist in namespace "
            f"{namespace} or does not carry the label {key}={value}: the operator reads, and "
            "its pods reference, only Secrets with that label. Have the Secret's owner label "
            f"it (kubectl label secret -n {namespace} {name} {key}={value}) if StreamingApps "
            "may use it, or name another Secret",
        )
        for name in missing
    ]


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name.lower(), pattern.lower()) for pattern in patterns)
