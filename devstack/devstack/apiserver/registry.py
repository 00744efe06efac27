"""The resource types the server knows: built-in kinds and those of the CRDs it has been given."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from devstack.apiserver.errors import JsonObject, no_such_path

CRD_GROUP = "apiextensions.k8s.io"
RBAC_GROUP = "rbac.authorization.k8s.io"
POLICY_GROUP = "policy"


@dataclass(frozen=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry of a CRD version (or a built-in kind's column)."""

    name: str
    type: str
    json_path: str
    priority: int = 0
    description: str = ""
    format: str = ""


@dataclass(frozen=True)
class ScalePaths:
    """Where the scale subresource reads and writes, as JSONPaths like ".spec.replicas"."""

    spec_replicas: str
    status_replicas: str
    label_selector: str | None = None


@dataclass(frozen=True)
class ResourceType:
    """One resource served at one group/version, e.g. smoothscale.io/v1alpha1 streamingapps.

    All served versions of a CRD share one storage (`key`); objects read through another version
    only change their apiVersion, like a CRD with conversion strategy None.
    """

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    scale: ScalePaths | None = None
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    printer_columns: tuple[PrinterColumn, ...] = ()
    custom: bool = False
    """Served from a CustomResourceDefinition (JSON merge patch only, no strategic merge)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """The group-qualified plural used in messages, e.g. "streamingapps.smoothscale.io"."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def stamp(self, obj: JsonObject) -> JsonObject:
        """The object as served at this group/version (its apiVersion and kind set)."""
        obj["apiVersion"], obj["kind"] = self.api_version, self.kind
        return obj

    @property
    def key(self) -> tuple[str, str]:
        """Where its objects are stored: shared by all versions of the same resource."""
        return (self.group, self.plural)


def _core(
    plural: str,
    kind: str,
    *,
    namespaced: bool,
    short_names: tuple[str, ...] = (),
    status: bool = False,
    group: str = "",
    version: str = "v1",
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=short_names,
        categories=categories,
        status_subresource=status,
    )


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", namespaced=False, short_names=("ns",), status=True),
    _core("nodes", "Node", namespaced=False, short_names=("no",), status=True),
    _core("pods", "Pod", namespaced=True, short_names=("po",), status=True, categories=("all",)),
    _core("events", "Event", namespaced=True, short_names=("ev",)),
    _core("configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
    _core("secrets", "Secret", namespaced=True),
    _core("serviceaccounts", "ServiceAccount", namespaced=True, short_names=("sa",)),
    _core(
        "services",
        "Service",
        namespaced=True,
        short_names=("svc",),
        status=True,
        categories=("all",),
    ),
    _core("events", "Event", namespaced=True, short_names=("ev",), group="events.k8s.io"),
    ResourceType(
        group="apps",
        version="v1",
        plural="deployments",
        singular="deployment",
        kind="Deployment",
        namespaced=True,
        short_names=("deploy",),
        categories=("all",),
        status_subresource=True,
        scale=ScalePaths(spec_replicas=".spec.replicas", status_replicas=".status.replicas"),
    ),
    ResourceType(
        group="apps",
        version="v1",
        plural="replicasets",
        singular="replicaset",
        kind="ReplicaSet",
        namespaced=True,
        short_names=("rs",),
        categories=("all",),
        status_subresource=True,
        scale=ScalePaths(spec_replicas=".spec.replicas", status_replicas=".status.replicas"),
    ),
    _core(
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        namespaced=True,
        short_names=("pdb",),
        status=True,
        group=POLICY_GROUP,
    ),
    _core("roles", "Role", namespaced=True, group=RBAC_GROUP),
    _core("rolebindings", "RoleBinding", namespaced=True, group=RBAC_GROUP),
    _core("clusterroles", "ClusterRole", namespaced=False, group=RBAC_GROUP),
    _core("clusterrolebindings", "ClusterRoleBinding", namespaced=False, group=RBAC_GROUP),
    _core(
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        status=True,
        group=CRD_GROUP,
        categories=("api-extensions",),
    ),
)


