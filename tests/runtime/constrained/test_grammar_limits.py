"""Size limits: oversized regexes fail at once, with the reason, before any index is built."""

from __future__ import annotations

import json
import time

import pytest

from radixlm.runtime.constrained.limits import (
    MAX_REGEX_POSITIONS,
    check_regex_size,
    check_spec_size,
    regex_positions,
)


@pytest.mark.parametrize(
    ("regex", "positions"),
    [
        ("abc", 3),
        ("a{100000}", 100_000),
        ("(a{1,100}){1,100}", 10_000),
        ("[a-z]{0,1000}", 1000),
        ("(a|b)*a(a|b){16}", 18),
        ("x+y*", 2),
    ],
)
def test_regex_positions_unroll_counted_repeats(regex, positions):
    assert regex_positions(regex) == positions


def test_unparseable_regex_is_left_to_the_backend():
    assert regex_positions(r"\p{L}+") is None
    check_regex_size(r"\p{L}+")


def test_limits_name_the_problem():
    with pytest.raises(ValueError, match="100000 positions"):
        check_regex_size("a{100000}")
    with pytest.raises(ValueError, match="json_schema spec is"):
        check_spec_size("json_schema", " " * 200_000)


def test_outlines_rejects_huge_repeats_without_building(backends):
    start = time.monotonic()
    with pytest.raises(ValueError, match=f"at most {MAX_REGEX_POSITIONS}"):
        backends["outlines"].compile("regex", "a{100000}")
    wide = {"type": "array", "items": {"type": "string", "maxLength": 500}, "maxItems": 500}
    with pytest.raises(ValueError, match="json_schema could not be compiled: counted"):
        backends["outlines"].compile("json_schema", json.dumps(wide))
    assert time.monotonic() - start < 5
