"""``text_without``: the regex of free text that never contains a tag."""

from __future__ import annotations

import itertools
import random
import re

import interegular
import llguidance
import pytest

from radixlm.runtime.constrained.text_regex import text_without

TAGS = ["</think>", "<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "ab", "a", "a-b^]\\&&~"]


def _near_misses(tag: str, rng: random.Random, count: int) -> list[str]:
    """Strings glued from pieces of ``tag`` and a few other characters."""
    pieces = [tag[:j] for j in range(1, len(tag) + 1)] + list(tag) + ["x", "\n", tag[1:]]
    return ["".join(rng.choices(pieces, k=rng.randint(0, 8))) for _ in range(count)]


def _alphabet_strings(tag: str, longest: int) -> list[str]:
    alphabet = sorted(set(tag[:3]) | {"x", "\n"})
    return [
        "".join(chars)
        for size in range(longest + 1)
        for chars in itertools.product(alphabet, repeat=size)
    ]


@pytest.mark.parametrize("tag", TAGS)
def test_matches_exactly_the_strings_without_the_tag(tag: str) -> None:
    pattern = re.compile(text_without(tag))
    rng = random.Random(tag)
    for text in _alphabet_strings(tag, 5) + _near_misses(tag, rng, 3000):
        assert bool(pattern.fullmatch(text)) == (tag not in text), repr(text)


@pytest.mark.parametrize("tag", TAGS)
def test_grammar_backends_accept_the_regex(tag: str) -> None:
    regex = text_without(tag)
    assert llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("regex", regex)) == ""
    fsm = interegular.parse_pattern(regex).to_fsm()
    for text in _near_misses(tag, random.Random(tag), 300):
        assert fsm.accepts(text) == (tag not in text), repr(text)


@pytest.mark.parametrize("tag", ["", "aba", "<think><"])
def test_rejects_tags_it_cannot_express(tag: str) -> None:
    with pytest.raises(ValueError, match="text_without"):
        text_without(tag)
