"""The patch formats and selectors, on their own."""

from __future__ import annotations

import pytest

from devstack.apiserver.errors import ApiError
from devstack.apiserver.patching import (
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from devstack.apiserver.selectors import field_selector, label_selector
from devstack.apiserver.tables import human_age, jsonpath

POD = {
    "metadata": {"name": "p", "labels": {"app": "x"}, "finalizers": ["a", "b"]},
    "spec": {
        "containers": [
            {"name": "main", "image": "one", "env": [{"name": "A", "value": "1"}]},
            {"name": "sidecar", "image": "two"},
        ],
        "tolerations": [{"key": "k"}],
    },
}


def test_strategic_merge_merges_containers_and_env_by_name() -> None:
    patch = {"spec": {"containers": [{"name": "main", "env": [{"name": "B", "value": "2"}]}]}}

    patched = strategic_merge_patch(POD, patch)

    main, sidecar = patched["spec"]["containers"]
    assert main["image"] == "one"
    assert main["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert sidecar == {"name": "sidecar", "image": "two"}


def test_strategic_merge_directives_delete_items_and_replace_lists_without_merge_key() -> None:
    patch = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"app": None}},
        "spec": {"containers": [{"name": "sidecar", "$patch": "delete"}], "tolerations": []},
    }

    patched = strategic_merge_patch(POD, patch)

    assert patched["metadata"]["finalizers"] == ["b"]
    assert patched["metadata"]["labels"] == {}
    assert [container["name"] for container in patched["spec"]["containers"]] == ["main"]
    assert patched["spec"]["tolerations"] == []


def test_merge_patch_replaces_lists_and_null_deletes() -> None:
    patched = merge_patch(POD, {"metadata": {"finalizers": ["c"], "labels": None}})

    assert patched["metadata"] == {"name": "p", "finalizers": ["c"]}
    assert POD["metadata"]["finalizers"] == ["a", "b"]  # the original is not changed


def test_json_patch_test_failure_is_a_422() -> None:
    with pytest.raises(ApiError) as refused:
        json_patch(POD, [{"op": "test", "path": "/metadata/name", "value": "q"}])

    assert refused.value.code == 422


def test_server_side_apply_merges_the_applied_fields_into_the_live_object() -> None:
    applied = apply_patch(
        POD, {"metadata": {"labels": {"tier": "gold"}}, "spec": {"tolerations": []}}
    )

    assert applied["metadata"]["labels"] == {"app": "x", "tier": "gold"}
    assert applied["spec"]["tolerations"] == []
    assert applied["spec"]["containers"] == POD["spec"]["containers"]


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("app=x", True),
        ("app==x,tier", False),
        ("app in (y, x)", True),
        ("app notin (x)", False),
        ("!tier", True),
        ("app!=x", False),
        ("", True),
    ],
)
def test_label_selectors(selector: str, matches: bool) -> None:
    assert label_selector(selector)(POD) is matches


def test_an_unparsable_label_selector_is_a_400() -> None:
    with pytest.raises(ApiError) as refused:
        label_selector("app in x")

    assert refused.value.code == 400


def test_field_selectors_compare_any_dotted_field_as_text() -> None:
    assert field_selector("metadata.name=p,spec.nodeName=")(POD)
    assert not field_selector("metadata.name!=p")(POD)


def test_printer_column_json_paths() -> None:
    obj = {"status": {"conditions": [{"type": "Ready", "status": "True"}], "replicas": 2}}

    assert jsonpath(obj, ".status.replicas") == [2]
    assert jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert jsonpath(obj, ".status.conditions[0].type") == ["Ready"]
    assert jsonpath(obj, ".status.missing") == []


def test_ages_print_like_kubectl() -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 1, 2, 12, 0, 0, tzinfo=UTC)
    assert human_age("2026-01-02T11:59:15Z", at) == "45s"
    assert human_age("2026-01-02T11:56:48Z", at) == "3m12s"
    assert human_age("2026-01-02T07:00:00Z", at) == "5h"
    assert human_age("2025-12-30T08:00:00Z", at) == "3d4h"
    # RFC 3339 as clients send it (the operator's Events: a fraction and an offset)
    assert human_age("2026-01-02T11:59:15.276103+00:00", at) == "44s"
