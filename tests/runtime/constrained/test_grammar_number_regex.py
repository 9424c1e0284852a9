"""Integer ranges are exact; number ranges are sound (every match within bounds)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.runtime.constrained.number_regex import integer_range_regex, number_range_regex

bound = st.one_of(st.none(), st.integers(-2000, 2000))


@settings(max_examples=60, deadline=None)
@given(bound, bound)
def test_integer_range_is_exact(lo, hi):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    pattern = re.compile(integer_range_regex(lo, hi))
    for n in range(-2100, 2100, 7):
        assert bool(pattern.fullmatch(str(n))) == (
            (lo is None or n >= lo) and (hi is None or n <= hi)
        )
    for n in (lo, hi):
        if n is not None:
            assert pattern.fullmatch(str(n))
    assert not pattern.fullmatch("-0") and not pattern.fullmatch("007")


def test_empty_integer_range_rejected():
    with pytest.raises(ValueError, match="no integer"):
        integer_range_regex(5, 4)


decimal = st.one_of(st.none(), st.decimals(-500, 500, places=2).map(float))


@settings(max_examples=60, deadline=None)
@given(decimal, decimal, st.booleans(), st.booleans(), st.lists(st.decimals(-600, 600, places=3)))
def test_number_range_is_sound(lo, hi, lo_excl, hi_excl, values):
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    try:
        pattern = re.compile(number_range_regex(lo, hi, lo_excl, hi_excl))
    except ValueError:
        return
    for text in [str(v) for v in values] + [str(int(v)) for v in values]:
        if pattern.fullmatch(text):
            x = float(text)
            assert lo is None or (x > lo if lo_excl else x >= lo), text
            assert hi is None or (x < hi if hi_excl else x <= hi), text


def test_number_range_keeps_fractions_inside():
    pattern = re.compile(number_range_regex(0, 1))
    assert pattern.fullmatch("0.25") and pattern.fullmatch("1") and pattern.fullmatch("0")
    assert not pattern.fullmatch("1.5") and not pattern.fullmatch("-0.5")
