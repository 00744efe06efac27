"""smoothscale.api.schema judges any CRD schema as the API server does (here: a small one)."""

from typing import Any

import pytest

from smoothscale.api.schema import FieldError, apply_defaults, validate

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "x-kubernetes-validations": [
                {
                    "rule": "self.size <= self.limit",
                    "message": "must not exceed limit",
                    "fieldPath": ".size",
                }
            ],
            "properties": {
                "size": {"type": "integer", "minimum": 0},
                "limit": {"type": "integer", "default": 10},
                "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
                "options": {
                    "type": "object",
                    "default": {},
                    "properties": {"retries": {"type": "integer", "default": 3}},
                },
                "quantity": {
                    "x-kubernetes-int-or-string": True,
                    "anyOf": [{"type": "integer"}, {"type": "string"}],
                    "pattern": "^[0-9]+(Mi|Gi)?$",
                },
                "names": {
                    "type": "array",
                    "x-kubernetes-list-type": "set",
                    "items": {"type": "string", "pattern": "^[a-z]+$"},
                },
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "note": {"type": "string", "nullable": True},
            },
        }
    },
}


def obj(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "x.io/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": spec}


def errors(o: Any) -> dict[str, str]:
    return {e.path: e.message for e in validate(SCHEMA, o)}


def test_defaults_fill_missing_fields_and_nested_defaults_of_defaults() -> None:
    defaulted = apply_defaults(SCHEMA, obj(size=1))
    assert defaulted["spec"] == {"size": 1, "limit": 10, "mode": "safe", "options": {"retries": 3}}


def test_defaulting_replaces_null_of_a_non_nullable_field_but_keeps_a_nullable_null() -> None:
    defaulted = apply_defaults(SCHEMA, obj(size=1, limit=None, note=None))
    assert defaulted["spec"]["limit"] == 10
    assert defaulted["spec"]["note"] is None


def test_defaulting_does_not_change_its_input() -> None:
    original = obj(size=1)
    apply_defaults(SCHEMA, original)
    assert original == obj(size=1)


def test_a_valid_object_has_no_errors() -> None:
    assert (
        validate(
            SCHEMA,
            obj(
                size=3,
                quantity="512Mi",
                names=["a", "b"],
                labels={"x.io/y": "z"},
                free={"any": {"thing": 1}},
            ),
        )
        == []
    )


def test_bounds_enums_patterns_and_types_name_the_field_and_what_is_allowed() -> None:
    found = errors(obj(size=-1, mode="slow", names=["A"], quantity="1 GB"))
    assert "greater than or equal to 0" in found["spec.size"]
    assert '"fast", "safe"' in found["spec.mode"]
    assert "^[a-z]+$" in found["spec.names[0]"]
    assert "^[0-9]+(Mi|Gi)?$" in found["spec.quantity"]


def test_unknown_fields_are_reported_at_every_level_except_where_preserved() -> None:
    o = obj(size=1, colour="red", options={"retrys": 1}, free={"whatever": 1})
    found = errors(o)
    assert found["spec.colour"].startswith('unknown field "colour"; allowed fields: ')
    assert 'unknown field "retrys"; allowed fields: retries' in found["spec.options.retrys"]
    assert not any(path.startswith("spec.free") for path in found)


def test_required_fields_are_reported_with_their_own_path() -> None:
    assert errors(obj())["spec.size"] == "is required"
    assert "spec" in errors({"metadata": {"name": "t"}})


def test_wrong_types_skip_cel_rules_like_the_api_server() -> None:
    found = validate(SCHEMA, obj(size="big", quantity=[1]))
    assert FieldError("spec.size", "must be an integer, not a string") in found
    assert FieldError("spec.quantity", "must be an integer or a string, not a list") in found
    assert any("rules were not checked" in e.message for e in found)


def test_a_schema_without_cel_rules_gets_no_note_about_skipped_rules() -> None:
    plain = {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}},
    }
    found = validate(plain, {"metadata": {"name": "t"}, "spec": {"size": "big"}})
    assert found == [FieldError("spec.size", "must be an integer, not a string")]


def test_cel_rules_see_defaults_and_report_at_their_field_path() -> None:
    assert errors(obj(size=11)) == {"spec.size": "must not exceed limit"}
    assert errors(obj(size=11, limit=20)) == {}


def test_list_type_set_refuses_duplicates() -> None:
    found = errors(obj(size=1, names=["a", "b", "a"]))
    assert "must be unique" in found["spec.names[2]"]


def test_map_keys_that_are_not_identifiers_are_bracketed() -> None:
    found = errors(obj(size=1, labels={"kubernetes.io/os": 1}))
    assert found["spec.labels[kubernetes.io/os]"] == "must be a string, not an integer"


@pytest.mark.parametrize(
    ("metadata", "path", "fragment"),
    [
        ({}, "metadata.name", "is required"),
        ({"name": "My_App"}, "metadata.name", "RFC 1123 subdomain"),
        ({"name": "a" * 254}, "metadata.name", "at most 253"),
        ({"name": "ok", "namespace": "a.b"}, "metadata.namespace", "RFC 1123 label"),
        ({"name": "ok", "labels": {"app": "a b"}}, "metadata.labels.app", "label value"),
        ({"name": "ok", "labels": {"-x": "a"}}, "metadata.labels[-x]", "key"),
        ({"name": "ok", "nmae": "x"}, "metadata.nmae", 'unknown field "nmae"'),
    ],
)
def test_metadata_is_checked_as_object_meta(
    metadata: dict[str, Any], path: str, fragment: str
) -> None:
    o = obj(size=1)
    o["metadata"] = metadata
    assert fragment in errors(o)[path]


def test_generate_name_stands_in_for_name() -> None:
    o = obj(size=1)
    o["metadata"] = {"generateName": "thing-"}
    assert errors(o) == {}


def test_a_crd_may_narrow_metadata_name() -> None:
    narrowed = {
        **SCHEMA,
        "properties": {
            **SCHEMA["properties"],
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 10}},
            },
        },
    }
    o = obj(size=1)
    o["metadata"] = {"name": "much-too-long-name", "labels": {"a": "b"}}
    found = {e.path: e.message for e in validate(narrowed, o)}
    assert found["metadata.name"] == "must be at most 10 characters long, got 18"
    assert set(found) == {"metadata.name", ""}  # "": too long blocks the CEL rules
