"""The llguidance grammar backend: an Earley parser over a lexer, masks computed by the library.

A grammar is a validated template ``LLMatcher``; each request gets a deep copy. llguidance puts
a matcher into a permanent error state on a disallowed token, so ``advance`` checks the token
first (``validate_tokens``; for EOS, ``is_accepting``) and leaves the state untouched when it is
refused.
"""

from __future__ import annotations

import codecs
import copy
from collections.abc import Sequence
from typing import Any

import llguidance
import torch

from radixlm.runtime.constrained.base import (
    Grammar,
    GrammarBackend,
    Matcher,
    register_grammar_backend,
)
from radixlm.runtime.constrained.schema_bounds import bound_schema_numbers
from radixlm.runtime.constrained.specs import describe_regex_error


class LLGuidanceMatcher(Matcher):
    """Wraps one ``llguidance.LLMatcher``.

    llguidance records EOS only when the grammar could still continue; an EOS after it stopped is
    a no-op there. ``_recorded`` keeps, per advance, whether llguidance counted it, so that
    ``rollback`` undoes exactly the tokens llguidance holds.
    """

    def __init__(self, matcher: llguidance.LLMatcher, words: int, eos_ids: frozenset[int]) -> None:
        self._matcher = matcher
        self._words = words
        self._eos_ids = eos_ids
        self._recorded: list[bool] = []
        self._ended = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if bitmask.dtype != torch.int32 or not bitmask.is_cpu or bitmask.shape[1] < self._words:
            raise ValueError(f"bitmask must be CPU int32 with at least {self._words} words per row")
        target = bitmask[row, : self._words]
        if not target.is_contiguous():
            raise ValueError("bitmask rows must be contiguous")
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), self._words * 4)
        bitmask[row, self._words :] = 0

    def advance(self, token_id: int) -> None:
        if self._ended:
            raise ValueError(f"token {token_id} after the grammar terminated")
        is_eos = token_id in self._eos_ids
        if not (self._matcher.is_accepting() if is_eos else self._valid(token_id)):
            raise ValueError(f"token {token_id} is not allowed by the grammar here")
        recorded = not (is_eos and self._matcher.is_stopped())
        if recorded and not self._matcher.consume_token(token_id):
            raise ValueError(f"token {token_id} was refused: {self._matcher.get_error()}")
        self._recorded.append(recorded)
        self._ended = is_eos

    def rollback(self, k: int) -> None:
        if not 0 <= k <= len(self._recorded):
            raise ValueError(f"cannot roll back {k} tokens; {len(self._recorded)} were advanced")
        if not k:
            return
        undone = sum(self._recorded[-k:])
        if undone and not self._matcher.rollback(undone):
            raise ValueError(f"llguidance could not roll back {undone} tokens")
        del self._recorded[-k:]
        self._ended = False

    def _valid(self, token_id: int) -> bool:
        return token_id >= 0 and self._matcher.validate_tokens([token_id]) == 1

    def is_terminated(self) -> bool:
        return self._ended or self._matcher.is_stopped()

    def is_accepting(self) -> bool:
        return self._matcher.is_accepting()

    def forced_continuation(self) -> str | None:
        data = self._matcher.compute_ff_bytes()
        try:
            text = codecs.getincrementaldecoder("utf-8")().decode(data)
        except UnicodeDecodeError:
            return None
        return text or None


class LLGuidanceGrammar(Grammar):
    """A validated llguidance grammar; matchers are deep copies of a template."""

    def __init__(self, template: llguidance.LLMatcher, words: int, eos_ids: frozenset[int]) -> None:
        self._template = template
        self._words = words
        self._eos_ids = eos_ids

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._template.deep_copy(), self._words, self._eos_ids)


@register_grammar_backend("llguidance")
class LLGuidanceBackend(GrammarBackend):
    """llguidance over the fast tokenizer's own ``tokenizer.json``."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        whitespace_pattern: str | None = None,
    ) -> None:
        super().__init__(tokenizer, vocab_size, eos_token_ids, whitespace_pattern)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError("the llguidance grammar backend needs a fast (tokenizers) tokenizer")
        backend = copy.copy(backend)
        backend.no_padding()
        backend.no_truncation()
        self._tokenizer = llguidance.LLTokenizer(
            backend.to_str(), n_vocab=vocab_size, eos_token=list(self.eos_token_ids)
        )
        self._words = (vocab_size + 31) // 32

    def compile_regex(self, regex: str) -> LLGuidanceGrammar:
        try:
            return self._build(llguidance.LLMatcher.grammar_from_regex(regex))
        except ValueError as e:
            raise describe_regex_error(regex, e) from e

    def compile_json_schema(self, schema: str) -> LLGuidanceGrammar:
        options = self._json_options()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                bound_schema_numbers(schema), overrides=options
            )
            return self._build(grammar)
        except ValueError as e:
            raise ValueError(f"unsupported json_schema: {e}") from e

    def compile_ebnf(self, grammar: str) -> LLGuidanceGrammar:
        try:
            return self._build(llguidance.grammar_from("grammar", grammar))
        except ValueError as e:
            raise ValueError(f"invalid ebnf grammar: {e}") from e

    def _json_options(self) -> dict[str, Any]:
        if not self.whitespace_pattern:
            return {"whitespace_flexible": False}
        return {"whitespace_pattern": self.whitespace_pattern}

    def _build(self, grammar: str) -> LLGuidanceGrammar:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self._tokenizer
        )
        if is_error:
            raise ValueError(_summary(messages[0]))
        template = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            raise ValueError(_summary(template.get_error()))
        return LLGuidanceGrammar(template, self._words, frozenset(self.eos_token_ids))


def _summary(message: str) -> str:
    lines = message.strip().splitlines() or ["invalid grammar"]
    return "; ".join([lines[0], *(ln for ln in lines[1:] if ln.startswith("error:"))])
