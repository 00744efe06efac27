"""The platform's policy for what StreamingApps may do with credentials: a value the operator's
flags (the chart's `secrets` and `kafka` values) set, and `smoothscale.operator.access` applies.
Kept light: the command line builds it without importing the operator."""

from dataclasses import dataclass

DEFAULT_SECRET_LABEL = ("smoothscale.io/streamingapps", "allowed")
"""The label a Secret carries when the platform lets StreamingApps use it (the chart's default)."""


@dataclass(frozen=True)
class AccessPolicy:
    """What the platform allows StreamingApps (the operator's flags, from the chart's values)."""

    secret_label: tuple[str, str] = DEFAULT_SECRET_LABEL
    """(key, value): the operator reads, and its pods reference, only Secrets with this label."""
    bootstrap_servers: tuple[str, ...] = ()
    """host:port patterns (fnmatch: `*`, `?`, `[...]`) of the Kafka servers apps may name.
    Empty: any server, but only without credentials, which then go nowhere."""
    allow_sasl_plaintext: bool = False
    """Whether an app may send its SASL credentials unencrypted (SASL_PLAINTEXT)."""
    ca_secrets: tuple[str, ...] = ()
    """Name patterns of the Secrets an app may name as the CA its brokers are verified
    against (spec.kafka.security.caCertificate). Empty: none, the image's CAs verify them."""

    @property
    def secret_selector(self) -> str:
        """The label selector every read of a Secret carries."""
        key, value = self.secret_label
        return f"{key}={value}"
