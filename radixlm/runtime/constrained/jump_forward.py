"""Jump-forward: after a sampled token, append the text the grammar forces next without running
the model, re-tokenised together with that token so the ids are what the tokenizer would
produce for the text."""

from __future__ import annotations

from typing import Any

from radixlm.runtime.constrained.base import Matcher


def advance_with_jump_forward(matcher: Matcher, token: int, tokenizer: Any, room: int) -> list[int]:
    """Advance ``matcher`` over the sampled ``token`` and return the tokens to append (at most
    ``room``): the token itself, or the token and the grammar's forced text after it.

    Tokens are taken while the grammar accepts them, so the matcher stays consistent even where
    the tokenizer spells the text in a way the grammar refuses.
    """
    matcher.advance(token)
    if matcher.is_terminated():
        return [token]
    forced = matcher.forced_continuation()
    head = tokenizer.decode([token])
    if not forced or room <= 1 or "\ufffd" in head:
        return [token]
    ids = tokenizer.encode(head + forced, add_special_tokens=False)[:room]
    matcher.rollback(1)
    taken = []
    for t in ids:
        try:
            matcher.advance(t)
        except ValueError:
            break
        taken.append(t)
    if not taken:
        matcher.advance(token)
        return [token]
    return taken
