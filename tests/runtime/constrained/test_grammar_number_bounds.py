"""JSON numbers in schema grammars are bounded, so a model cannot loop inside a number."""

from __future__ import annotations

import json
import re

from radixlm.runtime.constrained.schema_regex import json_schema_regex

SCHEMA = json.dumps({
    "type": "object",
    "properties": {"x": {"type": "number"}, "n": {"type": "integer"}},
    "required": ["x", "n"],
})


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