def _columns(version: Mapping[str, Any]) -> tuple[PrinterColumn, ...]:
    return tuple(
        PrinterColumn(
            name=column["name"],
            type=column.get("type", "string"),
            json_path=column["jsonPath"],
            priority=int(column.get("priority", 0)),
            description=column.get("description", ""),
            format=column.get("format", ""),
        )
        for column in version.get("additionalPrinterColumns", [])
    )


def types_from_crd(crd: JsonObject) -> list[ResourceType]:
    """The resource types a CustomResourceDefinition serves: one per served version."""
    spec = crd["spec"]
    names = spec["names"]
    types = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        scale = subresources.get("scale")
        types.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                kind=names["kind"],
                namespaced=spec["scope"] == "Namespaced",
                short_names=tuple(names.get("shortNames", [])),
                categories=tuple(names.get("categories", [])),
                status_subresource="status" in subresources,
                scale=ScalePaths(
                    spec_replicas=scale["specReplicasPath"],
                    status_replicas=scale["statusReplicasPath"],
                    label_selector=scale.get("labelSelectorPath"),
                )
                if scale is not None
                else None,
                schema=(version.get("schema") or {}).get("openAPIV3Schema")
                or {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                printer_columns=_columns(version),
                custom=True,
            )
        )
    return types


def crd_problems(crd: JsonObject) -> list[tuple[str, str]]:
    """What makes a CRD unusable, as (field, message); the checks kubectl users run into."""
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    problems = []
    names = spec.get("names") or {}
    for field_name in ("plural", "kind"):
        if not names.get(field_name):
            problems.append((f"spec.names.{field_name}", "Required value"))
    if not spec.get("group"):
        problems.append(("spec.group", "Required value"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append(("spec.scope", 'Unsupported value: must be "Namespaced" or "Cluster"'))
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        problems.append(("spec.versions", "Required value: give at least one version"))
    elif sum(1 for version in versions if version.get("storage")) != 1:
        problems.append(("spec.versions", "Invalid value: exactly one version must be storage"))
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if not problems and crd.get("metadata", {}).get("name") != expected:
        problems.append(
            (
                "metadata.name",
                f'Invalid value: must be spec.names.plural+"."+spec.group: "{expected}"',
            )
        )
    return problems


class Registry:
    """Resource types by group, version and plural, plus the lookups discovery needs."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for resource_type in BUILTIN_TYPES:
            self.add(resource_type)

    def add(self, resource_type: ResourceType) -> None:
        rt = resource_type
        self._types[(rt.group, rt.version, rt.plural)] = rt

    def replace_crd_types(self, group: str, plural: str, types: list[ResourceType]) -> None:
        """Serve exactly `types` for this CRD's resource (none: the CRD is gone)."""
        for key in [key for key in self._types if key[0] == group and key[2] == plural]:
            del self._types[key]
        for resource_type in types:
            self.add(resource_type)

    def get(self, group: str, version: str, plural: str) -> ResourceType:
        try:
            return self._types[(group, version, plural)]
        except KeyError:
            raise no_such_path() from None

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._types.values()))

    def group_versions(self) -> dict[str, list[str]]:
        """Each group with its versions, the preferred (newest-looking) first."""
        groups: dict[str, list[str]] = {}
        for group, version, _ in self._types:
            versions = groups.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        for versions in groups.values():
            versions.sort(key=_version_priority)
        return groups

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for (g, v, _), rt in self._types.items() if (g, v) == (group, version)]


_KUBE_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def _version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order: GA before beta before alpha, higher numbers first, and
    anything not shaped like v1beta2 last, alphabetically."""
    match = _KUBE_VERSION.match(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = match.groups()
    stage_rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (stage_rank, -int(major), -int(minor or 0), version)
