"""JSON numbers in schema grammars are bounded, so a model cannot loop inside a number."""

from __future__ import annotations

import json
import re

import pytest
import torch
from backend_params import BACKENDS

from radixlm.runtime.constrained.schema_bounds import bound_schema_numbers
from radixlm.runtime.constrained.schema_regex import json_schema_regex

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"x": {"type": "number"}, "n": {"type": "integer"}},
        "required": ["x", "n"],
    }
)


def test_digits_and_exponents_are_bounded():
    regex = json_schema_regex(SCHEMA, "")
    ok = '{"x":-1234567890123456.1234567890123456e+308,"n":1234567890123456}'
    assert re.fullmatch(regex, ok)
    assert not re.fullmatch(regex, '{"x":1.12345678901234567,"n":1}')  # 17 fraction digits
    assert not re.fullmatch(regex, '{"x":1,"n":12345678901234567}')  # 17 integer digits
    assert not re.fullmatch(regex, '{"x":1e+1000,"n":1}')


def test_json_object_mode_bounds_nested_numbers_too():
    regex = json_schema_regex(json.dumps({"type": "object"}), "")
    assert re.fullmatch(regex, '{"a":{"b":2.5}}')
    assert not re.fullmatch(regex, '{"a":' + "9" * 40 + "}")


NUMBERS = json.dumps(
    {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "n": {"type": "integer"},
            "r": {"type": "number", "minimum": -1e300},
            "list": {"type": "array", "items": {"type": "number"}, "maxItems": 2},
        },
        "required": ["x", "n", "r", "list"],
    }
)


@pytest.fixture(scope="module")
def digit_bias(token_table) -> torch.Tensor:
    """A model that would rather write digits than anything else."""
    weights = [8.0 if data and set(data) <= set(b"0123456789") else 0.0 for data in token_table]
    return torch.tensor(weights).unsqueeze(0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_a_model_that_loves_digits_still_ends_its_numbers(
    backend, seed, backends, digit_bias, sample, decode
):
    matcher = backends[backend].compile("json_schema", NUMBERS).matcher()
    tokens, ended = sample(matcher, seed, bias=digit_bias)
    assert ended, backend
    text = decode(tokens)
    value = json.loads(text)  # ended, and is valid JSON
    for whole, fraction, exponent in re.findall(
        r"([0-9]+)(?:\.([0-9]+))?(?:[eE][+-]?([0-9]+))?", text
    ):
        assert len(whole) <= 16 and len(fraction) <= 16 and len(exponent) <= 3, (backend, text)
    assert isinstance(value["n"], int)


@pytest.mark.parametrize("schema", [NUMBERS, json.dumps({"type": "object"}), "true"])
def test_llguidance_schema_bounds_keep_the_clients_keywords(schema):
    bounded = json.loads(bound_schema_numbers(schema))
    assert "radixlm_any_json" in bounded["$defs"]
    if schema == NUMBERS:
        props = bounded["properties"]
        assert props["x"]["maximum"] == 10**16 - 1 and props["x"]["multipleOf"] == 1e-10
        assert "multipleOf" not in props["n"]
        assert props["r"]["minimum"] == -(10**16 - 1)  # 1e300 would allow 300 digits
        assert props["list"]["items"]["multipleOf"] == 1e-10
