"""Jump-forward: turn a matcher's forced text into tokens without running the model."""

from __future__ import annotations

from collections.abc import Callable

from radixlm.runtime.constrained.base import Matcher


def jump_forward_tokens(matcher: Matcher, encode: Callable[[str], list[int]]) -> list[int]:
    """Advance ``matcher`` over the tokens of its forced continuation and return them.

    ``encode`` tokenizes text without special tokens. Tokens are taken while the grammar accepts
    them, so the matcher stays consistent even where the tokenizer spells the text in a way the
    grammar refuses; the caller appends the returned tokens to the output.
    """
    text = matcher.forced_continuation()
    if not text:
        return []
    taken: list[int] = []
    for token_id in encode(text):
        try:
            matcher.advance(token_id)
        except ValueError:
            break
        taken.append(token_id)
    return taken
