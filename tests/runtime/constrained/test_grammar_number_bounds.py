"""JSON numbers in schema grammars are bounded, so a model cannot loop inside a number."""

from __future__ import annotations

import json
import re

import pytest
import torch

from radixlm.runtime.constrained import allocate_bitmask, apply_bitmask
from radixlm.runtime.constrained.schema_bounds import bound_schema_numbers
from radixlm.runtime.constrained.schema_regex import json_schema_regex
from radixlm.runtime.constrained.vocabulary import token_bytes_table
from tests.runtime.constrained.conftest import BACKENDS, EOS_ID, VOCAB_SIZE

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
def digit_bias(tokenizer) -> torch.Tensor:
    """A model that would rather write digits than anything else."""
    table = token_bytes_table(tokenizer, VOCAB_SIZE, [EOS_ID])
    weights = [8.0 if data and set(data) <= set(b"0123456789") else 0.0 for data in table]
    return torch.tensor(weights).unsqueeze(0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_a_model_that_loves_digits_still_ends_its_numbers(
    backend, seed, backends, digit_bias, decode
):
    matcher = backends[backend].compile("json_schema", NUMBERS).matcher()
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    bitmask = allocate_bitmask(1, VOCAB_SIZE)
    tokens: list[int] = []
    while not matcher.is_terminated() and len(tokens) < 400:
        matcher.fill_bitmask(bitmask, 0)
        logits = (
            torch.zeros(1, VOCAB_SIZE) if gen is None else torch.randn(1, VOCAB_SIZE, generator=gen)
        )
        logits += digit_bias
        if matcher.is_accepting():
            logits[0, EOS_ID] += 100.0
        apply_bitmask(logits, bitmask)
        token = int(logits.argmax())
        matcher.advance(token)
        if token == EOS_ID:
            break
        tokens.append(token)
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
