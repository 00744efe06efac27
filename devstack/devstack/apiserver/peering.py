"""The CRDs of kopf's peering (kopf.dev/v1 KopfPeering and ClusterKopfPeering), served from the
start so that kopf can run with peering on."""

from __future__ import annotations

from devstack.apiserver.errors import JsonObject


def _peering_crd(kind: str, plural: str, scope: str) -> JsonObject:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


KOPF_PEERING_CRDS: tuple[JsonObject, ...] = (
    _peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
    _peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
)
