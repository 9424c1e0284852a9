"""constraint_from_params and the regex / choices checks shared by every backend."""

from __future__ import annotations

import json
import re

import pytest

from radixlm.runtime.constrained.specs import check_regex, choices_regex, constraint_from_params


def test_no_constraint_is_none():
    assert constraint_from_params() is None
    assert constraint_from_params(None, None, None) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"regex": "a", "json_schema": {"type": "string"}},
        {"regex": "a", "choices": ["a"]},
        {"json_schema": "{}", "choices": ["a"]},
    ],
)
def test_two_constraints_rejected(kwargs):
    with pytest.raises(ValueError, match="only one of regex, json_schema, choices"):
        constraint_from_params(**kwargs)


def test_schema_dict_and_text_normalise_to_the_same_spec():
    as_dict = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    as_text = json.dumps(as_dict, indent=4)
    kind, spec = constraint_from_params(json_schema=as_dict)
    assert kind == "json_schema"
    assert constraint_from_params(json_schema=as_text) == (kind, spec)
    assert list(json.loads(spec)["properties"]) == ["b", "a"]


@pytest.mark.parametrize("bad", ["{oops", "[1, 2]", "3"])
def test_bad_schema_text_rejected(bad):
    with pytest.raises(ValueError, match="json_schema"):
        constraint_from_params(json_schema=bad)


def test_choices_list_or_text():
    assert constraint_from_params(choices=["x", "y"]) == ("choices", '["x","y"]')
    assert constraint_from_params(choices='["x", "y"]') == constraint_from_params(
        choices=["x", "y"]
    )
    with pytest.raises(ValueError, match="non-empty list of strings"):
        constraint_from_params(choices=[])


def test_regex_passes_through():
    assert constraint_from_params(regex="[0-9]+") == ("regex", "[0-9]+")


@pytest.mark.parametrize(
    ("regex", "expected"),
    [("^abc$", "abc"), ("^(a|b)$", "(a|b)"), (r"a\$", r"a\$"), ("a+", "a+"), (r"\p{L}", r"\p{L}")],
)
def test_check_regex_strips_only_outer_anchors(regex, expected):
    assert check_regex(regex) == expected


@pytest.mark.parametrize(
    "regex", ["(?=a)", "(?<!a)b", r"(a)\1", "(?P<x>a)(?P=x)", "a++", "(?>a)", "^a|b$", "a^b"]
)
def test_check_regex_rejects_unsupported_features(regex):
    with pytest.raises(ValueError, match="not supported"):
        check_regex(regex)


def test_choices_regex_escapes_metacharacters():
    choices = ["a.b", "(x)", "1+1", "what?", "c:\\d", "[]{}^$|*"]
    pattern = re.compile(choices_regex(choices))
    for choice in choices:
        assert pattern.fullmatch(choice)
    assert not pattern.fullmatch("aXb")
