"""Every backend's output for a suite of regexes and choice lists fully matches them."""

from __future__ import annotations

import json
import re

import pytest
from backend_params import BACKENDS, INSTALLED

SEEDS = (0, 1, 2)

REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"(red|green|blue)",
    r"[a-z]{1,10}@[a-z]{1,10}\.(com|org|net)",
    r"-?[0-9]{1,6}(\.[0-9]{1,2})?",
    r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?",
    r"(true|false)",
    r"\((a|b)+\)",
    r"https?://[a-z]{1,12}\.[a-z]{2,3}(/[a-z]{1,8}){0,3}",
    r"[0-9a-f]{8}",
    r"^ab{1,6}c$",
    r"(\d{1,3}\.){3}\d{1,3}",
    r"Answer: [A-D]",
    r"[^\n\"]{1,20}",
]
CHOICES = [
    ["yes", "no", "maybe so"],
    ["Paris", "London", "New York", "北京"],
    ["a.b", "a+b", "(x)"],
]


@pytest.fixture(scope="module")
def futures(compilers):
    specs = [("regex", r) for r in REGEXES] + [("choices", json.dumps(c)) for c in CHOICES]
    return {(b, spec): compilers[b].submit(*spec) for spec in specs for b in INSTALLED}


def _generate_all(grammar, sample, decode) -> list[str]:
    texts = []
    for seed in (*SEEDS, None):
        tokens, ended = sample(grammar.matcher(), seed)
        assert ended, f"no end within the token cap (seed {seed}): {decode(tokens)[:200]!r}"
        texts.append(decode(tokens))
    return texts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("regex", REGEXES)
def test_generated_text_matches_regex(regex, backend, futures, sample, decode):
    grammar = futures[(backend, ("regex", regex))].result(timeout=60)
    for text in _generate_all(grammar, sample, decode):
        assert re.fullmatch(regex, text), text


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("choices", CHOICES, ids=lambda c: "|".join(c))
def test_generated_text_is_a_choice(choices, backend, futures, sample, decode):
    grammar = futures[(backend, ("choices", json.dumps(choices)))].result(timeout=60)
    for text in _generate_all(grammar, sample, decode):
        assert text in choices


def test_suite_size():
    assert len(REGEXES) >= 10
