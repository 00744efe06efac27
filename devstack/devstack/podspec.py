"""A Pod object (JSON, as the API serves it) -> what the process runner runs.

The kubelet runs each container's `command` + `args` as a local process; the image is not
used. Environment variables come from `env` (plain values, the downward API's fieldRef, and
configMapKeyRef/secretKeyRef through a lookup), with Kubernetes' `$(VAR)` expansion.
"""

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from devstack.probes import ExecAction, HttpGetAction, Probe
from devstack.processes import (
    ContainerSpec,
    PodProcessSpec,
    RestartPolicy,
    process_environment,
)

JsonObject = dict[str, Any]

NODE_IP = "127.0.0.1"
"""Every node's IP (status.hostIP): the kubelets run on this machine."""


def pod_ip(pod: JsonObject) -> str:
    """The pod's IP (status.podIP): an address of its own on the machine's loopback (Linux
    routes all of 127.0.0.0/8 there), derived from its uid, never 127.0.0.1. Processes share
    the machine's network, so a process that binds its pod's IP rather than every address
    (0.0.0.0) does not clash with another pod's on the same port: a pod re-created under the
    same name while its predecessor's process still lives (a force delete, a frozen process),
    as on a cluster, where each pod has a network of its own."""
    digest = hashlib.sha256(str(pod["metadata"].get("uid", "")).encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{1 + digest[2] % 254}"


DEFAULT_TERMINATION_GRACE_SECONDS = 30


class PodConfigError(Exception):
    """The pod cannot be run as it is; the kubelet reports it in the container's waiting state
    (reason CreateContainerConfigError) and tries again later."""


KeyLookup = Callable[[str, str, str], str | None]
"""(namespace, object name, key) -> the value, or None when the object or key is missing."""


@dataclass(frozen=True)
class ValueSources:
    """Where configMapKeyRef and secretKeyRef values come from (the kubelet reads the API)."""

    config_map: KeyLookup
    secret: KeyLookup


NO_VALUE_SOURCES = ValueSources(lambda *_: None, lambda *_: None)

_FIELD_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")
_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def pod_key(pod: JsonObject) -> str:
    """The runner's name for a pod; unique across pods recreated with the same name."""
    meta = pod["metadata"]
    return f"{meta.get('namespace', 'default')}_{meta['name']}_{meta.get('uid', '')[:8]}"


def field_value(pod: JsonObject, field_path: str, node_name: str) -> str:
    """The downward API: the value of `fieldRef.fieldPath` for this pod."""
    meta = pod["metadata"]
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName") or node_name,
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip(pod),
        "status.podIPs": pod_ip(pod),
        "status.hostIP": NODE_IP,
        "status.hostIPs": NODE_IP,
    }
    if field_path in simple:
        return str(simple[field_path])
    match = _FIELD_REF.match(field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise PodConfigError(
        f"fieldRef {field_path!r} is not supported by the process kubelet; use one of "
        f"{', '.join(sorted(simple))}, metadata.labels['KEY'] or metadata.annotations['KEY']"
    )


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' variable expansion: `$(NAME)` -> env's NAME when defined (else left as it
    is), `$$` -> `$`."""

    def replacement(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _VARIABLE.sub(replacement, text)


def container_env(
    pod: JsonObject, container: JsonObject, node_name: str, sources: ValueSources
) -> dict[str, str]:
    """The container's own environment variables, in order, each expanded against the ones
    before it."""
    namespace = pod["metadata"].get("namespace", "default")
    env: dict[str, str] = {}
    if container.get("envFrom"):
        raise PodConfigError(
            f"container {container['name']!r}: envFrom is not supported by the process kubelet; "
            "list the variables under env"
        )
    for variable in container.get("env") or []:
        name = variable["name"]
        if "valueFrom" not in variable:
            env[name] = expand(str(variable.get("value", "")), env)
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"], node_name)
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind, reference = (
                ("ConfigMap", source["configMapKeyRef"])
                if "configMapKeyRef" in source
                else ("Secret", source["secretKeyRef"])
            )
            lookup = sources.config_map if kind == "ConfigMap" else sources.secret
            value = lookup(namespace, reference["name"], reference["key"])
            if value is not None:
                env[name] = value
            elif not reference.get("optional", False):
                raise PodConfigError(
                    f"container {container['name']!r}: env {name} needs key "
                    f"{reference['key']!r} of {kind} {namespace}/{reference['name']}, which does "
                    f"not exist; create it (or mark the reference optional)"
                )
        else:
            raise PodConfigError(
                f"container {container['name']!r}: env {name} uses "
                f"{', '.join(sorted(source))}, which the process kubelet does not support; "
                "use value, fieldRef, configMapKeyRef or secretKeyRef"
            )
    return env


def _port(container: JsonObject, port: int | str) -> int:
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise PodConfigError(
        f"container {container['name']!r}: a probe names port {port!r}, "
        "which the container does not declare under ports"
    )


def probe_of(container: JsonObject, probe: JsonObject | None, host: str) -> Probe | None:
    """A Kubernetes probe (exec or httpGet) with its defaults; an httpGet probe goes to
    `host` (the pod's IP) unless it names its own."""
    if probe is None:
        return None
    if "exec" in probe:
        action: ExecAction | HttpGetAction = ExecAction(tuple(probe["exec"].get("command", [])))
    elif "httpGet" in probe:
        get = probe["httpGet"]
        action = HttpGetAction(
            port=_port(container, get["port"]),
            path=get.get("path", "/"),
            host=get.get("host") or host,
            scheme=get.get("scheme", "HTTP"),
            headers=tuple((h["name"], h["value"]) for h in get.get("httpHeaders") or []),
        )
    else:
        raise PodConfigError(
            f"container {container['name']!r}: only exec and httpGet probes are supported by "
            f"the process kubelet, not {', '.join(sorted(set(probe) - _PROBE_TIMING))}"
        )
    return Probe(
        action,
        initial_delay_seconds=float(probe.get("initialDelaySeconds", 0)),
        period_seconds=float(probe.get("periodSeconds", 10)),
        timeout_seconds=float(probe.get("timeoutSeconds", 1)),
        success_threshold=int(probe.get("successThreshold", 1)),
        failure_threshold=int(probe.get("failureThreshold", 3)),
    )


_PROBE_TIMING = frozenset(
    {
        "initialDelaySeconds",
        "periodSeconds",
        "timeoutSeconds",
        "successThreshold",
        "failureThreshold",
        "terminationGracePeriodSeconds",
    }
)


def termination_grace_seconds(pod: JsonObject) -> float:
    """How long a deletion waits between SIGTERM and SIGKILL: the delete's grace period when
    the API server recorded one, else the pod's terminationGracePeriodSeconds (default 30)."""
    meta = pod["metadata"]
    if meta.get("deletionGracePeriodSeconds") is not None:
        return float(meta["deletionGracePeriodSeconds"])
    spec_grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    return float(DEFAULT_TERMINATION_GRACE_SECONDS if spec_grace is None else spec_grace)


def process_spec(
    pod: JsonObject,
    node_name: str,
    sources: ValueSources = NO_VALUE_SOURCES,
    base_env: Mapping[str, str] | None = None,
    cluster_env: Mapping[str, str] | None = None,
) -> PodProcessSpec:
    """What to run for `pod`; PodConfigError says what the kubelet cannot run, and why.
    `cluster_env` is what the kubelet gives every container to reach the API (KUBECONFIG),
    under the container's own env."""
    spec = pod.get("spec", {})
    if spec.get("initContainers"):
        raise PodConfigError(
            "initContainers are not supported by the process kubelet; run the step at the start "
            "of the container's command"
        )
    containers = []
    for container in spec.get("containers") or []:
        if not container.get("command"):
            raise PodConfigError(
                f"container {container['name']!r} has no command: the process kubelet runs no "
                "images, so it needs the command (and args) to run as a local process"
            )
        env = container_env(pod, container, node_name, sources)
        argv = tuple(
            expand(str(part), env) for part in [*container["command"], *container.get("args", [])]
        )
        containers.append(
            ContainerSpec(
                name=container["name"],
                argv=argv,
                env=process_environment({**(cluster_env or {}), **env}, base_env),
                readiness_probe=probe_of(container, container.get("readinessProbe"), pod_ip(pod)),
                liveness_probe=probe_of(container, container.get("livenessProbe"), pod_ip(pod)),
                startup_probe=probe_of(container, container.get("startupProbe"), pod_ip(pod)),
                message_from_log=container.get("terminationMessagePolicy")
                == "FallbackToLogsOnError",
            )
        )
    if not containers:
        raise PodConfigError("the pod has no containers")
    try:
        policy = RestartPolicy(spec.get("restartPolicy", "Always"))
    except ValueError:
        raise PodConfigError(
            f"restartPolicy {spec.get('restartPolicy')!r} is not Always, OnFailure or Never"
        ) from None
    return PodProcessSpec(
        key=pod_key(pod),
        containers=tuple(containers),
        restart_policy=policy,
        termination_grace_seconds=termination_grace_seconds(pod),
    )
