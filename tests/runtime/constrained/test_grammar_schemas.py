"""Every backend's output for a suite of JSON schemas parses and validates against the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
from backend_params import BACKENDS, INSTALLED

SEEDS = (0, 1, 2)
STR = {"type": "string"}
SHORT = {"type": "string", "maxLength": 8}
INT = {"type": "integer"}


def obj(props: dict, required: list[str] | None = None, **extra) -> dict:
    schema = {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
    }
    return {**schema, **extra}


SCHEMAS = {
    "name": obj({"name": STR}),
    "person_bounded_age": obj(
        {"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120}}
    ),
    "probability": obj({"p": {"type": "number", "minimum": 0, "maximum": 1}}),
    "number_fractional_bounds": obj({"x": {"type": "number", "minimum": -10.5, "maximum": 99.25}}),
    "integer_exclusive": obj(
        {"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}}
    ),
    "integer_one_sided": obj(
        {"lo": {"type": "integer", "minimum": 1000}, "hi": {"type": "integer", "maximum": -5}}
    ),
    "number_exclusive": obj(
        {"t": {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1}}
    ),
    "enum_strings": obj({"color": {"enum": ["red", "green", "blue"]}}),
    "enum_mixed": obj({"v": {"enum": [1, "two", None, 3.5, True]}}),
    "booleans_nulls": obj({"ok": {"type": "boolean"}, "none": {"type": "null"}}),
    "int_array_1_3": obj({"xs": {"type": "array", "items": INT, "minItems": 1, "maxItems": 3}}),
    "str_array_2_4": obj({"tags": {"type": "array", "items": SHORT, "minItems": 2, "maxItems": 4}}),
    "nested": obj({"user": obj({"id": INT, "name": SHORT}), "active": {"type": "boolean"}}),
    "deeply_nested": obj(
        {"a": obj({"b": obj({"c": obj({"d": {"type": "integer", "minimum": 0}})})})}
    ),
    "array_of_objects": {
        "type": "array",
        "items": obj({"sku": SHORT, "qty": {"type": "integer", "minimum": 1, "maximum": 99}}),
        "minItems": 1,
        "maxItems": 2,
    },
    "all_optional": obj({"a": INT, "b": SHORT, "c": {"type": "boolean"}}, required=[]),
    "some_optional": obj({"id": INT, "nick": SHORT, "score": {"type": "number"}}, required=["id"]),
    "string_pattern": obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    "string_lengths": obj({"s": {"type": "string", "minLength": 2, "maxLength": 6}}),
    "date": obj({"when": {"type": "string", "format": "date"}}),
    "email": obj({"to": {"type": "string", "format": "email"}}),
    "uuid": obj({"id": {"type": "string", "format": "uuid"}}),
    "date_time": obj({"at": {"type": "string", "format": "date-time"}}),
    "any_of_scalar": obj({"v": {"anyOf": [INT, SHORT]}}),
    "any_of_objects": {
        "anyOf": [
            obj({"kind": {"const": "cat"}, "lives": INT}),
            obj({"kind": {"const": "dog"}, "good": {"type": "boolean"}}),
        ]
    },
    "nullable": obj({"middle": {"type": ["string", "null"], "maxLength": 5}}),
    "const": obj({"version": {"const": 2}, "name": SHORT}),
    "refs": {
        "$defs": {"point": obj({"x": INT, "y": INT})},
        **obj({"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}),
    },
    "enum_array": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "no_additional": obj({"k": SHORT, "v": INT}, additionalProperties=False),
    "one_of_disjoint": obj({"v": {"oneOf": [SHORT, {"type": "integer"}]}}),
    "tuple": {"type": "array", "prefixItems": [INT, SHORT, {"type": "boolean"}], "items": False},
    "plain_numbers": obj({"lat": {"type": "number"}, "lon": {"type": "number"}}),
    "order": obj(
        {
            "id": {"type": "string", "pattern": "^ORD[0-9]{4}$"},
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": obj({"name": SHORT, "price": {"type": "number", "minimum": 0}}),
            },
            "status": {"enum": ["new", "paid", "shipped"]},
            "placed": {"type": "string", "format": "date"},
        }
    ),
    "top_level_string": {"type": "string", "maxLength": 10},
    "top_level_integer": {"type": "integer", "minimum": -50, "maximum": 50},
}


@pytest.fixture(scope="module")
def futures(compilers):
    """Submit every compile up front so the pool works while earlier cases run."""
    return {
        (backend, name): compilers[backend].submit("json_schema", json.dumps(schema))
        for name, schema in SCHEMAS.items()
        for backend in INSTALLED
    }


def _validator(schema: dict) -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_generated_json_validates(name, backend, futures, sample, decode):
    grammar = futures[(backend, name)].result(timeout=60)
    validator = _validator(SCHEMAS[name])
    for seed in (*SEEDS, None):
        tokens, ended = sample(grammar.matcher(), seed)
        text = decode(tokens)
        assert ended, f"no end within the token cap (seed {seed}): {text[:200]!r}"
        validator.validate(json.loads(text))


def test_suite_size():
    assert len(SCHEMAS) >= 30
