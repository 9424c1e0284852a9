"""gen_int, dtype, regex and json_schema go through the runtime's constrained decoding."""

from __future__ import annotations

import json
import re

import radixlm as sgl


def test_gen_int_returns_an_int(tiny):
    @sgl.function
    def count(s):
        s += "Number of legs of a cat: "
        s += sgl.gen_int("legs", max_tokens=4)

    state = count.run(temperature=0, backend=tiny)
    assert state.error() is None
    assert isinstance(state["legs"], int)


def test_regex_gen_matches_its_regex(tiny):
    pattern = r"(yes|no), [a-c]{3}"

    @sgl.function
    def constrained(s):
        s += "Answer: "
        s += sgl.gen("out", max_tokens=12, regex=pattern)

    state = constrained.run(temperature=0, backend=tiny)
    assert re.fullmatch(pattern, state["out"]), state["out"]


def test_json_schema_gen_parses(tiny):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}

    @sgl.function
    def as_json(s):
        s += "JSON: "
        s += sgl.gen("obj", max_tokens=16, json_schema=schema)

    state = as_json.run(temperature=0, backend=tiny)
    assert isinstance(json.loads(state["obj"])["ok"], bool)
